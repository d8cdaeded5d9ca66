import { describe, expect, it } from "vitest";
import { parseCommand } from "../../src/domain/commands";
import { END_REASONS } from "../../src/domain/end-reasons";
import { isCurrentRun, ownership, revocationFor, type OwnershipInputs } from "../../src/domain/ownership";

const T = Date.UTC(2026, 4, 10, 12, 0);

function inputs(
  run: Partial<OwnershipInputs["run"]> = {},
  session: Partial<OwnershipInputs["session"]> = {},
): OwnershipInputs {
  return {
    run: { id: "run-1", finishedAt: null, revokedReason: null, ...run },
    session: { endReason: null, currentRunId: "run-1", ...session },
  };
}

describe("ownership", () => {
  it.each([
    { label: "current, unfinished run of a live session", input: inputs(), expected: { owns: true } },
    {
      label: "current run whose reply was recorded",
      input: inputs({ finishedAt: T }),
      expected: { owns: false, reason: "finished" },
    },
    {
      label: "a newer run took its place",
      input: inputs({}, { currentRunId: "run-2" }),
      expected: { owns: false, reason: "superseded" },
    },
    {
      label: "a newer run took its place after this one finished",
      input: inputs({ finishedAt: T }, { currentRunId: "run-2" }),
      expected: { owns: false, reason: "superseded" },
    },
    {
      label: "the session has no current run",
      input: inputs({}, { currentRunId: null }),
      expected: { owns: false, reason: "superseded" },
    },
    {
      label: "revoked by /new",
      input: inputs({ revokedReason: "superseded" }, { currentRunId: null }),
      expected: { owns: false, reason: "superseded" },
    },
    {
      label: "revoked by /stop",
      input: inputs({ revokedReason: "stopped" }, { endReason: "suspended" }),
      expected: { owns: false, reason: "stopped" },
    },
    {
      label: "revoked by the end of its session, even while still marked current",
      input: inputs({ revokedReason: "session_ended" }),
      expected: { owns: false, reason: "session_ended" },
    },
    {
      label: "the revocation reason wins over finished",
      input: inputs({ finishedAt: T, revokedReason: "stopped" }),
      expected: { owns: false, reason: "stopped" },
    },
    {
      label: "session ended by /new (unmarked run)",
      input: inputs({}, { endReason: "new_command" }),
      expected: { owns: false, reason: "superseded" },
    },
    {
      label: "session suspended by /stop (unmarked run)",
      input: inputs({}, { endReason: "suspended" }),
      expected: { owns: false, reason: "stopped" },
    },
    {
      label: "session ended idle (unmarked run)",
      input: inputs({}, { endReason: "idle" }),
      expected: { owns: false, reason: "session_ended" },
    },
    {
      label: "session ended by SQL, finished run: the end wins over finished",
      input: inputs({ finishedAt: T }, { endReason: "admin" }),
      expected: { owns: false, reason: "session_ended" },
    },
    {
      label: "session ended recoverably (agent_close)",
      input: inputs({}, { endReason: "agent_close" }),
      expected: { owns: false, reason: "session_ended" },
    },
  ])("$label", ({ input, expected }) => {
    expect(ownership(input)).toEqual(expected);
  });

  it.each(END_REASONS.map((reason) => ({ reason })))(
    "an unmarked run of a session ended $reason is told so",
    ({ reason }) => {
      const expected = reason === "new_command" ? "superseded" : reason === "suspended" ? "stopped" : "session_ended";
      expect(ownership(inputs({}, { endReason: reason }))).toEqual({ owns: false, reason: expected });
      expect(revocationFor(reason)).toBe(expected);
    },
  );
});

describe("isCurrentRun", () => {
  it.each([
    { label: "current and unfinished", input: inputs(), expected: true },
    { label: "current and finished (may still end or rotate)", input: inputs({ finishedAt: T }), expected: true },
    { label: "not current", input: inputs({}, { currentRunId: "run-2" }), expected: false },
    { label: "no current run", input: inputs({}, { currentRunId: null }), expected: false },
    { label: "current but revoked", input: inputs({ revokedReason: "stopped" }), expected: false },
  ])("$label -> $expected", ({ input, expected }) => {
    expect(isCurrentRun(input)).toBe(expected);
  });
});

describe("parseCommand", () => {
  it.each([
    ["/new", "new"],
    ["/reset", "reset"],
    ["/stop", "stop"],
    ["/NEW", "new"],
    ["/Reset", "reset"],
    ["/STOP", "stop"],
    ["/new@my_bot", "new"],
    ["/stop@SessionGateBot", "stop"],
    ["/new please", "new"],
    ["/new@my_bot please", "new"],
    ["/reset now", "reset"],
    ["/new\nwith a second line", "new"],
    ["  /new  ", "new"],
    ["\t/stop\n", "stop"],
  ])("%j -> %s", (text, command) => {
    expect(parseCommand(text)).toBe(command);
  });

  it.each([
    "/newer",
    "/resets",
    "/stopped",
    "/new-session",
    "/new:",
    "/new@",
    "new",
    "please /new",
    "hello",
    "",
    "   ",
    "/start",
    "/help",
    "//new",
    "\\new",
  ])("%j is not a command", (text) => {
    expect(parseCommand(text)).toBeNull();
  });
});
