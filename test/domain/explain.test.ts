/** `explain()`: what a message would do now and why, as a pure function (table-driven). */
import { describe, expect, it } from "vitest";
import type { RunRow, SessionRow } from "../../src/db/schema";
import { END_REASONS, RECOVERABLE_REASONS } from "../../src/domain/end-reasons";
import {
  effectivePolicy,
  explain,
  formatZoned,
  keyConversation,
  policySource,
  type ExplainInput,
  type Handoff,
} from "../../src/domain/explain";
import { resolveOverlap } from "../../src/domain/overlap";
import { DEFAULT_POLICY, type ResetPolicy } from "../../src/domain/reset-policy";

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const LEASE = 10 * MINUTE;
const T = Date.UTC(2031, 0, 15, 12, 0, 0);

function row(overrides: Partial<SessionRow> = {}): SessionRow {
  return {
    id: "s1",
    sessionKey: "generic:dm:c1",
    platform: "generic",
    chatType: "dm",
    startedAt: T - HOUR,
    lastActiveAt: T,
    endedAt: null,
    endReason: null,
    parentSessionId: null,
    previousSessionId: null,
    resetReason: null,
    resetHadActivity: null,
    noticePending: null,
    messageCount: 2,
    currentRunId: null,
    sweepAt: null,
    ...overrides,
  };
}

function run(overrides: Partial<RunRow> = {}): RunRow {
  return {
    id: "run_1",
    sessionId: "s1",
    sessionKey: "generic:dm:c1",
    eventId: "e1",
    tokenHash: "x",
    replyTo: "{}",
    createdAt: T,
    dispatchedAt: T,
    lastHeartbeatAt: null,
    finishedAt: null,
    replyText: null,
    revokedReason: null,
    failedAt: null,
    lastError: null,
    attempts: 1,
    acceptedAt: T,
    message: null,
    messages: null,
    isNew: false,
    ...overrides,
  };
}

const policy = (p: Partial<ResetPolicy>): ResetPolicy => ({ ...DEFAULT_POLICY, ...p });

function input(overrides: Partial<ExplainInput>): ExplainInput {
  return {
    key: "generic:dm:c1",
    entrySessionId: null,
    row: null,
    policy: DEFAULT_POLICY,
    policySource: "default",
    overlap: resolveOverlap({}, "generic", "dm"),
    alarmAt: null,
    currentRun: null,
    handoff: null,
    runLeaseMs: LEASE,
    waiting: 0,
    now: T,
    ...overrides,
  };
}

