import { describe, expect, it } from "vitest";
import { END_REASONS, RECOVERABLE_REASONS, type EndReason } from "../../src/domain/end-reasons";
import { DEFAULT_POLICY, type ResetPolicy } from "../../src/domain/reset-policy";
import { decide, type RowState } from "../../src/domain/routing-decision";

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

function policy(overrides: Partial<ResetPolicy>): ResetPolicy {
  return { ...DEFAULT_POLICY, ...overrides };
}

function row(overrides: Partial<RowState>): RowState {
  return { id: "s-1", lastActiveAt: Date.UTC(2026, 4, 10, 12, 0), endReason: null, messageCount: 3, ...overrides };
}

const LAST = Date.UTC(2026, 4, 10, 12, 0);
const idle60 = policy({ mode: "idle", idleMinutes: 60 });
const daily4 = policy({ mode: "daily", atHour: 4, atMinute: 0, timeZone: "UTC" });
const both = policy({ mode: "both", idleMinutes: 60, atHour: 4, atMinute: 0, timeZone: "UTC" });
const none = policy({ mode: "none" });

describe("decide", () => {
  it("no row: a fresh session that replaces nothing", () => {
    expect(decide(null, DEFAULT_POLICY, LAST)).toEqual({ kind: "fresh", expire: null, replaced: null });
  });

  describe("live row", () => {
    it.each([
      { label: "idle, same instant", p: idle60, now: LAST },
      { label: "idle, exactly at last + idle", p: idle60, now: LAST + HOUR },
      { label: "daily, before the next boundary", p: daily4, now: Date.UTC(2026, 4, 11, 3, 59, 59, 999) },
      { label: "both, within both", p: both, now: LAST + 30 * MINUTE },
      { label: "none, a year later", p: none, now: LAST + 365 * 24 * HOUR },
    ])("within its policy appends ($label)", ({ p, now }) => {
      expect(decide(row({ id: "live-1" }), p, now)).toEqual({ kind: "append", sessionId: "live-1" });
    });

    it.each([
      { label: "idle, 1 ms past last + idle", p: idle60, now: LAST + HOUR + 1, reason: "idle" },
      { label: "idle, a day later", p: idle60, now: LAST + 24 * HOUR, reason: "idle" },
      { label: "daily, at the boundary", p: daily4, now: Date.UTC(2026, 4, 11, 4, 0), reason: "daily" },
      { label: "both, idle first", p: both, now: LAST + HOUR + 1, reason: "idle" },
      {
        label: "both, daily first",
        p: both,
        last: Date.UTC(2026, 4, 11, 3, 30),
        now: Date.UTC(2026, 4, 11, 4, 0),
        reason: "daily",
      },
      {
        label: "both, long after both deadlines: the first one names it",
        p: both,
        last: Date.UTC(2026, 4, 11, 3, 30),
        now: Date.UTC(2026, 4, 20, 0, 0),
        reason: "daily",
      },
    ])("expired starts fresh and expires the old one ($label)", ({ p, last, now, reason }) => {
      const state = row({ id: "live-2", lastActiveAt: last ?? LAST, messageCount: 2 });
      expect(decide(state, p, now)).toEqual({
        kind: "fresh",
        expire: { sessionId: "live-2", reason },
        replaced: { sessionId: "live-2", reason, hadActivity: true },
      });
    });
  });

  describe("recoverable row", () => {
    it.each(RECOVERABLE_REASONS.map((reason) => ({ reason })))(
      "$reason within its policy is reopened",
      ({ reason }) => {
        const state = row({ id: "rec-1", endReason: reason });
        expect(decide(state, idle60, LAST + HOUR)).toEqual({ kind: "reopen", sessionId: "rec-1" });
        expect(decide(state, daily4, Date.UTC(2026, 4, 11, 3, 59))).toEqual({ kind: "reopen", sessionId: "rec-1" });
        expect(decide(state, none, LAST + 1000 * HOUR)).toEqual({ kind: "reopen", sessionId: "rec-1" });
      },
    );

    it.each([
      { reason: "agent_close", p: idle60, now: LAST + HOUR + 1, expired: "idle" },
      { reason: "orphan_reap", p: idle60, now: LAST + 5 * HOUR, expired: "idle" },
      { reason: "agent_close", p: daily4, now: Date.UTC(2026, 4, 11, 4, 0), expired: "daily" },
      { reason: "orphan_reap", p: both, now: Date.UTC(2026, 4, 11, 4, 0), expired: "idle" },
    ])("$reason expired ($expired) starts fresh and promotes the old row", ({ reason, p, now, expired }) => {
      const state = row({ id: "rec-2", endReason: reason, messageCount: 0 });
      expect(decide(state, p, now)).toEqual({
        kind: "fresh",
        expire: { sessionId: "rec-2", reason: expired },
        replaced: { sessionId: "rec-2", reason: expired, hadActivity: false },
      });
    });

    it("recovery uses the row's real last activity, not the time of the lookup", () => {
      // Ended recoverably long ago; a message now must not reopen it just because the row was read now.
      const state = row({ id: "rec-3", endReason: "agent_close", lastActiveAt: LAST - 2 * HOUR });
      expect(decide(state, idle60, LAST).kind).toBe("fresh");
    });
  });

  describe("durable boundary row", () => {
    const durable = END_REASONS.filter((reason) => !RECOVERABLE_REASONS.includes(reason));

    it("covers every non-recoverable reason of the spec", () => {
      expect([...durable].sort()).toEqual(
        ["admin", "compression", "cron_complete", "daily", "idle", "new_command", "suspended"].sort(),
      );
    });

    it.each(durable.map((reason) => ({ reason })))("$reason starts fresh and is never reopened", ({ reason }) => {
      // Recent activity, a policy that never expires: still a boundary.
      for (const p of [none, idle60, daily4, both]) {
        const state = row({ id: "done-1", endReason: reason, lastActiveAt: LAST, messageCount: 4 });
        expect(decide(state, p, LAST + 1)).toEqual({
          kind: "fresh",
          expire: null,
          replaced: { sessionId: "done-1", reason: reason as EndReason, hadActivity: true },
        });
      }
    });

    it.each(durable.map((reason) => ({ reason })))(
      "$reason keeps its own reason even when the policy also expired it",
      ({ reason }) => {
        const state = row({ id: "done-2", endReason: reason, messageCount: 0 });
        expect(decide(state, idle60, LAST + 10 * HOUR)).toEqual({
          kind: "fresh",
          expire: null,
          replaced: { sessionId: "done-2", reason, hadActivity: false },
        });
      },
    );

    it("only the row passed in decides: older rows are irrelevant", () => {
      // The newest row is a boundary; whatever older live or recoverable rows exist, the answer is fresh
      // and names only the newest row.
      const newest = row({ id: "newest", endReason: "new_command", messageCount: 0 });
      const decision = decide(newest, none, LAST + 1);
      expect(decision).toEqual({
        kind: "fresh",
        expire: null,
        replaced: { sessionId: "newest", reason: "new_command", hadActivity: false },
      });
    });
  });

  describe("hadActivity", () => {
    it.each([
      { messageCount: 0, hadActivity: false },
      { messageCount: 1, hadActivity: true },
      { messageCount: 57, hadActivity: true },
    ])("messageCount $messageCount -> $hadActivity (expired live row)", ({ messageCount, hadActivity }) => {
      const decision = decide(row({ messageCount }), idle60, LAST + 2 * HOUR);
      expect(decision.kind).toBe("fresh");
      expect(decision.kind === "fresh" && decision.replaced?.hadActivity).toBe(hadActivity);
    });

    it.each([
      { messageCount: 0, hadActivity: false },
      { messageCount: 2, hadActivity: true },
    ])("messageCount $messageCount -> $hadActivity (suspended row)", ({ messageCount, hadActivity }) => {
      const decision = decide(row({ endReason: "suspended", messageCount }), none, LAST);
      expect(decision).toEqual({
        kind: "fresh",
        expire: null,
        replaced: { sessionId: "s-1", reason: "suspended", hadActivity },
      });
    });
  });
});
