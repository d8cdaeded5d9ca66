/**
 * The alarm plan: `nextAlarmAt` over its named sources, as a table. Each row names
 * the failure it guards against.
 */
import { describe, expect, it } from "vitest";
import { INLINE_GRACE_MS, nextAlarmAt, type AlarmSources } from "../../src/routing/alarm";
import { backoffDelay } from "../../src/http/backoff";

const NOW = 1_000_000;
const base: AlarmSources = {
  now: NOW,
  nextDueAt: null,
  draining: false,
  liveDeadline: null,
  hasEntry: true,
  settleFailures: 0,
};

const rows: [string, Partial<AlarmSources>, number | null][] = [
  ["nothing due and no deadline: no alarm (an idle key costs nothing)", {}, null],
  ["a due item: at its time (staged work never waits for the sweep)", { nextDueAt: NOW + 5_000 }, NOW + 5_000],
  ["an item already due: just after now (an alarm for now is dropped locally)", { nextDueAt: NOW - 50 }, NOW + 1],
  [
    "a drain running: the item only as its safety net, a grace later",
    { nextDueAt: NOW + 5, draining: true },
    NOW + INLINE_GRACE_MS,
  ],
  [
    "a drain running, an item due after the grace: at its time",
    { nextDueAt: NOW + INLINE_GRACE_MS + 7, draining: true },
    NOW + INLINE_GRACE_MS + 7,
  ],
  ["the live deadline alone (an idle session ends without a message)", { liveDeadline: NOW + 60_000 }, NOW + 60_000],
  [
    "the earlier of deadline and due item (no later than the deadline)",
    { liveDeadline: NOW + 60_000, nextDueAt: NOW + 90_000 },
    NOW + 60_000,
  ],
  ["a deadline passed: just after now", { liveDeadline: NOW - 1 }, NOW + 1],
  [
    "an unknown deadline with an entry: look again after a backoff (D1 was down)",
    { liveDeadline: undefined },
    NOW + backoffDelay(1),
  ],
  [
    "an unknown deadline after three failures: the backoff grows",
    { liveDeadline: undefined, settleFailures: 3 },
    NOW + backoffDelay(4),
  ],
  [
    "an unknown deadline, an item due sooner than the backoff: the item",
    { liveDeadline: undefined, nextDueAt: NOW + 10 },
    NOW + 10,
  ],
  ["an unknown deadline and no entry: nothing to look at", { liveDeadline: undefined, hasEntry: false }, null],
  ["no deadline (mode none): the failures count is irrelevant", { liveDeadline: null, settleFailures: 5 }, null],
  [
    "waiting messages due (an interrupt, a window's end, a lease's end): at that time, or they wait for a message",
    { waitingDueAt: NOW + 3_000 },
    NOW + 3_000,
  ],
  [
    "waiting messages due before the deadline: at their time",
    { waitingDueAt: NOW + 3_000, liveDeadline: NOW + 60_000 },
    NOW + 3_000,
  ],
  [
    "the deadline before the waiting messages' time: at the deadline",
    { waitingDueAt: NOW + 90_000, liveDeadline: NOW + 60_000 },
    NOW + 60_000,
  ],
  ["nothing waits (null): no alarm for it", { waitingDueAt: null }, null],
  [
    "waiting messages overdue while the alarm's passes fail (D1 down): after the backoff, not at once",
    { waitingDueAt: NOW - 5_000, liveDeadline: null, settleFailures: 2 },
    NOW + backoffDelay(2),
  ],
  [
    "waiting messages due after that backoff: at their time",
    { waitingDueAt: NOW + 10 * 60_000, liveDeadline: null, settleFailures: 2 },
    NOW + 10 * 60_000,
  ],
  [
    "the next typing call (Telegram's indicator fades after 5 s): at its time",
    { typingDueAt: NOW + 4_000 },
    NOW + 4_000,
  ],
  ["typing before a due item: at the typing call", { typingDueAt: NOW + 4_000, nextDueAt: NOW + 9_000 }, NOW + 4_000],
  ["no typing (null): no alarm for it", { typingDueAt: null }, null],
];

describe("nextAlarmAt", () => {
  it.each(rows)("%s", (_name, sources, expected) => {
    expect(nextAlarmAt({ ...base, ...sources })).toBe(expected);
  });

  it("is strictly after now whatever the sources say", () => {
    for (const [, sources] of rows) {
      const at = nextAlarmAt({ ...base, ...sources });
      if (at !== null) expect(at).toBeGreaterThan(NOW);
    }
  });
});
