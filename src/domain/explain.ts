/**
 * `GET /admin/routes/{key}/explain`: what a message for this key would do now, and
 * why. A pure function of what the routing object holds (its entry, its alarm, the
 * current run's hand-off), the D1 row a message would read, the policies and the
 * time: the same `decide()` the routing object runs, so the answer cannot drift
 * from what a message does.
 */
import type { SessionRow, RunRow } from "../db/schema";
import { isRecoverable, type EndReason, type PolicyReason } from "./end-reasons";
import type { OverlapView } from "./overlap";
import { deadline, resolvePolicy, type ResetConfig, type ResetPolicy } from "./reset-policy";
import type { PLATFORMS } from "./session-key";
import { decide } from "./routing-decision";
import { offsetAt } from "./zoned-time";

export type PolicySource = "default" | "by_chat_type" | "by_platform";

/** The layer the effective reset policy came from: platform beats chat type beats the default. */
export function policySource(config: ResetConfig, platform: string, chatType: string): PolicySource {
  if (config.by_platform?.[platform as (typeof PLATFORMS)[number]]) return "by_platform";
  if (config.by_chat_type?.[chatType as "dm" | "group" | "channel"]) return "by_chat_type";
  return "default";
}

/** The platform and chat type a key names (`{platform}:{chat_type}:…`), for a key with no row yet. */
export function keyConversation(key: string): { platform: string; chatType: string } {
  const [platform = "", chatType = ""] = key.split(":");
  return { platform, chatType };
}

/** The effective reset policy for a conversation, with the layer it came from. */
export function effectivePolicy(config: ResetConfig, platform: string, chatType: string) {
  return { policy: resolvePolicy(config, platform, chatType), source: policySource(config, platform, chatType) };
}

/** The current run's hand-off while it waits in the routing object's outbox (being retried). */
export interface Handoff {
  attempts: number;
  lastError: string | null;
  dueAt: number;
}

export interface ExplainInput {
  key: string;
  /** The routing entry's session id, or null when the object has no entry (the recovery path). */
  entrySessionId: string | null;
  /** The D1 row a message would read: the entry's row, else the newest row for the key. */
  row: SessionRow | null;
  policy: ResetPolicy;
  policySource: PolicySource;
  overlap: OverlapView;
  /** The routing object's one alarm as set (it may be earlier than the deadline, for other due work). */
  alarmAt: number | null;
  /** The row's current run (`current_run_id`), and its hand-off if it is still in the outbox. */
  currentRun: RunRow | null;
  handoff: Handoff | null;
  /** How long an accepted run may stay silent before its owner counts as vanished. */
  runLeaseMs: number;
  waiting: number;
  now: number;
}

export type WouldReason = "no_session" | "live" | "held" | "recoverable" | "expired" | "ended";

export interface Would {
  action: "append" | "reopen" | "fresh";
  reason: WouldReason;
  /** The session the message would end first, by its policy reason. */
  expire?: { session_id: string; reason: PolicyReason };
  /** The ended session the fresh one would replace (its `session.reset` and notice come from it). */
  replaces?: { session_id: string; reason: EndReason; had_activity: boolean };
  /** The same, in a sentence for the operator. */
  summary: string;
}

export interface OpenRun {
  run_id: string;
  status: "dispatching" | "running";
  attempts: number | null;
  last_error: string | null;
  revoked_reason: null;
  created_at: number;
  finished_at: null;
  dispatched_at: number | null;
  last_heartbeat_at: number | null;
  /** When the run's owner counts as vanished unless it is heard from; null while its hand-off is retried. */
  lease_until: number | null;
}

export interface Explanation {
  key: string;
  entry_session_id: string | null;
  policy: {
    mode: ResetPolicy["mode"];
    idle_minutes: number;
    at_hour: number;
    at_minute: number;
    timezone: string;
    source: PolicySource;
  };
  overlap: OverlapView;
  session: SessionRow | null;
  last_active_at: number | null;
  deadline: {
    at: number | null;
    reason: PolicyReason | null;
    idle_at: number | null;
    daily_at: number | null;
    daily_at_local: string | null;
    timezone: string;
  };
  alarm_at: number | null;
  would: Would;
  open_run: OpenRun | null;
  waiting: number;
}

const pad = (n: number, width = 2) => String(Math.abs(n)).padStart(width, "0");

/** `instant` as ISO 8601 wall time in `timeZone` with its offset, e.g. `2031-03-30T04:00:00+02:00`. */
export function formatZoned(instant: number, timeZone: string): string {
  const offset = offsetAt(instant, timeZone);
  const local = new Date(instant + offset);
  const minutes = Math.round(offset / 60_000);
  const sign = minutes < 0 ? "-" : "+";
  const date = `${local.getUTCFullYear()}-${pad(local.getUTCMonth() + 1)}-${pad(local.getUTCDate())}`;
  const time = `${pad(local.getUTCHours())}:${pad(local.getUTCMinutes())}:${pad(local.getUTCSeconds())}`;
  return `${date}T${time}${sign}${pad(Math.trunc(minutes / 60))}:${pad(minutes % 60)}`;
}