describe("would: the routing decision a message would get now", () => {
  const idle60 = policy({ mode: "idle", idleMinutes: 60 });
  const cases: {
    name: string;
    row: SessionRow | null;
    policy: ResetPolicy;
    now: number;
    action: string;
    reason: string;
    expire?: { session_id: string; reason: string };
  }[] = [
    { name: "a key never seen", row: null, policy: idle60, now: T, action: "fresh", reason: "no_session" },
    { name: "live, within idle", row: row(), policy: idle60, now: T + 60 * MINUTE, action: "append", reason: "live" },
    {
      name: "live, one ms past idle",
      row: row(),
      policy: idle60,
      now: T + 60 * MINUTE + 1,
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "idle" },
    },
    {
      name: "fractional idle_minutes 0.5: live at 30 s",
      row: row(),
      policy: policy({ mode: "idle", idleMinutes: 0.5 }),
      now: T + 30_000,
      action: "append",
      reason: "live",
    },
    {
      name: "fractional idle_minutes 0.5: expired at 30.001 s",
      row: row(),
      policy: policy({ mode: "idle", idleMinutes: 0.5 }),
      now: T + 30_001,
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "idle" },
    },
    {
      name: "mode none: live a year later",
      row: row(),
      policy: policy({ mode: "none" }),
      now: T + 365 * 24 * HOUR,
      action: "append",
      reason: "live",
    },
    {
      name: "mode daily: crossed 04:00 UTC",
      row: row({ lastActiveAt: Date.UTC(2031, 0, 15, 3, 59) }),
      policy: policy({ mode: "daily" }),
      now: Date.UTC(2031, 0, 15, 4, 0),
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "daily" },
    },
    {
      name: "mode daily: not yet at 04:00 UTC",
      row: row({ lastActiveAt: Date.UTC(2031, 0, 15, 3, 0) }),
      policy: policy({ mode: "daily" }),
      now: Date.UTC(2031, 0, 15, 3, 59, 59, 999),
      action: "append",
      reason: "live",
    },
    {
      name: "mode both: idle first",
      row: row({ lastActiveAt: Date.UTC(2031, 0, 15, 5, 0) }),
      policy: policy({ mode: "both", idleMinutes: 30 }),
      now: Date.UTC(2031, 0, 15, 5, 31),
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "idle" },
    },
    {
      name: "mode both: daily first",
      row: row({ lastActiveAt: Date.UTC(2031, 0, 15, 3, 50) }),
      policy: policy({ mode: "both", idleMinutes: 30 }),
      now: Date.UTC(2031, 0, 15, 4, 5),
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "daily" },
    },
    ...RECOVERABLE_REASONS.flatMap((reason) => [
      {
        name: `recoverable ${reason}, within its policy`,
        row: row({ endReason: reason, endedAt: T }),
        policy: idle60,
        now: T + 10 * MINUTE,
        action: "reopen",
        reason: "recoverable",
      },
      {
        name: `recoverable ${reason}, past its policy`,
        row: row({ endReason: reason, endedAt: T }),
        policy: idle60,
        now: T + 61 * MINUTE,
        action: "fresh",
        reason: "expired",
        expire: { session_id: "s1", reason: "idle" },
      },
    ]),
    ...END_REASONS.filter((r) => !RECOVERABLE_REASONS.includes(r)).map((reason) => ({
      name: `ended ${reason}: a durable boundary, even within the policy`,
      row: row({ endReason: reason, endedAt: T }),
      policy: idle60,
      now: T + MINUTE,
      action: "fresh",
      reason: "ended",
    })),
  ];
  for (const c of cases) {
    it(c.name, () => {
      const result = explain(input({ row: c.row, policy: c.policy, now: c.now }));
      expect(result.would.action).toBe(c.action);
      expect(result.would.reason).toBe(c.reason);
      expect(result.would.expire).toEqual(c.expire);
      expect(result.would.summary).toEqual(expect.any(String));
    });
  }

  it("names the ended session a fresh one replaces, with its reason and activity", () => {
    const result = explain(input({ row: row({ endReason: "new_command", messageCount: 0 }) }));
    expect(result.would.replaces).toEqual({ session_id: "s1", reason: "new_command", had_activity: false });
    const expired = explain(input({ row: row(), policy: policy({ mode: "idle", idleMinutes: 1 }), now: T + HOUR }));
    expect(expired.would.replaces).toEqual({ session_id: "s1", reason: "idle", had_activity: true });
  });
});

describe("would.summary: the sentence an operator reads names the session and why", () => {
  const idle60 = policy({ mode: "idle", idleMinutes: 60 });
  it.each<[string, Partial<ExplainInput>, string]>([
    ["a key never seen", { row: null }, "starts the key's first session"],
    ["live", { row: row(), policy: idle60, now: T + MINUTE }, "stored in the live session s1"],
    [
      "expired",
      { row: row(), policy: idle60, now: T + 2 * HOUR },
      "ends s1 as idle (its deadline passed), then starts a fresh session",
    ],
    [
      "recoverable",
      { row: row({ endReason: "agent_close", endedAt: T }), policy: idle60, now: T + MINUTE },
      "reopens s1 (ended as agent_close, recoverable, within its policy)",
    ],
    [
      "a durable boundary",
      { row: row({ endReason: "new_command", endedAt: T }), policy: idle60, now: T + MINUTE },
      "starts a fresh session: s1 ended as new_command, a durable boundary",
    ],
    [
      "held by its open run",
      {
        row: row({ currentRunId: "run_1" }),
        currentRun: run(),
        policy: policy({ mode: "idle", idleMinutes: 1 }),
        now: T + 2 * MINUTE,
      },
      "stored in the live session s1: its deadline passed, but expiry waits for the turn in progress (run_1)",
    ],
  ])("%s", (_name, given, summary) => {
    expect(explain(input(given)).would.summary).toBe(summary);
  });
});

