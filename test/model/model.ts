/**
 * A pure reference model of the session lifecycle, written from the spec: keys ->
 * sessions, the reset policy, boundaries, recoverable ends, runs and their
 * ownership, and the lifecycle events each change owes. It imports nothing from
 * src/, so a bug in the gateway cannot hide in it.
 *
 * Where the spec leaves the gateway a choice (when exactly the alarm ends a
 * session whose turn just finished, the order of a burst, which of two tied
 * reasons a policy end takes), the model says what is *allowed* and adopts what
 * the gateway did, after checking it was allowed. Where the spec is firm it says
 * what *must* have happened (see `mustSettle` and the checks in check.ts).
 */
import { overlapFor, type OverlapJson, type OverlapSettings } from "./overlap";
import { deadlineOf, expiryReasons, policyFor, type ChatType, type Policy, type ResetJson } from "./policy";

export const RECOVERABLE = ["agent_close", "orphan_reap"] as const;
export const END_REASONS = [
  "idle",
  "daily",
  "suspended",
  "new_command",
  "compression",
  "cron_complete",
  "admin",
  "agent_close",
  "orphan_reap",
] as const;
export type EndReason = (typeof END_REASONS)[number];
export const isRecoverable = (reason: string | null) => reason === "agent_close" || reason === "orphan_reap";
export const finalizes = (reason: string) => reason !== "compression" && !isRecoverable(reason);
/** Spec invariant 10: which replaced sessions make the first reply carry a notice. */
export function noticeFor(reason: string, hadActivity: boolean): string | null {
  if (reason === "suspended") return "suspended";
  if ((reason === "idle" || reason === "daily") && hadActivity) return reason;
  return null;
}
/** Why a run no longer owns a session that ended for `reason` (spec: heartbeat reasons). */
export function revocationFor(reason: string): "superseded" | "stopped" | "session_ended" {
  if (reason === "new_command") return "superseded";
  if (reason === "suspended") return "stopped";
  return "session_ended";
}

/** How long a run accepted with 202 may stay silent (docs/agent.md). */
export const LEASE_MS = 10 * 60_000;
/** Hand-offs are retried for a day, then the run fails for good. */
export const GIVE_UP_MS = 24 * 60 * 60_000;
/** Event ids are remembered for at least this long (spec invariant 9). */
export const DEDUPE_MS = 24 * 60 * 60_000;

export interface KeySpec {
  chatType: ChatType;
  chatId: string;
  userId: string;
  threadId: string | null;
  /** The session key the spec builds for it. */
  key: string;
}

export interface MMessage {
  role: "user" | "assistant";
  text: string;
  at: number;
}

export interface MEnd {
  reason: string;
  /** The model's clock at the end (the gateway names an end's event by session, reason and time). */
  at: number;
  /** Ended out of band (SQL): its events are owed only once the gateway looked. */
  bySql: boolean;
  /**
   * An SQL end that the gateway reopened or promoted at its first look: it reports
   * the row as it then stands, so this end's own ended event is optional.
   */
  optional?: boolean;
}

export interface MSession {
  id: string;
  key: number;
  startedAt: number;
  lastActiveAt: number;
  endReason: string | null;
  parentId: string | null;
  previous: { id: string; reason: string; hadActivity: boolean } | null;
  noticeOwed: string | null;
  messages: MMessage[];
  currentRun: MRun | null;
  ends: MEnd[];
  /** Ended by SQL and not yet looked at by the gateway. */
  unnoticed: boolean;
  /** Runs staged in it so far (`is_new` is for the first). */
  staged: number;
  /** A recoverable row that `/new` replaced: its key's alarm still promotes it at its deadline. */
  watched: boolean;
  /** The messages still waiting right after its last run was dispatched from the waiting list. */
  leftovers?: Set<string>;
}

