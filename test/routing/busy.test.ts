/**
 * Whether a session is busy (WaitingRoom.busy), the one read that decides on every
 * message in `queue` mode whether it waits: a hand-off in the outbox names its
 * session in the outbox's `session_id` column, kept by every write of the item and
 * filled in for an outbox written before the column existed. And what holds a
 * session's waiting messages back (WaitingRoom.holds), which the alarm plan reads:
 * a hand-off in the outbox, or the earliest lease end of its accepted runs.
 */
import { runInDurableObject } from "cloudflare:test";
import { afterEach, beforeEach, expect, it } from "vitest";
import { OutboxTable, type OutboxItem } from "../../src/routing/outbox-table";
import { WaitingRoom } from "../../src/routing/waiting";
import type { RunWork } from "../../src/routing/work";
import { T0, restoreClock, router, setNow, unique } from "../helpers";

beforeEach(() => setNow(T0));
afterEach(() => restoreClock());

const runItem = (id: string, sessionId: string): OutboxItem<"run"> => ({
  id,
  kind: "run",
  payload: { stage: "dispatch", runId: id, sessionId } as RunWork,
  dueAt: T0,
  attempts: 0,
  lastError: null,
  createdAt: T0,
});

it("a hand-off keeps its session busy until it leaves the outbox, under the session its payload names", async () => {
  await runInDurableObject(router(unique("busy-key")), async (_instance, state) => {
    const table = new OutboxTable(state.storage.sql);
    const room = new WaitingRoom(state.storage.sql);
    expect(room.busy("ses_a", true)).toBe(false);
    table.add(runItem("run_1", "ses_a"));
    expect(room.busy("ses_a", false)).toBe(true);
    expect(room.busy("ses_b", true)).toBe(false);
    // Storing found another session (a fresh one): the rewritten payload moves the mark.
    table.put(runItem("run_1", "ses_b"));
    expect(room.busy("ses_a", true)).toBe(false);
    expect(room.busy("ses_b", false)).toBe(true);
    table.delete("run_1");
    expect(room.busy("ses_b", true)).toBe(false);
    // Other kinds of item never make a session busy.
    table.add({ ...runItem("dl_1", "ses_c"), kind: "delivery" } as never);
    expect(room.busy("ses_c", true)).toBe(false);
  });
});

it("an accepted run, and with orWaiting a waiting message, make the session busy", async () => {
  await runInDurableObject(router(unique("busy-key")), async (_instance, state) => {
    const room = new WaitingRoom(state.storage.sql);
    room.accept("run_2", "ses_d", [], T0 + 1000);
    expect(room.busy("ses_d", false)).toBe(true);
    room.over("run_2");
    expect(room.busy("ses_d", true)).toBe(false);
    room.add("ses_d", { eventId: "evt_1", receivedAt: T0 } as never);
    expect(room.busy("ses_d", false)).toBe(false);
    expect(room.busy("ses_d", true)).toBe(true);
  });
});

it("an outbox written before the session column existed learns the sessions of its hand-offs on wake", async () => {
  await runInDurableObject(router(unique("busy-key")), async (_instance, state) => {
    const sql = state.storage.sql;
    sql.exec(`DROP TABLE outbox`);
    sql.exec(`CREATE TABLE outbox (
      id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, due_at INTEGER NOT NULL,
      attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL,
      seq INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID`);
    sql.exec(
      `INSERT INTO outbox (id, kind, payload, due_at, created_at, seq) VALUES ('run_old', 'run', ?, ?, ?, 1)`,
      JSON.stringify({ stage: "dispatch", runId: "run_old", sessionId: "ses_old" }),
      T0,
      T0,
    );
    new OutboxTable(sql);
    expect(new WaitingRoom(sql).busy("ses_old", false)).toBe(true);
  });
});

it("holds: a staged hand-off, and the earliest lease end of the session's accepted runs, kept up by heartbeats", async () => {
  await runInDurableObject(router(unique("busy-key")), async (_instance, state) => {
    const table = new OutboxTable(state.storage.sql);
    const room = new WaitingRoom(state.storage.sql);
    expect(room.holds("ses_e")).toEqual({ staged: false, leaseEnd: null });
    room.accept("run_3", "ses_e", [], T0 + 600_000);
    room.accept("run_4", "ses_e", [], T0 + 300_000);
    room.accept("run_5", "ses_f", [], T0 + 100_000);
    expect(room.holds("ses_e")).toEqual({ staged: false, leaseEnd: T0 + 300_000 });
    // A heartbeat moved run_4's lease on: the earliest end is run_3's now.
    room.heardUntil("run_4", T0 + 900_000);
    expect(room.holds("ses_e")).toEqual({ staged: false, leaseEnd: T0 + 600_000 });
    table.add(runItem("run_6", "ses_e"));
    expect(room.holds("ses_e")).toEqual({ staged: true, leaseEnd: T0 + 600_000 });
    room.over("run_3");
    room.over("run_4");
    table.delete("run_6");
    expect(room.holds("ses_e")).toEqual({ staged: false, leaseEnd: null });
  });
});

it("accepted runs recorded before the lease column existed are due at once, so the alarm looks at each", async () => {
  await runInDurableObject(router(unique("busy-key")), async (_instance, state) => {
    const sql = state.storage.sql;
    sql.exec(`DROP TABLE IF EXISTS overlap_accepted`);
    sql.exec(
      `CREATE TABLE overlap_accepted (run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, messages TEXT NOT NULL)`,
    );
    sql.exec(`INSERT INTO overlap_accepted (run_id, session_id, messages) VALUES ('run_old', 'ses_old', '[]')`);
    const room = new WaitingRoom(sql);
    expect(room.holds("ses_old")).toEqual({ staged: false, leaseEnd: 0 });
    expect(room.busy("ses_old", false)).toBe(true);
  });
});