describe("deadline: idle and daily, daily in the policy's zone and in UTC", () => {
  const berlin = (at: Partial<ResetPolicy>) => policy({ mode: "daily", timeZone: "Europe/Berlin", ...at });
  const cases: {
    name: string;
    policy: ResetPolicy;
    lastActive: number;
    at: number | null;
    reason: string | null;
    idleAt: number | null;
    dailyAt: number | null;
    local: string | null;
  }[] = [
    {
      name: "the day before spring forward: 04:00 CET is 03:00 UTC",
      policy: berlin({ atHour: 4 }),
      lastActive: Date.UTC(2031, 2, 28, 12),
      at: Date.UTC(2031, 2, 29, 3),
      reason: "daily",
      idleAt: null,
      dailyAt: Date.UTC(2031, 2, 29, 3),
      local: "2031-03-29T04:00:00+01:00",
    },
    {
      name: "spring forward day: 04:00 CEST is 02:00 UTC",
      policy: berlin({ atHour: 4 }),
      lastActive: Date.UTC(2031, 2, 29, 12),
      at: Date.UTC(2031, 2, 30, 2),
      reason: "daily",
      idleAt: null,
      dailyAt: Date.UTC(2031, 2, 30, 2),
      local: "2031-03-30T04:00:00+02:00",
    },
    {
      name: "spring forward day: 02:30 does not exist, it falls at 03:30 CEST",
      policy: berlin({ atHour: 2, atMinute: 30 }),
      lastActive: Date.UTC(2031, 2, 29, 12),
      at: Date.UTC(2031, 2, 30, 1, 30),
      reason: "daily",
      idleAt: null,
      dailyAt: Date.UTC(2031, 2, 30, 1, 30),
      local: "2031-03-30T03:30:00+02:00",
    },
    {
      name: "fall back day: 02:30 happens twice, the first one counts (CEST)",
      policy: berlin({ atHour: 2, atMinute: 30 }),
      lastActive: Date.UTC(2031, 9, 25, 12),
      at: Date.UTC(2031, 9, 26, 0, 30),
      reason: "daily",
      idleAt: null,
      dailyAt: Date.UTC(2031, 9, 26, 0, 30),
      local: "2031-10-26T02:30:00+02:00",
    },
    {
      name: "both on the 23-hour day: the daily boundary comes before 24 idle hours",
      policy: berlin({ mode: "both", idleMinutes: 1440, atHour: 4 }),
      lastActive: Date.UTC(2031, 2, 29, 3, 30),
      at: Date.UTC(2031, 2, 30, 2),
      reason: "daily",
      idleAt: Date.UTC(2031, 2, 29, 3, 30) + 1440 * MINUTE + 1,
      dailyAt: Date.UTC(2031, 2, 30, 2),
      local: "2031-03-30T04:00:00+02:00",
    },
    {
      name: "both: idle first",
      policy: berlin({ mode: "both", idleMinutes: 90, atHour: 4 }),
      lastActive: Date.UTC(2031, 0, 15, 12),
      at: Date.UTC(2031, 0, 15, 13, 30) + 1,
      reason: "idle",
      idleAt: Date.UTC(2031, 0, 15, 13, 30) + 1,
      dailyAt: Date.UTC(2031, 0, 16, 3),
      local: "2031-01-16T04:00:00+01:00",
    },
    {
      name: "fractional idle_minutes: 0.00001 min is 0.6 ms, so the first whole ms past it",
      policy: policy({ mode: "idle", idleMinutes: 0.00001 }),
      lastActive: T,
      at: T + 1,
      reason: "idle",
      idleAt: T + 1,
      dailyAt: null,
      local: null,
    },
    {
      name: "fractional idle_minutes 1.5",
      policy: policy({ mode: "idle", idleMinutes: 1.5 }),
      lastActive: T,
      at: T + 90_001,
      reason: "idle",
      idleAt: T + 90_001,
      dailyAt: null,
      local: null,
    },
    {
      name: "mode none: no deadline",
      policy: policy({ mode: "none" }),
      lastActive: T,
      at: null,
      reason: null,
      idleAt: null,
      dailyAt: null,
      local: null,
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const result = explain(input({ row: row({ lastActiveAt: c.lastActive }), policy: c.policy, now: c.lastActive }));
      expect(result.deadline).toEqual({
        at: c.at,
        reason: c.reason,
        idle_at: c.idleAt,
        daily_at: c.dailyAt,
        daily_at_local: c.local,
        timezone: c.policy.timeZone,
      });
      expect(result.last_active_at).toBe(c.lastActive);
    });
  }

  it("a durable boundary and a key never seen have no deadline", () => {
    for (const r of [row({ endReason: "admin", endedAt: T }), null]) {
      expect(explain(input({ row: r })).deadline).toEqual({
        at: null,
        reason: null,
        idle_at: null,
        daily_at: null,
        daily_at_local: null,
        timezone: "UTC",
      });
    }
  });

  it("a recoverable row keeps its deadline (its policy still governs it)", () => {
    const result = explain(input({ row: row({ endReason: "agent_close" }), policy: policy({ mode: "idle" }) }));
    expect(result.deadline.at).toBe(T + 1440 * MINUTE + 1);
  });

  it("formats local times with the zone's offset, negative ones too", () => {
    expect(formatZoned(Date.UTC(2031, 0, 15, 12), "America/New_York")).toBe("2031-01-15T07:00:00-05:00");
    expect(formatZoned(Date.UTC(2031, 0, 15, 12), "Asia/Kolkata")).toBe("2031-01-15T17:30:00+05:30");
    expect(formatZoned(Date.UTC(2031, 0, 15, 12), "UTC")).toBe("2031-01-15T12:00:00+00:00");
  });
});

