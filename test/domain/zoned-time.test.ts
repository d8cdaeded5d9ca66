/**
 * The zone offset explain shows next to a deadline (`daily_at_local`, e.g.
 * `+02:00`) must be the zone's real offset at any instant, also one that is not on
 * a whole minute (an idle deadline is last activity + idle + 1 ms).
 */
import { describe, expect, it } from "vitest";
import { offsetAt } from "../../src/domain/zoned-time";

const HOUR = 3_600_000;

describe("offsetAt", () => {
  it.each([
    ["Europe/Berlin in winter", Date.UTC(2026, 0, 15, 12, 34, 56, 789), "Europe/Berlin", HOUR],
    ["Europe/Berlin in summer", Date.UTC(2026, 6, 15, 23, 59, 59, 999), "Europe/Berlin", 2 * HOUR],
    ["America/New_York", Date.UTC(2026, 0, 15, 4, 0, 30, 1), "America/New_York", -5 * HOUR],
    ["Asia/Kolkata (half hour)", Date.UTC(2026, 3, 1, 0, 0, 59, 500), "Asia/Kolkata", 5.5 * HOUR],
    ["UTC", Date.UTC(2026, 3, 1, 7, 8, 9, 10), "UTC", 0],
  ])("is the zone's offset at an instant with seconds (%s)", (_what, instant, zone, offset) => {
    expect(offsetAt(instant, zone)).toBe(offset);
  });
});
