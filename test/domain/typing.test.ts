/** The typing schedule: at dispatch, every 4 s, at most 10 minutes, never for a run that no longer owns. */
import { describe, expect, it } from "vitest";
import { TYPING_AT_MOST_MS, TYPING_EVERY_MS, nextTypingAt, typingDue } from "../../src/domain/typing";

const D = 1_900_000_000_000;

describe("nextTypingAt", () => {
  it.each([
    { label: "repeat: first at dispatch", last: null, owns: true, cadence: "repeat", next: D },
    { label: "repeat: 4 s after the last", last: D, owns: true, cadence: "repeat", next: D + 4000 },
    { label: "repeat: from a late call", last: D + 6500, owns: true, cadence: "repeat", next: D + 10_500 },
    { label: "repeat: the last one at 10 min", last: D + 596_000, owns: true, cadence: "repeat", next: D + 600_000 },
    { label: "repeat: none past 10 min", last: D + 596_001, owns: true, cadence: "repeat", next: null },
    { label: "once: at dispatch", last: null, owns: true, cadence: "once", next: D },
    { label: "once: never again", last: D, owns: true, cadence: "once", next: null },
    { label: "none: never", last: null, owns: true, cadence: "none", next: null },
    {
      label: "a run that no longer owns: never, not even the first",
      last: null,
      owns: false,
      cadence: "repeat",
      next: null,
    },
    { label: "a run that no longer owns: no repeat", last: D, owns: false, cadence: "repeat", next: null },
    { label: "once and no longer owns", last: null, owns: false, cadence: "once", next: null },
  ] as const)("$label", ({ last, owns, cadence, next }) => {
    expect(nextTypingAt({ dispatchedAt: D, lastTypingAt: last, owns }, cadence)).toBe(next);
  });

  it("the constants are the spec's", () => {
    expect(TYPING_EVERY_MS).toBe(4000);
    expect(TYPING_AT_MOST_MS).toBe(600_000);
  });

  it("a whole run: one call at dispatch and every 4 s, 151 in 10 minutes, then none", () => {
    const calls: number[] = [];
    let last: number | null = null;
    // The alarm wakes every second for the run's whole life and a bit more.
    for (let now = D; now <= D + 700_000; now += 1000) {
      if (typingDue({ dispatchedAt: D, lastTypingAt: last, owns: true }, "repeat", now)) {
        calls.push(now);
        last = now;
      }
    }
    expect(calls[0]).toBe(D);
    expect(calls.length).toBe(151);
    expect(calls.at(-1)).toBe(D + 600_000);
    expect(calls.every((t, i) => i === 0 || t - calls[i - 1]! === 4000)).toBe(true);
  });

  it("stops at once when the run stops owning (finished, revoked, failed, lapsed)", () => {
    const run = { dispatchedAt: D, lastTypingAt: D + 4000, owns: true };
    expect(typingDue(run, "repeat", D + 8000)).toBe(true);
    expect(typingDue({ ...run, owns: false }, "repeat", D + 8000)).toBe(false);
    expect(typingDue(run, "repeat", D + 7999)).toBe(false);
  });
});