describe("open_run: the current run while unfinished", () => {
  const handoff: Handoff = { attempts: 3, lastError: "HTTP 503", dueAt: T + 5000 };
  const cases: { name: string; run: RunRow | null; handoff: Handoff | null; now: number; open: object | null }[] = [
    { name: "no current run", run: null, handoff: null, now: T, open: null },
    {
      name: "accepted, within its lease",
      run: run(),
      handoff: null,
      now: T + LEASE - 1,
      open: { run_id: "run_1", status: "running", attempts: null, lease_until: T + LEASE },
    },
    {
      name: "a heartbeat extends the lease",
      run: run({ lastHeartbeatAt: T + 5 * MINUTE }),
      handoff: null,
      now: T + LEASE + 1,
      open: { run_id: "run_1", status: "running", lease_until: T + 15 * MINUTE },
    },
    { name: "lease lapsed", run: run(), handoff: null, now: T + LEASE, open: null },
    {
      name: "hand-off still being retried: no lease yet",
      run: run(),
      handoff,
      now: T + 2 * LEASE,
      open: { run_id: "run_1", status: "dispatching", attempts: 3, last_error: "HTTP 503", lease_until: null },
    },
    { name: "finished", run: run({ finishedAt: T + 1 }), handoff: null, now: T + 2, open: null },
    { name: "revoked", run: run({ revokedReason: "stopped" }), handoff: null, now: T + 2, open: null },
    { name: "failed for good", run: run({ failedAt: T + 1 }), handoff: null, now: T + 2, open: null },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const result = explain(
        input({ row: row({ currentRunId: "run_1" }), currentRun: c.run, handoff: c.handoff, now: c.now }),
      );
      if (c.open === null) expect(result.open_run).toBeNull();
      else expect(result.open_run).toMatchObject(c.open);
    });
  }
});

