/**
 * Whether a session is busy (WaitingRoom.busy), the one read that decides on every
 * message in `queue` mode whether it waits: a hand-off in the outbox names its
 * session in the outbox's `session_id` column, kept by every write of the item and
 * filled in for an outbox written before the column existed.
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
    room.accept("run_2", "ses_d", []);
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