/** The deadlines of a row the policy still governs (live or recoverable); all null otherwise. */
function deadlineOf(policy: ResetPolicy, row: SessionRow | null): Explanation["deadline"] {
  const governed = row !== null && (row.endReason === null || isRecoverable(row.endReason as EndReason));
  if (!governed) {
    return { at: null, reason: null, idle_at: null, daily_at: null, daily_at_local: null, timezone: policy.timeZone };
  }
  const usesIdle = policy.mode === "idle" || policy.mode === "both";
  const usesDaily = policy.mode === "daily" || policy.mode === "both";
  const idleAt = usesIdle ? deadline({ ...policy, mode: "idle" }, row.lastActiveAt) : null;
  const dailyAt = usesDaily ? deadline({ ...policy, mode: "daily" }, row.lastActiveAt) : null;
  const at = deadline(policy, row.lastActiveAt);
  // Whichever comes first; on a tie, idle (as expiryReason decides).
  const reason: PolicyReason | null = at === null ? null : idleAt === at ? "idle" : "daily";
  return {
    at,
    reason,
    idle_at: idleAt,
    daily_at: dailyAt,
    daily_at_local: dailyAt === null ? null : formatZoned(dailyAt, policy.timeZone),
    timezone: policy.timeZone,
  };
}

function wouldOf(row: SessionRow | null, policy: ResetPolicy, now: number, openRun: OpenRun | null): Would {
  const decision = decide(row, policy, now);
  // Expiry waits for the turn in progress (invariant 6): a live row past its deadline
  // whose run is still open takes the message, as the routing object would.
  if (decision.kind === "fresh" && decision.expire && row?.endReason === null && openRun) {
    return {
      action: "append",
      reason: "held",
      summary: `stored in the live session ${row.id}: its deadline passed, but expiry waits for the turn in progress (${openRun.run_id})`,
    };
  }
  if (decision.kind === "append") {
    return { action: "append", reason: "live", summary: `stored in the live session ${decision.sessionId}` };
  }
  if (decision.kind === "reopen") {
    return {
      action: "reopen",
      reason: "recoverable",
      summary: `reopens ${decision.sessionId} (ended as ${row!.endReason}, recoverable, within its policy)`,
    };
  }
  const replaces = decision.replaced
    ? {
        session_id: decision.replaced.sessionId,
        reason: decision.replaced.reason,
        had_activity: decision.replaced.hadActivity,
      }
    : undefined;
  if (decision.expire) {
    return {
      action: "fresh",
      reason: "expired",
      expire: { session_id: decision.expire.sessionId, reason: decision.expire.reason },
      replaces,
      summary: `ends ${decision.expire.sessionId} as ${decision.expire.reason} (its deadline passed), then starts a fresh session`,
    };
  }
  if (replaces) {
    return {
      action: "fresh",
      reason: "ended",
      replaces,
      summary: `starts a fresh session: ${replaces.session_id} ended as ${replaces.reason}, a durable boundary`,
    };
  }
  return { action: "fresh", reason: "no_session", summary: "starts the key's first session" };
}

/**
 * The current run while it is unfinished (spec "run"): not finished, revoked or
 * failed, and either still being handed over or heard from within its lease.
 */
function openRunOf(input: ExplainInput): OpenRun | null {
  const run = input.currentRun;
  if (!run || run.finishedAt !== null || run.revokedReason !== null || run.failedAt !== null) return null;
  const heardAt = run.lastHeartbeatAt ?? run.dispatchedAt ?? run.createdAt;
  const leaseUntil = input.handoff ? null : heardAt + input.runLeaseMs;
  if (leaseUntil !== null && leaseUntil <= input.now) return null;
  return {
    run_id: run.id,
    status: input.handoff ? "dispatching" : "running",
    attempts: input.handoff ? input.handoff.attempts : null,
    last_error: input.handoff?.lastError ?? run.lastError,
    revoked_reason: null,
    created_at: run.createdAt,
    finished_at: null,
    dispatched_at: run.dispatchedAt,
    last_heartbeat_at: run.lastHeartbeatAt,
    lease_until: leaseUntil,
  };
}

/** What a message for `input.key` arriving at `input.now` would do, and why. Changes nothing. */
export function explain(input: ExplainInput): Explanation {
  const { policy, row } = input;
  const openRun = openRunOf(input);
  return {
    key: input.key,
    entry_session_id: input.entrySessionId,
    policy: {
      mode: policy.mode,
      idle_minutes: policy.idleMinutes,
      at_hour: policy.atHour,
      at_minute: policy.atMinute,
      timezone: policy.timeZone,
      source: input.policySource,
    },
    overlap: input.overlap,
    session: row,
    last_active_at: row?.lastActiveAt ?? null,
    deadline: deadlineOf(policy, row),
    alarm_at: input.alarmAt,
    would: wouldOf(row, policy, input.now, openRun),
    open_run: openRun,
    waiting: input.waiting,
  };
}