/**
 * staged: stored, not yet handed over; retrying: handed over, the agent was down;
 * limbo: staged in a session that then ended (it may still go out if the session is
 * reopened first); accepted: 202, lease running. The overlap states of a message
 * that did not get a run of its own at once (spec "Overlapping messages"):
 * waiting: stored, no run carries it yet (`run_id` null); merged: carried by the run
 * of a newer message (`carriedBy`); dropped: recorded as never dispatched
 * (`notDispatched`); waitEnded: waiting in a session ended by SQL, which the gateway
 * records not dispatched, or carries on if it reopens the row, once it looks.
 */
export type RunState =
  | "staged"
  | "retrying"
  | "limbo"
  | "accepted"
  | "finished"
  | "failed"
  | "revoked"
  | "waiting"
  | "merged"
  | "dropped"
  | "waitEnded";

/** The reason a waiting message of a session that ended for `reason` is recorded not dispatched. */
export function notDispatchedFor(reason: string): "new_command" | "stopped" | "session_ended" {
  if (reason === "new_command") return "new_command";
  if (reason === "suspended") return "stopped";
  return "session_ended";
}

export interface MRun {
  eventId: string;
  /** The key its message came in on. */
  key: number;
  text: string;
  sessionId: string;
  /** The session the message was stored in (a rotation moves `sessionId`, not this). */
  storedIn: string;
  state: RunState;
  stagedAt: number;
  runId: string | null;
  token: string | null;
  heardAt: number | null;
  revokedReason: string | null;
  /** What the first hand-off must say (spec: is_new and reset of the first run of a session). */
  isNew: boolean | null;
  /** The run id D1 gave the message when it was stored with a run of its own (null: it waited). */
  storedRunId: string | null;
  /** The event id of the run that carries this message, once one does (itself for its own run). */
  carriedBy: string | null;
  /** The event ids of the messages this run carries, oldest first (its own last). */
  carries: string[];
  notDispatched: string | null;
  /** Revoked as superseded by an interrupt (seen in a later hand-off). */
  interrupted?: boolean;
  /** Dropped while its hand-off was still in the outbox (limbo). */
  fromLimbo?: boolean;
  /**
   * Revoked by an SQL end while the object counted it unfinished (accepted, or its
   * hand-off attempted): the object learns it only when it next looks (the reopen's
   * batch, the next fresh session, an alarm), so a message may wait behind it once.
   */
  heldByObject?: boolean;
  /**
   * When an end made by the gateway revoked it while it was unfinished (accepted, or
   * its hand-off in the outbox). A message whose own request made that end (a fresh
   * session past the deadline) is judged by the object against its record of the
   * run, from before D1 answered: it may wait behind it once.
   */
  revokedByEndAt?: number;
  /** D1 showed its not_dispatched (counted once). */
  seenDropped?: boolean;
  reset: { reason: string; had_activity: boolean; previous_session_id: string } | null;
}

export interface SentEvent {
  eventId: string;
  key: number;
  body: Record<string, unknown>;
  at: number;
  /** The session the first answer named. */
  sessionId: string | null;
}

export interface ExpectedReply {
  eventId: string;
  sessionId: string;
  text: string;
  notice: string | null;
}

export type AgentMode = "reply" | "accept" | "down" | "null" | "refuse";

export class Model {
  now: number;
  readonly sessions = new Map<string, MSession>();
  /** Sessions of each key, oldest first. */
  readonly byKey: MSession[][];
  /** Whether each key's routing object holds an entry (the spec's routing entry). */
  readonly entry: boolean[];
  readonly runs = new Map<string, MRun>();
  readonly sent: SentEvent[] = [];
  agentMode: AgentMode = "reply";
  /** Replies recorded and owed to GENERIC_REPLY_URL, by key. */
  readonly pendingReplies: ExpectedReply[][];
  /** Command answers owed to GENERIC_REPLY_URL, by key (event ids). */
  readonly pendingAnswers: string[][];
  /** Sessions the next alarm of their key must apply the policy to (spec invariant 6). */
  readonly mustSettle = new Set<string>();

  constructor(
    readonly prefix: string,
    readonly keys: KeySpec[],
    readonly config: ResetJson,
    start: number,
    readonly overlapConfig: OverlapJson = { mode: "concurrent" },
  ) {
    this.now = start;
    this.byKey = keys.map(() => []);
    this.entry = keys.map(() => false);
    this.pendingReplies = keys.map(() => []);
    this.pendingAnswers = keys.map(() => []);
  }

