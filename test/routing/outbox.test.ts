/**
 * The outbox alone, with fake handlers, on the object's own table inside
 * runInDurableObject: what a failing item keeps, how the drain interleaves kinds,
 * how staging wakes it, and where the inline window ends.
 */
import { runInDurableObject } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { backoffDelay } from "../../src/http/backoff";
import { INLINE_GRACE_MS } from "../../src/routing/alarm";
import {
  DELIVERY_MAX_ATTEMPTS,
  DRAIN_WINDOW_MS,
  Outbox,
  RUN_GIVE_UP_MS,
  givesUp,
  type OutboxHandlers,
} from "../../src/routing/outbox";
import type { DeliveryWork } from "../../src/routing/work";
import { T0, restoreClock, router, setNow, unique } from "../helpers";

beforeEach(() => setNow(T0));
afterEach(() => restoreClock());

/** A promise the test resolves itself, and one that says the handler was reached. */
function gate() {
  let open!: () => void;
  let reach!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const reached = new Promise<void>((resolve) => (reach = resolve));
  return { open, opened, reach, reached };
}

const idle = async () => {
  throw new Error("this kind was not expected to run");
};

/** An outbox on a fresh routing object's table, draining inline, with what it asked of the alarm recorded. */
async function withOutbox(
  handlers: (outbox: Outbox) => Partial<OutboxHandlers>,
  test: (outbox: Outbox, armed: number[]) => Promise<void>,
  mode: "inline" | "alarm" = "inline",
): Promise<void> {
  await runInDurableObject(router(unique("outbox-key")), async (_instance, state) => {
    const armed: number[] = [];
    const outbox = new Outbox({
      sql: state.storage.sql,
      mode: () => mode,
      armBy: (at) => armed.push(at),
      waitUntil: () => undefined,
      afterDrain: async () => undefined,
    });
    outbox.register({ run: idle, delivery: idle, events: idle, check: idle, ...handlers(outbox) });
    await test(outbox, armed);
    await outbox.drained();
  });
}

const delivery = (id: string): DeliveryWork => ({
  deliveryId: id,
  sessionId: "ses_x",
  sessionKey: "generic:dm:x",
  platform: "generic",
  kind: "reply",
  text: "hi",
  notice: null,
  eventId: null,
  target: { platform: "generic" },
});