describe("expiry waits for the turn in progress", () => {
  const expired = {
    row: row({ currentRunId: "run_1", lastActiveAt: T }),
    policy: policy({ mode: "idle", idleMinutes: 1 }),
  };
  it("a live row past its deadline with its run open takes the message", () => {
    const result = explain(input({ ...expired, currentRun: run(), now: T + 2 * MINUTE }));
    expect(result.would).toMatchObject({ action: "append", reason: "held" });
    expect(result.would.expire).toBeUndefined();
  });
  it("within its deadline, a run open does not change the answer: the row is live", () => {
    const result = explain(input({ ...expired, currentRun: run(), now: T + 30_000 }));
    expect(result.would).toMatchObject({ action: "append", reason: "live" });
  });
  it("a recoverable ended row past its policy is expired even while a run of it is open: only a live row is held", () => {
    const ended = row({ currentRunId: "run_1", lastActiveAt: T, endReason: "agent_close", endedAt: T });
    const result = explain(input({ ...expired, row: ended, currentRun: run(), now: T + 2 * MINUTE }));
    expect(result.would).toMatchObject({ action: "fresh", reason: "expired", expire: { session_id: "s1" } });
  });
  it("once the run finished, the same row is expired", () => {
    const result = explain(input({ ...expired, currentRun: run({ finishedAt: T + 1 }), now: T + 2 * MINUTE }));
    expect(result.would).toMatchObject({
      action: "fresh",
      reason: "expired",
      expire: { session_id: "s1", reason: "idle" },
    });
  });
});

describe("policy and overlap sources", () => {
  const config = { by_platform: { telegram: { mode: "idle" as const } }, by_chat_type: { group: { at_hour: 5 } } };
  it.each([
    ["telegram", "group", "by_platform"],
    ["slack", "group", "by_chat_type"],
    ["slack", "dm", "default"],
  ])("%s %s: %s", (platform, chatType, source) => {
    expect(policySource(config, platform, chatType)).toBe(source);
  });

  it("with no per-platform or per-chat-type layer at all, the source is the default", () => {
    expect(policySource({}, "telegram", "group")).toBe("default");
  });

  it("effectivePolicy: the policy the routing object resolves, with its layer", () => {
    expect(effectivePolicy(config, "telegram", "group")).toMatchObject({
      // The layers merge: the platform's mode over the chat type's hour.
      policy: { mode: "idle", atHour: 5 },
      source: "by_platform",
    });
    expect(effectivePolicy(config, "slack", "group")).toMatchObject({
      policy: { mode: DEFAULT_POLICY.mode, atHour: 5 },
      source: "by_chat_type",
    });
  });

  it("passes the effective overlap settings and the waiting count through", () => {
    const overlap = { mode: "interrupt", debounce_ms: 250, max_batch: 3, source: "by_chat_type" } as const;
    const result = explain(input({ overlap, waiting: 4 }));
    expect(result.overlap).toEqual(overlap);
    expect(result.waiting).toBe(4);
    expect(explain(input({})).overlap).toEqual({ mode: "queue", debounce_ms: 0, max_batch: 20, source: "default" });
  });

  it("reads the platform and chat type of a key with no row", () => {
    expect(keyConversation("slack:channel:C1:U1")).toEqual({ platform: "slack", chatType: "channel" });
  });

  it("passes the effective policy through with its source", () => {
    const result = explain(input({ policy: policy({ mode: "idle", idleMinutes: 2.5 }), policySource: "by_platform" }));
    expect(result.policy).toEqual({
      mode: "idle",
      idle_minutes: 2.5,
      at_hour: 4,
      at_minute: 0,
      timezone: "UTC",
      source: "by_platform",
    });
  });
});
