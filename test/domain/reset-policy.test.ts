import { describe, expect, it } from "vitest";
import {
  DEFAULT_POLICY,
  deadline,
  expiryReason,
  isExpired,
  lastBoundary,
  liveSince,
  nextBoundary,
  resolvePolicy,
  type ResetPolicy,
} from "../../src/domain/reset-policy";

const SECOND = 1_000;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

function policy(overrides: Partial<ResetPolicy>): ResetPolicy {
  return { ...DEFAULT_POLICY, ...overrides };
}

/** The wall clock of `instant` in `timeZone`, as "YYYY-MM-DD HH:MM", computed independently of src. */
function wall(instant: number, timeZone: string): string {
  const parts: Record<string, string> = {};
  const format = new Intl.DateTimeFormat("en-CA", {
    timeZone,
    hourCycle: "h23",
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
  });
  for (const part of format.formatToParts(instant)) parts[part.type] = part.value;
  return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute}`;
}

describe("DEFAULT_POLICY", () => {
  it("is the spec's default: both, 1440 idle minutes, 04:00 UTC", () => {
    expect(DEFAULT_POLICY).toEqual({ mode: "both", idleMinutes: 1440, atHour: 4, atMinute: 0, timeZone: "UTC" });
  });
});

describe("mode none", () => {
  const none = policy({ mode: "none" });
  const last = Date.UTC(2026, 0, 1, 12, 0);

  it("has no live threshold and no deadline", () => {
    expect(liveSince(none, last + 1000 * DAY)).toBe(Number.NEGATIVE_INFINITY);
    expect(deadline(none, last)).toBeNull();
  });

  it.each([
    ["the same instant", last],
    ["a day later", last + DAY],
    ["after a daily boundary", Date.UTC(2026, 0, 2, 4, 0)],
    ["ten years later", last + 3650 * DAY],
  ])("never expires (%s)", (_label, now) => {
    expect(isExpired(none, last, now)).toBe(false);
    expect(expiryReason(none, last, now)).toBeNull();
  });
});

describe("mode idle", () => {
  const last = Date.UTC(2026, 4, 10, 9, 15, 30, 250);

  it.each([
    { idleMinutes: 1440, idleMs: 1440 * MINUTE },
    { idleMinutes: 30, idleMs: 30 * MINUTE },
    { idleMinutes: 0.5, idleMs: 30 * SECOND },
    { idleMinutes: 1.5, idleMs: 90 * SECOND },
    { idleMinutes: 0.25, idleMs: 15 * SECOND },
  ])("idle_minutes $idleMinutes: expired only when now > last + $idleMs ms", ({ idleMinutes, idleMs }) => {
    const idle = policy({ mode: "idle", idleMinutes });
    expect(isExpired(idle, last, last)).toBe(false);
    expect(isExpired(idle, last, last + idleMs - 1)).toBe(false);
    // Exactly at last + idle it is not yet expired: the rule is strictly greater.
    expect(isExpired(idle, last, last + idleMs)).toBe(false);
    expect(isExpired(idle, last, last + idleMs + 1)).toBe(true);
    expect(expiryReason(idle, last, last + idleMs)).toBeNull();
    expect(expiryReason(idle, last, last + idleMs + 1)).toBe("idle");
    expect(deadline(idle, last)).toBe(last + idleMs + 1);
    expect(liveSince(idle, last + idleMs)).toBe(last);
  });

  it("ignores daily boundaries", () => {
    const idle = policy({ mode: "idle", idleMinutes: 1440, atHour: 4 });
    const beforeBoundary = Date.UTC(2026, 4, 10, 3, 59);
    const afterBoundary = Date.UTC(2026, 4, 10, 4, 1);
    expect(isExpired(idle, beforeBoundary, afterBoundary)).toBe(false);
    expect(deadline(idle, beforeBoundary)).toBe(beforeBoundary + DAY + 1);
  });

  it("liveSince is now minus the idle span", () => {
    const idle = policy({ mode: "idle", idleMinutes: 1.5 });
    const now = Date.UTC(2026, 4, 10, 12, 0);
    expect(liveSince(idle, now)).toBe(now - 90 * SECOND);
  });
});

describe("mode daily (UTC)", () => {
  const daily = policy({ mode: "daily", atHour: 4, atMinute: 0, timeZone: "UTC" });
  const boundary = Date.UTC(2026, 4, 10, 4, 0);

  it.each([
    { label: "activity before, now at the boundary", last: boundary - 1, now: boundary, expired: true },
    { label: "activity before, now just before the boundary", last: boundary - 1, now: boundary - 1, expired: false },
    { label: "activity exactly at the boundary", last: boundary, now: boundary + HOUR, expired: false },
    { label: "activity after, now before the next one", last: boundary + 1, now: boundary + DAY - 1, expired: false },
    { label: "activity after, now at the next one", last: boundary + 1, now: boundary + DAY, expired: true },
    {
      label: "a long silence across several boundaries",
      last: boundary - 3 * DAY,
      now: boundary + HOUR,
      expired: true,
    },
    { label: "23 hours within one day", last: boundary + 30 * MINUTE, now: boundary + 23 * HOUR, expired: false },
  ])("$label", ({ last, now, expired }) => {
    expect(isExpired(daily, last, now)).toBe(expired);
    expect(expiryReason(daily, last, now)).toBe(expired ? "daily" : null);
  });

  it("is not idle-bound: days of silence within the same local day are fine only before the boundary", () => {
    const last = Date.UTC(2026, 4, 10, 4, 0, 0, 1);
    expect(isExpired(daily, last, Date.UTC(2026, 4, 11, 3, 59, 59, 999))).toBe(false);
    expect(deadline(daily, last)).toBe(Date.UTC(2026, 4, 11, 4, 0));
  });

  it.each([
    { t: Date.UTC(2026, 4, 10, 3, 59, 59, 999), last: Date.UTC(2026, 4, 9, 4, 0), next: Date.UTC(2026, 4, 10, 4, 0) },
    { t: Date.UTC(2026, 4, 10, 4, 0), last: Date.UTC(2026, 4, 10, 4, 0), next: Date.UTC(2026, 4, 11, 4, 0) },
    { t: Date.UTC(2026, 4, 10, 23, 59), last: Date.UTC(2026, 4, 10, 4, 0), next: Date.UTC(2026, 4, 11, 4, 0) },
    { t: Date.UTC(2026, 11, 31, 12, 0), last: Date.UTC(2026, 11, 31, 4, 0), next: Date.UTC(2027, 0, 1, 4, 0) },
    { t: Date.UTC(2028, 1, 28, 5, 0), last: Date.UTC(2028, 1, 28, 4, 0), next: Date.UTC(2028, 1, 29, 4, 0) },
  ])("lastBoundary is at or before t, nextBoundary strictly after ($t)", ({ t, last, next }) => {
    expect(lastBoundary(daily, t)).toBe(last);
    expect(nextBoundary(daily, t)).toBe(next);
  });

  it("honours at_minute", () => {
    const p = policy({ mode: "daily", atHour: 23, atMinute: 45, timeZone: "UTC" });
    expect(nextBoundary(p, Date.UTC(2026, 4, 10, 23, 44))).toBe(Date.UTC(2026, 4, 10, 23, 45));
    expect(lastBoundary(p, Date.UTC(2026, 4, 10, 23, 44))).toBe(Date.UTC(2026, 4, 9, 23, 45));
    expect(liveSince(p, Date.UTC(2026, 4, 11, 0, 0))).toBe(Date.UTC(2026, 4, 10, 23, 45));
  });

  it("liveSince is the most recent boundary", () => {
    expect(liveSince(daily, Date.UTC(2026, 4, 10, 12, 0))).toBe(boundary);
    expect(liveSince(daily, boundary)).toBe(boundary);
    expect(liveSince(daily, boundary - 1)).toBe(boundary - DAY);
  });
});

describe("mode both", () => {
  it.each([
    {
      label: "idle comes first",
      p: policy({ mode: "both", idleMinutes: 60, atHour: 4 }),
      last: Date.UTC(2026, 4, 10, 12, 0),
      idleAt: Date.UTC(2026, 4, 10, 13, 0) + 1,
      dailyAt: Date.UTC(2026, 4, 11, 4, 0),
      first: "idle",
    },
    {
      label: "daily comes first",
      p: policy({ mode: "both", idleMinutes: 60, atHour: 4 }),
      last: Date.UTC(2026, 4, 10, 3, 30),
      idleAt: Date.UTC(2026, 4, 10, 4, 30) + 1,
      dailyAt: Date.UTC(2026, 4, 10, 4, 0),
      first: "daily",
    },
    {
      label: "daily comes first with the default 1440 minutes",
      p: DEFAULT_POLICY,
      last: Date.UTC(2026, 4, 10, 12, 0),
      idleAt: Date.UTC(2026, 4, 11, 12, 0) + 1,
      dailyAt: Date.UTC(2026, 4, 11, 4, 0),
      first: "daily",
    },
    {
      label: "fractional idle comes first",
      p: policy({ mode: "both", idleMinutes: 0.5, atHour: 4 }),
      last: Date.UTC(2026, 4, 10, 3, 59),
      idleAt: Date.UTC(2026, 4, 10, 3, 59, 30) + 1,
      dailyAt: Date.UTC(2026, 4, 10, 4, 0),
      first: "idle",
    },
    {
      label: "daily one millisecond before idle",
      p: policy({ mode: "both", idleMinutes: 1, atHour: 4 }),
      last: Date.UTC(2026, 4, 10, 3, 59, 0, 1),
      idleAt: Date.UTC(2026, 4, 10, 4, 0, 0, 2),
      dailyAt: Date.UTC(2026, 4, 10, 4, 0),
      first: "daily",
    },
  ])("$label", ({ p, last, idleAt, dailyAt, first }) => {
    const earliest = Math.min(idleAt, dailyAt);
    expect(deadline(p, last)).toBe(earliest);
    expect(isExpired(p, last, earliest - 1)).toBe(false);
    expect(isExpired(p, last, earliest)).toBe(true);
    expect(expiryReason(p, last, earliest - 1)).toBeNull();
    // The reason names the deadline that came first, also long after both passed.
    expect(expiryReason(p, last, earliest)).toBe(first);
    expect(expiryReason(p, last, Math.max(idleAt, dailyAt) + DAY)).toBe(first);
  });

  it("a tie between the idle and daily deadlines expires at that instant for one of the two reasons", () => {
    const p = policy({ mode: "both", idleMinutes: 60, atHour: 4 });
    const last = Date.UTC(2026, 4, 10, 2, 59, 59, 999);
    const tie = Date.UTC(2026, 4, 10, 4, 0);
    expect(deadline(p, last)).toBe(tie);
    expect(expiryReason(p, last, tie - 1)).toBeNull();
    expect(["idle", "daily"]).toContain(expiryReason(p, last, tie));
  });

  it("liveSince is the later of the idle threshold and the last boundary", () => {
    const p = policy({ mode: "both", idleMinutes: 60, atHour: 4 });
    expect(liveSince(p, Date.UTC(2026, 4, 10, 12, 0))).toBe(Date.UTC(2026, 4, 10, 11, 0));
    expect(liveSince(p, Date.UTC(2026, 4, 10, 4, 30))).toBe(Date.UTC(2026, 4, 10, 4, 0));
  });
});

describe("daily boundaries in IANA zones across DST changes", () => {
  // America/New_York: spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z),
  // fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z), so 01:00-01:59 happens twice.
  // Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z).
  // Australia/Sydney: 2026-04-05 03:00 AEDT -> 02:00 AEST (16:00Z on the 4th);
  // 2026-10-04 02:00 AEST -> 03:00 AEDT (16:00Z on the 3rd).
  const cases: {
    label: string;
    zone: string;
    atHour: number;
    atMinute: number;
    boundaries: number[];
  }[] = [
    {
      label: "New York 02:30, skipped on spring-forward day (resolves to 03:30 EDT)",
      zone: "America/New_York",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 2, 7, 7, 30), Date.UTC(2026, 2, 8, 7, 30), Date.UTC(2026, 2, 9, 6, 30)],
    },
    {
      label: "New York 02:30 on fall-back day (02:30 EST happens once)",
      zone: "America/New_York",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 9, 31, 6, 30), Date.UTC(2026, 10, 1, 7, 30), Date.UTC(2026, 10, 2, 7, 30)],
    },
    {
      label: "New York 01:30, repeated on fall-back day (first occurrence, EDT)",
      zone: "America/New_York",
      atHour: 1,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 9, 31, 5, 30), Date.UTC(2026, 10, 1, 5, 30), Date.UTC(2026, 10, 2, 6, 30)],
    },
    {
      label: "New York 04:00 across spring forward",
      zone: "America/New_York",
      atHour: 4,
      atMinute: 0,
      boundaries: [Date.UTC(2026, 2, 7, 9, 0), Date.UTC(2026, 2, 8, 8, 0), Date.UTC(2026, 2, 9, 8, 0)],
    },
    {
      label: "Berlin 02:30, skipped on 2026-03-29 (resolves to 03:30 CEST)",
      zone: "Europe/Berlin",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 2, 28, 1, 30), Date.UTC(2026, 2, 29, 1, 30), Date.UTC(2026, 2, 30, 0, 30)],
    },
    {
      label: "Berlin 04:00 across 2026-03-29",
      zone: "Europe/Berlin",
      atHour: 4,
      atMinute: 0,
      boundaries: [Date.UTC(2026, 2, 28, 3, 0), Date.UTC(2026, 2, 29, 2, 0), Date.UTC(2026, 2, 30, 2, 0)],
    },
    {
      label: "Berlin 02:30, repeated on 2026-10-25 (first occurrence, CEST)",
      zone: "Europe/Berlin",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 9, 24, 0, 30), Date.UTC(2026, 9, 25, 0, 30), Date.UTC(2026, 9, 26, 1, 30)],
    },
    {
      label: "Sydney 02:30, repeated on 2026-04-05 (first occurrence, AEDT)",
      zone: "Australia/Sydney",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 3, 3, 15, 30), Date.UTC(2026, 3, 4, 15, 30), Date.UTC(2026, 3, 5, 16, 30)],
    },
    {
      label: "Sydney 02:30, skipped on 2026-10-04 (resolves to 03:30 AEDT)",
      zone: "Australia/Sydney",
      atHour: 2,
      atMinute: 30,
      boundaries: [Date.UTC(2026, 9, 2, 16, 30), Date.UTC(2026, 9, 3, 16, 30), Date.UTC(2026, 9, 4, 15, 30)],
    },
    {
      label: "Sydney 04:00 in winter (local date ahead of UTC)",
      zone: "Australia/Sydney",
      atHour: 4,
      atMinute: 0,
      boundaries: [Date.UTC(2026, 5, 13, 18, 0), Date.UTC(2026, 5, 14, 18, 0), Date.UTC(2026, 5, 15, 18, 0)],
    },
    {
      label: "New York 23:00 (local date behind UTC)",
      zone: "America/New_York",
      atHour: 23,
      atMinute: 0,
      boundaries: [Date.UTC(2026, 0, 9, 4, 0), Date.UTC(2026, 0, 10, 4, 0), Date.UTC(2026, 0, 11, 4, 0)],
    },
    {
      label: "Kolkata 04:00 (half-hour offset)",
      zone: "Asia/Kolkata",
      atHour: 4,
      atMinute: 0,
      boundaries: [Date.UTC(2026, 2, 7, 22, 30), Date.UTC(2026, 2, 8, 22, 30), Date.UTC(2026, 2, 9, 22, 30)],
    },
  ];

  it.each(cases)("$label", ({ zone, atHour, atMinute, boundaries }) => {
    const p = policy({ mode: "daily", atHour, atMinute, timeZone: zone });
    const [b0, b1, b2] = boundaries as [number, number, number];
    // Each boundary is found from just before it and from the previous one.
    expect(nextBoundary(p, b0)).toBe(b1);
    expect(nextBoundary(p, b1 - 1)).toBe(b1);
    expect(nextBoundary(p, b1)).toBe(b2);
    expect(nextBoundary(p, b0 + 1)).toBe(b1);
    // And backwards.
    expect(lastBoundary(p, b1)).toBe(b1);
    expect(lastBoundary(p, b1 - 1)).toBe(b0);
    expect(lastBoundary(p, b2 - 1)).toBe(b1);
    expect(lastBoundary(p, b2)).toBe(b2);
    // Expiry and deadline follow the boundaries.
    expect(deadline(p, b0)).toBe(b1);
    expect(deadline(p, b1 - 1)).toBe(b1);
    expect(isExpired(p, b1 - 1, b1 - 1)).toBe(false);
    expect(isExpired(p, b1 - 1, b1)).toBe(true);
    expect(isExpired(p, b1, b2 - 1)).toBe(false);
    expect(isExpired(p, b1, b2)).toBe(true);
    expect(expiryReason(p, b1 - 1, b1)).toBe("daily");
    expect(liveSince(p, b2 - 1)).toBe(b1);
  });

  it("the second 01:30 of New York's fall-back day is not a boundary", () => {
    const p = policy({ mode: "daily", atHour: 1, atMinute: 30, timeZone: "America/New_York" });
    const first = Date.UTC(2026, 10, 1, 5, 30); // 01:30 EDT
    const second = Date.UTC(2026, 10, 1, 6, 30); // 01:30 EST
    expect(wall(first, "America/New_York")).toBe("2026-11-01 01:30");
    expect(wall(second, "America/New_York")).toBe("2026-11-01 01:30");
    const between = Date.UTC(2026, 10, 1, 6, 0);
    expect(isExpired(p, between, second)).toBe(false);
    expect(isExpired(p, between, second + HOUR)).toBe(false);
    expect(lastBoundary(p, second)).toBe(first);
    expect(nextBoundary(p, between)).toBe(Date.UTC(2026, 10, 2, 6, 30));
    expect(nextBoundary(p, first)).toBe(Date.UTC(2026, 10, 2, 6, 30));
  });

  it("activity in New York's skipped hour still meets the spring-forward boundary", () => {
    const p = policy({ mode: "daily", atHour: 2, atMinute: 30, timeZone: "America/New_York" });
    const justBeforeGap = Date.UTC(2026, 2, 8, 6, 59); // 01:59 EST
    expect(nextBoundary(p, justBeforeGap)).toBe(Date.UTC(2026, 2, 8, 7, 30)); // 03:30 EDT
    expect(isExpired(p, justBeforeGap, Date.UTC(2026, 2, 8, 7, 29))).toBe(false);
    expect(isExpired(p, justBeforeGap, Date.UTC(2026, 2, 8, 7, 30))).toBe(true);
  });

  const yearZones: { zone: string; atHour: number; atMinute: number }[] = [
    { zone: "America/New_York", atHour: 2, atMinute: 30 },
    { zone: "America/New_York", atHour: 1, atMinute: 30 },
    { zone: "America/New_York", atHour: 0, atMinute: 0 },
    { zone: "Europe/Berlin", atHour: 2, atMinute: 30 },
    { zone: "Europe/Berlin", atHour: 4, atMinute: 0 },
    { zone: "Australia/Sydney", atHour: 2, atMinute: 30 },
    { zone: "Australia/Sydney", atHour: 23, atMinute: 59 },
    { zone: "UTC", atHour: 4, atMinute: 0 },
  ];

  it.each(yearZones)(
    "$zone $atHour:$atMinute happens exactly once per local day through 2026",
    ({ zone, atHour, atMinute }) => {
      const p = policy({ mode: "daily", atHour, atMinute, timeZone: zone });
      const expected = `${String(atHour).padStart(2, "0")}:${String(atMinute).padStart(2, "0")}`;
      let t = Date.UTC(2025, 11, 31, 0, 0);
      let previousDate: string | null = null;
      let previous: number | null = null;
      const skipped: string[] = [];
      for (let i = 0; i < 370; i++) {
        const boundary = nextBoundary(p, t);
        expect(boundary).toBeGreaterThan(t);
        const [date, time] = wall(boundary, zone).split(" ") as [string, string];
        if (previousDate !== null) {
          const dayAfter = new Date(Date.parse(`${previousDate}T00:00:00Z`) + DAY).toISOString().slice(0, 10);
          expect(date).toBe(dayAfter);
        }
        if (previous !== null) {
          expect([23 * HOUR, 24 * HOUR, 25 * HOUR]).toContain(boundary - previous);
          expect(lastBoundary(p, boundary - 1)).toBe(previous);
        }
        expect(lastBoundary(p, boundary)).toBe(boundary);
        if (time !== expected) skipped.push(`${date} ${time}`);
        previousDate = date;
        previous = boundary;
        t = boundary;
      }
      // Only a wall time a DST change skips may resolve elsewhere, one hour later.
      const gapDays: Record<string, string[]> = {
        "America/New_York 2:30": ["2026-03-08 03:30"],
        "Europe/Berlin 2:30": ["2026-03-29 03:30"],
        "Australia/Sydney 2:30": ["2026-10-04 03:30"],
      };
      expect(skipped).toEqual(gapDays[`${zone} ${atHour}:${atMinute}`] ?? []);
    },
  );
});

describe("deadline consistency", () => {
  const policies: { label: string; p: ResetPolicy }[] = [
    { label: "default", p: DEFAULT_POLICY },
    { label: "idle 0.5", p: policy({ mode: "idle", idleMinutes: 0.5 }) },
    { label: "idle 1.5", p: policy({ mode: "idle", idleMinutes: 1.5 }) },
    { label: "idle 1/3", p: policy({ mode: "idle", idleMinutes: 1 / 3 }) },
    { label: "idle 0.00001 (sub-millisecond)", p: policy({ mode: "idle", idleMinutes: 0.00001 }) },
    {
      label: "daily New York 02:30",
      p: policy({ mode: "daily", atHour: 2, atMinute: 30, timeZone: "America/New_York" }),
    },
    {
      label: "daily New York 01:30",
      p: policy({ mode: "daily", atHour: 1, atMinute: 30, timeZone: "America/New_York" }),
    },
    { label: "daily Berlin 02:30", p: policy({ mode: "daily", atHour: 2, atMinute: 30, timeZone: "Europe/Berlin" }) },
    {
      label: "daily Sydney 02:30",
      p: policy({ mode: "daily", atHour: 2, atMinute: 30, timeZone: "Australia/Sydney" }),
    },
    {
      label: "both New York 02:30, idle 90",
      p: policy({ mode: "both", idleMinutes: 90, atHour: 2, atMinute: 30, timeZone: "America/New_York" }),
    },
    {
      label: "both Berlin 03:15, idle 1.5",
      p: policy({ mode: "both", idleMinutes: 1.5, atHour: 3, atMinute: 15, timeZone: "Europe/Berlin" }),
    },
  ];

  // Around every DST change of 2026 in the three zones, plus ordinary days and odd milliseconds.
  const starts = [
    Date.UTC(2026, 2, 7, 12, 0),
    Date.UTC(2026, 2, 28, 12, 0),
    Date.UTC(2026, 3, 4, 0, 0),
    Date.UTC(2026, 9, 3, 0, 0),
    Date.UTC(2026, 9, 24, 12, 0),
    Date.UTC(2026, 9, 31, 12, 0),
    Date.UTC(2026, 6, 1, 0, 0, 0, 7),
  ];
  const samples = starts.flatMap((start) => Array.from({ length: 80 }, (_, i) => start + i * 37 * MINUTE + i * 13));

  it.each(policies)("$label: expired exactly from the deadline on", ({ p }) => {
    for (const last of samples) {
      const at = deadline(p, last);
      expect(at).not.toBeNull();
      const d = at as number;
      expect(d).toBeGreaterThan(last);
      expect(isExpired(p, last, d - 1), `last=${last} deadline=${d}`).toBe(false);
      expect(isExpired(p, last, d), `last=${last} deadline=${d}`).toBe(true);
      expect(expiryReason(p, last, d - 1)).toBeNull();
      expect(expiryReason(p, last, d)).not.toBeNull();
      // liveSince agrees: `last` is the threshold's side of live just before and dead at the deadline.
      expect(liveSince(p, d - 1)).toBeLessThanOrEqual(last);
      expect(liveSince(p, d)).toBeGreaterThan(last);
    }
  });
});

describe("resolvePolicy", () => {
  it("with an empty config is the default", () => {
    expect(resolvePolicy({}, "telegram", "dm")).toEqual(DEFAULT_POLICY);
  });

  const config = {
    mode: "idle" as const,
    idle_minutes: 60,
    timezone: "Europe/Berlin",
    by_chat_type: {
      group: { idle_minutes: 30, at_hour: 6 },
      channel: { mode: "daily" as const },
    },
    by_platform: {
      slack: { idle_minutes: 5 },
      discord: { mode: "none" as const, at_minute: 15 },
    },
  };

  it.each([
    {
      label: "top-level fields override the default, field by field",
      platform: "telegram",
      chatType: "dm",
      expected: { mode: "idle", idleMinutes: 60, atHour: 4, atMinute: 0, timeZone: "Europe/Berlin" },
    },
    {
      label: "chat type overrides the top level, keeping the rest",
      platform: "telegram",
      chatType: "group",
      expected: { mode: "idle", idleMinutes: 30, atHour: 6, atMinute: 0, timeZone: "Europe/Berlin" },
    },
    {
      label: "platform beats chat type on the same field, chat type's other fields remain",
      platform: "slack",
      chatType: "group",
      expected: { mode: "idle", idleMinutes: 5, atHour: 6, atMinute: 0, timeZone: "Europe/Berlin" },
    },
    {
      label: "platform applies to a chat type without an override",
      platform: "slack",
      chatType: "dm",
      expected: { mode: "idle", idleMinutes: 5, atHour: 4, atMinute: 0, timeZone: "Europe/Berlin" },
    },
    {
      label: "platform mode beats chat type mode",
      platform: "discord",
      chatType: "channel",
      expected: { mode: "none", idleMinutes: 60, atHour: 4, atMinute: 15, timeZone: "Europe/Berlin" },
    },
    {
      label: "chat type mode without a platform override",
      platform: "whatsapp",
      chatType: "channel",
      expected: { mode: "daily", idleMinutes: 60, atHour: 4, atMinute: 0, timeZone: "Europe/Berlin" },
    },
  ])("$label ($platform, $chatType)", ({ platform, chatType, expected }) => {
    expect(resolvePolicy(config, platform, chatType)).toEqual(expected);
  });

  it("does not mutate the default", () => {
    resolvePolicy({ mode: "none", idle_minutes: 1 }, "x", "dm");
    expect(DEFAULT_POLICY).toEqual({ mode: "both", idleMinutes: 1440, atHour: 4, atMinute: 0, timeZone: "UTC" });
  });

  it("the resolved policy drives expiry", () => {
    const slackGroup = resolvePolicy(config, "slack", "group");
    const last = Date.UTC(2026, 4, 10, 12, 0);
    expect(isExpired(slackGroup, last, last + 5 * MINUTE)).toBe(false);
    expect(isExpired(slackGroup, last, last + 5 * MINUTE + 1)).toBe(true);
    expect(deadline(resolvePolicy(config, "discord", "group"), last)).toBeNull();
  });
});