describe("outbox", () => {
  it("a handler that throws leaves its item, the attempt counted, due after its backoff", () =>
    withOutbox(
      (o) => ({
        check: async () => {
          throw new Error("D1 down");
        },
      }),
      async (outbox) => {
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        await outbox.drained();
        const item = outbox.get("check_a", "check");
        expect(item).toMatchObject({ attempts: 1, dueAt: T0 + backoffDelay(1) });
        expect(item?.lastError).toContain("D1 down");
        // A second failure counts again, with a longer backoff.
        setNow(T0 + backoffDelay(1));
        await outbox.run();
        expect(outbox.get("check_a", "check")).toMatchObject({
          attempts: 2,
          dueAt: T0 + backoffDelay(1) + backoffDelay(2),
        });
      },
    ));

  it("an item staged again while it runs is not lost when that run completes: it runs once more", () => {
    // A session's events item delivers what is pending while the check item promotes
    // the row and stages the events item again for the event it just wrote.
    const delivering = gate();
    const runs: number[] = [];
    return withOutbox(
      (o) => ({
        events: async (item) => {
          runs.push(runs.length + 1);
          if (runs.length === 1) {
            delivering.reach();
            await delivering.opened;
          }
          o.complete(item.id);
        },
        check: async (item) => {
          await delivering.reached;
          o.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0, true);
          o.complete(item.id);
          delivering.open();
        },
      }),
      async (outbox) => {
        outbox.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0);
        outbox.stage("check_ses_a", "check", { sessionId: "ses_a" }, T0);
        await outbox.drained();
        expect(runs).toEqual([1, 2]);
        expect(outbox.get("events_ses_a", "events")).toBeNull();
      },
    );
  });

  it("an item staged again while it runs keeps its earlier due time when that run puts it off", () => {
    // The events item's run finds one event failing (due again in 30 s) while the check
    // item writes a new event and stages the events item for now: the new event must not
    // wait out the failing one's backoff.
    const delivering = gate();
    const runs: number[] = [];
    return withOutbox(
      (o) => ({
        events: async (item) => {
          runs.push(runs.length + 1);
          if (runs.length === 1) {
            delivering.reach();
            await delivering.opened;
            o.checkpoint(item, { dueAt: T0 + 30_000 });
          } else o.complete(item.id);
        },
        check: async (item) => {
          await delivering.reached;
          o.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0, true);
          o.complete(item.id);
          delivering.open();
        },
      }),
      async (outbox) => {
        outbox.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0);
        outbox.stage("check_ses_a", "check", { sessionId: "ses_a" }, T0);
        await outbox.drained();
        expect(runs).toEqual([1, 2]);
        expect(outbox.get("events_ses_a", "events")).toBeNull();
      },
    );
  });

  it("runs one events item at a time, in staged order, while other kinds run beside it", () => {
    const log: string[] = [];
    const first = gate();
    return withOutbox(
      (o) => ({
        events: async (item) => {
          log.push(`start ${item.payload.sessionId}`);
          if (item.payload.sessionId === "ses_old") {
            first.reach();
            await first.opened;
          }
          log.push(`end ${item.payload.sessionId}`);
          o.complete(item.id);
        },
        delivery: async (item) => {
          log.push(`delivery ${item.id}`);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        outbox.stage("events_ses_old", "events", { sessionId: "ses_old" }, T0);
        outbox.stage("events_ses_new", "events", { sessionId: "ses_new" }, T0);
        outbox.stage("dl_1", "delivery", delivery("dl_1"), T0);
        await first.reached;
        // Let the drain loop pick up what it may while the first events item is held.
        for (let i = 0; i < 20; i++) await Promise.resolve();
        await new Promise((resolve) => setTimeout(resolve, 0));
        expect(log).toEqual(["start ses_old", "delivery dl_1"]);
        first.open();
        await outbox.drained();
        expect(log).toEqual(["start ses_old", "delivery dl_1", "end ses_old", "start ses_new", "end ses_new"]);
      },
    );
  });

  it("staging wakes a running drain: a new item starts while another is still in flight", () => {
    const slow = gate();
    const started: string[] = [];
    return withOutbox(
      (o) => ({
        check: async (item) => {
          started.push(item.id);
          slow.reach();
          await slow.opened;
          o.complete(item.id);
        },
        delivery: async (item) => {
          started.push(item.id);
          o.complete(item.id);
          slow.open();
        },
      }),
      async (outbox) => {
        outbox.stage("check_slow", "check", { sessionId: "ses_s" }, T0);
        await slow.reached;
        expect(outbox.draining).toBe(true);
        // Staged while the check is held: only a woken drain can start it (and release the check).
        outbox.stage("dl_woken", "delivery", delivery("dl_woken"), T0);
        await outbox.drained();
        expect(started).toEqual(["check_slow", "dl_woken"]);
        expect(outbox.all("delivery")).toEqual([]);
      },
    );
  });

  it("an item due after the drain's window waits for the alarm, which then runs it", () => {
    const slow = gate();
    const ran: string[] = [];
    return withOutbox(
      (o) => ({
        check: async (item) => {
          ran.push(item.id);
          if (item.id === "check_slow") {
            slow.reach();
            await slow.opened;
          }
          o.complete(item.id);
        },
      }),
      async (outbox, armed) => {
        outbox.stage("check_slow", "check", { sessionId: "ses_s" }, T0);
        await slow.reached;
        setNow(T0 + DRAIN_WINDOW_MS);
        outbox.stage("check_late", "check", { sessionId: "ses_l" }, T0 + DRAIN_WINDOW_MS);
        expect(armed.at(-1)).toBe(T0 + DRAIN_WINDOW_MS + INLINE_GRACE_MS);
        slow.open();
        await outbox.drained();
        expect(ran).toEqual(["check_slow"]);
        expect(outbox.get("check_late", "check")).not.toBeNull();
        // What the alarm does: a new drain, with a new window.
        await outbox.run();
        expect(ran).toEqual(["check_slow", "check_late"]);
      },
    );
  });

  it("with OUTBOX_DRAIN=alarm staging only arms the alarm at the due time; nothing runs until it", () => {
    const ran: string[] = [];
    return withOutbox(
      (o) => ({
        check: async (item) => {
          ran.push(item.id);
          o.complete(item.id);
        },
      }),
      async (outbox, armed) => {
        // Due at once, yet only the alarm (here: run()) drains it.
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        expect(armed).toEqual([T0]);
        await Promise.resolve();
        expect(outbox.draining).toBe(false);
        await outbox.drained();
        expect(ran).toEqual([]);
        await outbox.run();
        expect(ran).toEqual(["check_a"]);
      },
      "alarm",
    );
  });

  it("checkpoint keeps progress without counting an attempt; get answers only for the kind asked", () =>
    withOutbox(
      () => ({}),
      async (outbox) => {
        outbox.stage("events_s", "events", { sessionId: "s" }, T0 + 1_000_000, false);
        const item = outbox.get("events_s", "events")!;
        outbox.checkpoint(item, { dueAt: T0 + 2_000_000 });
        expect(outbox.get("events_s", "events")).toMatchObject({ attempts: 0, dueAt: T0 + 2_000_000 });
        // The item is of another kind than asked: not returned as one.
        expect(outbox.get("events_s", "run")).toBeNull();
        outbox.unstage("events_s");
        expect(outbox.has("events_s")).toBe(false);
      },
      "alarm",
    ));
});

describe("givesUp", () => {
  const run = { kind: "run" as const, createdAt: T0 };
  it.each([
    ["a hand-off within its day keeps retrying", { ...run, attempts: 500 }, T0 + RUN_GIVE_UP_MS, false],
    ["a hand-off older than a day gives up", { ...run, attempts: 1 }, T0 + RUN_GIVE_UP_MS + 1, true],
    [
      "a delivery before its last attempt retries",
      { kind: "delivery" as const, createdAt: T0, attempts: DELIVERY_MAX_ATTEMPTS - 2 },
      T0,
      false,
    ],
    [
      "a delivery on its last attempt gives up",
      { kind: "delivery" as const, createdAt: T0, attempts: DELIVERY_MAX_ATTEMPTS - 1 },
      T0,
      true,
    ],
    ["events keep their own schedule", { kind: "events" as const, createdAt: 0, attempts: 99 }, T0, false],
    ["checks never give up", { kind: "check" as const, createdAt: 0, attempts: 99 }, T0, false],
  ])("%s", (_name, item, now, expected) => {
    expect(givesUp(item, now)).toBe(expected);
  });
});
