/**
 * The end reasons table of the spec, row by row: which reasons may be reopened,
 * which finalize (one `session.finalized`), and which make the next session's first
 * reply carry a reset notice (invariant 10). Every path (alarm, message, command,
 * agent, operator, sweep) asks these functions, so a wrong row here is wrong
 * everywhere at once.
 */
import { describe, expect, it } from "vitest";
import {
  END_REASONS,
  finalizes,
  isEndReason,
  isRecoverable,
  noticeFor,
  type EndReason,
} from "../../src/domain/end-reasons";

// The spec's table: reason, recoverable?, finalizes?
const TABLE: [EndReason, boolean, boolean][] = [
  ["idle", false, true],
  ["daily", false, true],
  ["suspended", false, true],
  ["new_command", false, true],
  ["compression", false, false],
  ["cron_complete", false, true],
  ["admin", false, true],
  ["agent_close", true, false],
  ["orphan_reap", true, false],
];

describe("the end reasons table", () => {
  it("names exactly the spec's nine reasons", () => {
    expect([...END_REASONS].sort()).toEqual(TABLE.map(([reason]) => reason).sort());
  });

  it.each(TABLE)("%s: recoverable %s, finalizes %s", (reason, recoverable, finalizing) => {
    expect(isRecoverable(reason)).toBe(recoverable);
    expect(finalizes(reason)).toBe(finalizing);
  });

  it("a live row (no reason) is not a recoverable one", () => {
    expect(isRecoverable(null)).toBe(false);
  });
});

describe("isEndReason (what an operator or the agent may send as a reason)", () => {
  it.each(TABLE.map(([reason]) => reason))("accepts %s", (reason) => {
    expect(isEndReason(reason)).toBe(true);
  });

  it.each([["IDLE"], ["idle "], [""], ["finalized"], [null], [undefined], [1], [["idle"]], [{ reason: "idle" }]])(
    "refuses %j",
    (value) => {
      expect(isEndReason(value)).toBe(false);
    },
  );
});

describe("noticeFor (invariant 10: the first reply after an auto-reset says why)", () => {
  it.each([
    { reason: "idle", hadActivity: true, notice: "idle" },
    { reason: "daily", hadActivity: true, notice: "daily" },
    // An empty session that expired: nothing the user would miss, so no notice.
    { reason: "idle", hadActivity: false, notice: null },
    { reason: "daily", hadActivity: false, notice: null },
    // `/stop` always says so, even with nothing in the old session.
    { reason: "suspended", hadActivity: true, notice: "suspended" },
    { reason: "suspended", hadActivity: false, notice: "suspended" },
  ] as const)("$reason, had activity $hadActivity: $notice", ({ reason, hadActivity, notice }) => {
    expect(noticeFor(reason, hadActivity)).toBe(notice);
  });

  it.each(["new_command", "compression", "cron_complete", "admin", "agent_close", "orphan_reap"] as const)(
    "%s is not an auto-reset: no notice, with or without activity",
    (reason) => {
      expect(noticeFor(reason, true)).toBeNull();
      expect(noticeFor(reason, false)).toBeNull();
    },
  );
});