  policy(key: number): Policy {
    return policyFor(this.config, "generic", this.keys[key]!.chatType);
  }

  overlap(key: number): OverlapSettings {
    return overlapFor(this.overlapConfig, "generic", this.keys[key]!.chatType);
  }

  /** Messages of the session no run carries yet (oldest first). */
  waitingIn(session: MSession): MRun[] {
    return this.runsOf(session).filter((run) => run.state === "waiting");
  }

  /**
   * Runs of the session that keep a new message waiting in `queue` mode: staged or
   * retried hand-offs, and runs accepted with 202 whose lease holds ("lapsed" for one
   * past its lease, which the gateway counts as over only once it looks).
   */
  unfinishedIn(session: MSession): { holding: MRun[]; lapsed: MRun[] } {
    const runs = this.runsOf(session);
    const holding = runs.filter(
      (run) =>
        run.state === "staged" ||
        run.state === "retrying" ||
        (run.state === "accepted" && run.heardAt! + LEASE_MS > this.now),
    );
    const lapsed = runs.filter((run) => run.state === "accepted" && run.heardAt! + LEASE_MS <= this.now);
    return { holding, lapsed };
  }

  newest(key: number): MSession | null {
    return this.byKey[key]!.at(-1) ?? null;
  }

  deadline(session: MSession): number | null {
    return deadlineOf(this.policy(session.key), session.lastActiveAt);
  }

  expiry(session: MSession, now = this.now): string[] {
    return expiryReasons(this.policy(session.key), session.lastActiveAt, now);
  }

  runsOf(session: MSession): MRun[] {
    return [...this.runs.values()].filter((run) => run.sessionId === session.id);
  }

  /**
   * Spec invariant 6: is a live session held open by its turn in progress? A
   * hand-off still staged or being retried holds it; so does any run of it accepted
   * with 202 whose lease holds (a superseded run still answers), not only the
   * current one. "unknown" when a run in limbo could go either way.
   */
  held(session: MSession, exceptEventId: string | null = null): boolean | "unknown" {
    if (session.endReason !== null) return false;
    const runs = this.runsOf(session).filter((run) => run.eventId !== exceptEventId);
    if (runs.some((run) => run.state === "staged" || run.state === "retrying")) return true;
    if (runs.some((run) => run.state === "accepted" && run.heardAt! + LEASE_MS > this.now)) return true;
    // A message waiting for its run (a debounce window): the spec does not say whether it holds.
    if (runs.some((run) => run.state === "limbo" || run.state === "waiting")) return "unknown";
    return false;
  }

  /** The current run accepted with 202 whose owner has been silent past the lease, and nothing else holds. */
  leaseLapsed(session: MSession): boolean {
    if (session.endReason !== null) return false;
    if (this.held(session) === true) return false;
    const current = session.currentRun;
    return !!current && current.state === "accepted" && current.heardAt! + LEASE_MS <= this.now;
  }

  /** Policy reasons the gateway may end this live or recoverable session for, right now. */
  policyEndsAllowed(session: MSession): string[] {
    if (session.endReason !== null && !isRecoverable(session.endReason)) return [];
    const reasons = this.expiry(session);
    if (reasons.length === 0) return [];
    return this.held(session) === true ? [] : reasons;
  }

  // ------------------------------------------------------------------ transitions

  addSession(key: number, id: string, startedAt: number, fields: Partial<MSession>): MSession {
    const session: MSession = {
      id,
      key,
      startedAt,
      lastActiveAt: startedAt,
      endReason: null,
      parentId: null,
      previous: null,
      noticeOwed: null,
      messages: [],
      currentRun: null,
      ends: [],
      unnoticed: false,
      staged: 0,
      watched: false,
      ...fields,
    };
    this.sessions.set(id, session);
    this.byKey[key]!.push(session);
    return session;
  }

