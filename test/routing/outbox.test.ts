/**
 * The outbox alone, with fake handlers, on the object's own table inside
 * runInDurableObject: what a failing item keeps, how the drain interleaves kinds,
 * how staging wakes it, and where the inline window ends.
 */
import { runInDurableObject } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
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
import { OutboxTable } from "../../src/routing/outbox-table";
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
        const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        await outbox.drained();
        const item = outbox.get("check_a", "check");
        expect(item).toMatchObject({ attempts: 1, dueAt: T0 + backoffDelay(1) });
        expect(item?.lastError).toContain("D1 down");
        // The operator's log says which item failed, and why.
        expect(errors.mock.calls.map(([line]) => JSON.parse(String(line)))).toContainEqual(
          expect.objectContaining({
            msg: "outbox item failed",
            kind: "check",
            item_id: "check_a",
            error: expect.stringContaining("D1 down"),
          }),
        );
        errors.mockRestore();
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

  it("the alarm runs what is due oldest due first, then in the order it was staged (not by id)", () => {
    const ran: string[] = [];
    return withOutbox(
      (o) => ({
        check: async (item) => {
          ran.push(item.id);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        outbox.stage("check_z", "check", { sessionId: "ses_z" }, T0);
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        outbox.stage("check_m", "check", { sessionId: "ses_m" }, T0 - 5_000);
        await outbox.run();
        expect(ran).toEqual(["check_m", "check_z", "check_a"]);
      },
      "alarm",
    );
  });

  it("runs at most 50 items at once; the rest start as those finish", () => {
    const held = gate();
    let running = 0;
    let most = 0;
    const done: string[] = [];
    return withOutbox(
      (o) => ({
        delivery: async (item) => {
          running += 1;
          most = Math.max(most, running);
          await held.opened;
          running -= 1;
          done.push(item.id);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        for (let i = 0; i < 60; i++) outbox.stage(`dl_${i}`, "delivery", delivery(`dl_${i}`), T0);
        const drain = outbox.run();
        await new Promise((resolve) => setTimeout(resolve, 0));
        expect(running).toBe(50);
        held.open();
        await drain;
        expect(most).toBe(50);
        expect(done).toHaveLength(60);
        expect(outbox.all("delivery")).toEqual([]);
      },
      "alarm",
    );
  });

  it("an item staged again while it runs for later than its run checkpoints it keeps the sooner time", () => {
    const delivering = gate();
    return withOutbox(
      (o) => ({
        events: async (item) => {
          delivering.reach();
          await delivering.opened;
          o.checkpoint(item, { dueAt: T0 + 1_000 });
        },
      }),
      async (outbox) => {
        outbox.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0);
        await delivering.reached;
        outbox.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0 + 60_000, true);
        delivering.open();
        await outbox.drained();
        expect(outbox.get("events_ses_a", "events")).toMatchObject({ dueAt: T0 + 1_000 });
      },
    );
  });

  it("an item its handler completed before throwing stays completed: the failure does not bring it back", () =>
    withOutbox(
      (o) => ({
        check: async (item) => {
          o.complete(item.id);
          throw new Error("failed after its work was done");
        },
      }),
      async (outbox) => {
        const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        // The drain (the alarm's) itself ends well: the failure is the item's alone.
        await expect(outbox.run()).resolves.toBeUndefined();
        errors.mockRestore();
        expect(outbox.get("check_a", "check")).toBeNull();
        expect(outbox.all("check")).toEqual([]);
      },
      "alarm",
    ));

  it("a handler may stage more work before its first await: it starts at once, runs once, nothing is retried", () => {
    const held = gate();
    const ran: string[] = [];
    return withOutbox(
      (o) => ({
        check: async (item) => {
          o.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0, true);
          ran.push(item.id);
          await held.opened;
          o.complete(item.id);
        },
        events: async (item) => {
          ran.push(item.id);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        outbox.stage("check_a", "check", { sessionId: "ses_a" }, T0);
        await new Promise((resolve) => setTimeout(resolve, 0));
        // The events item did not wait for the check item still in flight.
        expect(ran).toEqual(["check_a", "events_ses_a"]);
        held.open();
        await outbox.drained();
        expect(ran).toEqual(["check_a", "events_ses_a"]);
        expect(outbox.all("check")).toEqual([]);
        expect(outbox.all("events")).toEqual([]);
      },
    );
  });

  it("a drain that fails ends only when its items in flight have; a caller meanwhile waits and none runs twice", () => {
    const held = gate();
    const starts: string[] = [];
    return withOutbox(
      (o) => ({
        delivery: async (item) => {
          starts.push(item.id);
          held.reach();
          await held.opened;
          o.complete(item.id);
        },
        check: async (item) => {
          starts.push(item.id);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        outbox.stage("dl_a", "delivery", delivery("dl_a"), T0);
        await held.reached;
        // Storage fails the drain's next look for due work (a new item wakes it).
        const due = outbox.table.due.bind(outbox.table);
        outbox.table.due = () => {
          outbox.table.due = due;
          throw new Error("storage unavailable");
        };
        outbox.stage("check_b", "check", { sessionId: "ses_b" }, T0);
        await new Promise((resolve) => setTimeout(resolve, 0));
        // The failed drain still waits for dl_a; a caller now joins it rather than starting dl_a again.
        expect(outbox.draining).toBe(true);
        const again = outbox.run();
        held.open();
        await again.catch(() => undefined);
        await outbox.drained();
        await outbox.run();
        expect(starts.filter((id) => id === "dl_a")).toEqual(["dl_a"]);
        expect(starts).toContain("check_b");
        expect(outbox.all("delivery")).toEqual([]);
      },
    );
  });

  it("an events item starts while a delivery is in flight; only another events item holds it back", () => {
    const held = gate();
    const log: string[] = [];
    return withOutbox(
      (o) => ({
        delivery: async (item) => {
          log.push(`start ${item.id}`);
          held.reach();
          await held.opened;
          o.complete(item.id);
        },
        events: async (item) => {
          log.push(`start ${item.id}`);
          o.complete(item.id);
        },
      }),
      async (outbox) => {
        outbox.stage("dl_1", "delivery", delivery("dl_1"), T0);
        await held.reached;
        outbox.stage("events_ses_a", "events", { sessionId: "ses_a" }, T0);
        await new Promise((resolve) => setTimeout(resolve, 0));
        expect(log).toEqual(["start dl_1", "start events_ses_a"]);
        held.open();
      },
    );
  });

  it("all(kind) lists the items of that kind only", () =>
    withOutbox(
      () => ({}),
      async (outbox) => {
        outbox.stage("events_s", "events", { sessionId: "s" }, T0 + 1_000_000);
        outbox.stage("dl_1", "delivery", delivery("dl_1"), T0 + 1_000_000);
        expect(outbox.all("delivery").map((item) => item.id)).toEqual(["dl_1"]);
        expect(outbox.all("events").map((item) => item.id)).toEqual(["events_s"]);
        expect(outbox.all("run")).toEqual([]);
      },
      "alarm",
    ));

  it("a drain whose re-arm fails still ends well, and logs it", () =>
    runInDurableObject(router(unique("outbox-key")), async (_instance, state) => {
      const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
      const outbox = new Outbox({
        sql: state.storage.sql,
        mode: () => "alarm",
        armBy: () => undefined,
        waitUntil: () => undefined,
        afterDrain: async () => {
          throw new Error("storage busy");
        },
      });
      outbox.register({ run: idle, delivery: idle, events: idle, check: idle });
      await expect(outbox.run()).resolves.toBeUndefined();
      expect(errors.mock.calls.map(([line]) => JSON.parse(String(line)))).toContainEqual(
        expect.objectContaining({
          msg: "could not re-arm after draining",
          error: expect.stringContaining("storage busy"),
        }),
      );
      errors.mockRestore();
    }));

  it("refuses to drain before its handlers are registered", () =>
    runInDurableObject(router(unique("outbox-key")), async (_instance, state) => {
      const outbox = new Outbox({
        sql: state.storage.sql,
        mode: () => "alarm",
        armBy: () => undefined,
        waitUntil: () => undefined,
        afterDrain: async () => undefined,
      });
      await expect(outbox.run()).rejects.toThrow("outbox handlers not registered");
    }));

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

describe("the outbox table", () => {
  it("an outbox written before seq and session_id existed gains both; its hand-offs learn their session", () =>
    runInDurableObject(router(unique("outbox-key")), async (_instance, state) => {
      const sql = state.storage.sql;
      sql.exec(`DROP TABLE IF EXISTS outbox`);
      sql.exec(`CREATE TABLE outbox (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, due_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL) WITHOUT ROWID`);
      sql.exec(
        `INSERT INTO outbox (id, kind, payload, due_at, created_at) VALUES (?, 'run', ?, ?, ?)`,
        "run_old",
        JSON.stringify({ runId: "run_old", sessionId: "ses_old" }),
        T0,
        T0,
      );
      const table = new OutboxTable(sql);
      expect(sql.exec(`SELECT id, seq, session_id FROM outbox`).toArray()).toEqual([
        { id: "run_old", seq: 0, session_id: "ses_old" },
      ]);
      // New items are ordered after the old one.
      table.add({
        id: "run_new",
        kind: "check",
        payload: { sessionId: "ses_new" },
        dueAt: T0,
        attempts: 0,
        lastError: null,
        createdAt: T0,
      });
      expect(table.due(T0).map((item) => item.id)).toEqual(["run_old", "run_new"]);
    }));

  it("a row of an unknown kind is refused with its id and kind named, not guessed at", () =>
    runInDurableObject(router(unique("outbox-key")), async (_instance, state) => {
      const table = new OutboxTable(state.storage.sql);
      state.storage.sql.exec(
        `INSERT INTO outbox (id, kind, payload, due_at, created_at) VALUES ('odd_1', 'fax', '{}', ?, ?)`,
        T0,
        T0,
      );
      expect(() => table.get("odd_1")).toThrow("outbox item odd_1 has an unknown kind fax");
    }));
});