  /** Ends a live or recoverable session; unfinished runs are revoked, staged ones left in limbo. */
  end(session: MSession, reason: string, bySql = false): void {
    const wasLive = session.endReason === null;
    const last = session.ends.at(-1);
    if (last?.bySql) last.optional = true;
    session.endReason = reason;
    session.ends.push({ reason, bySql, at: this.now });
    session.unnoticed = bySql;
    this.mustSettle.delete(session.id);
    if (!wasLive) return;
    for (const run of this.runsOf(session)) {
      if (run.state === "waiting" && bySql) run.state = "waitEnded";
      else if (run.state === "waiting") {
        run.state = "dropped";
        run.notDispatched = notDispatchedFor(reason);
      }
      if (bySql && (run.state === "accepted" || ((run.state === "staged" || run.state === "retrying") && run.runId)))
        run.heldByObject = true;
      if (!bySql && (run.state === "accepted" || run.state === "staged" || run.state === "retrying"))
        run.revokedByEndAt = this.now;
      if (run.state === "staged" || run.state === "retrying") run.state = run.runId ? "revoked" : "limbo";
      if (run.state === "accepted" || run.state === "revoked") {
        run.state = "revoked";
        run.revokedReason ??= revocationFor(reason);
      }
    }
  }

  /** Reopens a recoverable session (same id, transcript kept); runs in limbo may go out again. */
  reopen(session: MSession): void {
    const last = session.ends.at(-1);
    if (last?.bySql) last.optional = true;
    session.endReason = null;
    session.unnoticed = false;
    // Messages that waited when SQL ended it go on waiting (D1 says if they were dropped: see check.ts).
    for (const run of this.runsOf(session)) if (run.state === "waitEnded") run.state = "waiting";
  }

  /** Stores a user message and stages its run. */
  store(session: MSession, eventId: string, text: string): MRun {
    session.messages.push({ role: "user", text, at: this.now });
    session.lastActiveAt = Math.max(session.lastActiveAt, this.now);
    const first = session.staged === 0 && session.parentId === null;
    // Unknown when earlier runs of the session were staged but none went out (the
    // gateway counts the first run dispatched, the model the first staged).
    const isNew = first ? true : this.runsOf(session).some((r) => r.runId !== null) ? false : null;
    session.staged += 1;
    const run: MRun = {
      eventId,
      key: session.key,
      text,
      sessionId: session.id,
      storedIn: session.id,
      state: "staged",
      stagedAt: this.now,
      runId: null,
      token: null,
      heardAt: null,
      revokedReason: null,
      storedRunId: null,
      carriedBy: null,
      carries: [eventId],
      notDispatched: null,
      isNew,
      reset:
        first && session.previous
          ? {
              reason: session.previous.reason,
              had_activity: session.previous.hadActivity,
              previous_session_id: session.previous.id,
            }
          : null,
    };
    this.runs.set(eventId, run);
    return run;
  }

  /** Records a run's reply in its session (spec: unless revoked); the first reply takes the notice. */
  recordReply(run: MRun, text: string): ExpectedReply {
    const session = this.sessions.get(run.sessionId)!;
    run.state = "finished";
    session.messages.push({ role: "assistant", text, at: this.now });
    session.lastActiveAt = Math.max(session.lastActiveAt, this.now);
    const reply = { eventId: run.eventId, sessionId: session.id, text, notice: session.noticeOwed };
    session.noticeOwed = null;
    this.pendingReplies[session.key]!.push(reply);
    return reply;
  }

  /** Sessions whose policy end the next alarm of `key` must carry out (spec invariant 6). */
  dueAtAlarm(key: number): MSession[] {
    const due: MSession[] = [];
    const newest = this.newest(key);
    for (const session of this.byKey[key]!) {
      const watched = session === newest ? this.entry[key] : isRecoverable(session.endReason) && session.watched;
      if (!watched) continue;
      // Waiting messages: the alarm may carry them (the lapsed run is over) or end the session; either is checked.
      if (this.waitingIn(session).length > 0) continue;
      const reap = this.leaseLapsed(session);
      if (this.policyEndsAllowed(session).length > 0 || reap) due.push(session);
    }
    return due;
  }
}
