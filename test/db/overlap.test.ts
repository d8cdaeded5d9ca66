/**
 * The overlap statements against real D1 (spec invariant 11 at the statement
 * level): a waiting message is taken by one live run, given back only by a revoked
 * one, recorded as not dispatched only while no run carries it; and the session
 * answer shows `run_id` and `not_dispatched`.
 */
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { Database } from "../../src/db/client";
import {
  attachMessages,
  markNotDispatched,
  markSessionNotDispatched,
  releaseMessages,
  revokeInterrupted,
  selectWaitingMessages,
  setRunMessages,
} from "../../src/db/overlap";
import { dispatchRun, type NewRun } from "../../src/db/runs";
import { appendUserMessage, endLive } from "../../src/db/sessions";
import { adminFetch, unique } from "../helpers";

const db = new Database(env.DB, "background");
const T = 1_900_000_000_000;

async function session(): Promise<string> {
  const id = unique("ses");
  await env.DB.prepare(
    `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at)
      VALUES (?, ?, 'generic', 'dm', ?, ?)`,
  )
    .bind(id, `generic:dm:${id}`, T, T)
    .run();
  return id;
}

/** Stores a user message that waits (no run yet), as the routing object would. */
async function waiting(sessionId: string, text: string, at: number): Promise<string> {
  const eventId = unique("ev");
  const [stored] = await db.batch(
    ...appendUserMessage(
      sessionId,
      { platform: "generic", sessionKey: `generic:dm:${sessionId}`, eventId, runId: null, text, receivedAt: at },
      T - 1,
    ),
  );
  expect(stored).toBe(1);
  return eventId;
}

async function run(sessionId: string, eventId: string): Promise<string> {
  const id = unique("run");
  const newRun: NewRun = {
    id,
    sessionId,
    sessionKey: `generic:dm:${sessionId}`,
    eventId,
    tokenHash: "hash",
    replyTo: JSON.stringify({ platform: "generic" }),
    createdAt: T,
    message: "{}",
    isNew: false,
  };
  await db.batch(...dispatchRun(newRun, T));
  return id;
}

const revoke = async (runId: string) => {
  const [changed] = await db.batch(revokeInterrupted(runId));
  expect(changed).toBe(1);
};

async function carriers(sessionId: string) {
  const rows = await env.DB.prepare(
    `SELECT event_id, run_id, not_dispatched FROM messages WHERE session_id = ? ORDER BY seq`,
  )
    .bind(sessionId)
    .all<{ event_id: string; run_id: string | null; not_dispatched: string | null }>();
  return Object.fromEntries(rows.results.map((r) => [r.event_id, { run: r.run_id, not: r.not_dispatched }]));
}

describe("attachMessages", () => {
  it("gives waiting messages to a live run, and only the ones named", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const b = await waiting(s, "b", T + 2);
    const c = await waiting(s, "c", T + 3);
    const r = await run(s, b);
    const [taken] = await db.batch(attachMessages(s, r, [a, b]));
    expect(taken).toBe(2);
    expect(await carriers(s)).toEqual({
      [a]: { run: r, not: null },
      [b]: { run: r, not: null },
      [c]: { run: null, not: null },
    });
  });

  it("never takes a message another run carries", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const first = await run(s, a);
    await db.batch(attachMessages(s, first, [a]));
    const second = await run(s, a);
    const [taken] = await db.batch(attachMessages(s, second, [a]));
    expect(taken).toBe(0);
    expect((await carriers(s))[a]).toEqual({ run: first, not: null });
  });

  it("never gives messages to a revoked run", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const r = await run(s, a);
    await revoke(r);
    const [taken] = await db.batch(attachMessages(s, r, [a]));
    expect(taken).toBe(0);
  });

  it("never takes a message recorded as not dispatched", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    await db.batch(markNotDispatched(s, [a], "stopped"));
    const r = await run(s, a);
    const [taken] = await db.batch(attachMessages(s, r, [a]));
    expect(taken).toBe(0);
    expect((await carriers(s))[a]).toEqual({ run: null, not: "stopped" });
  });

  it("does not reach another session's messages", async () => {
    const s = await session();
    const other = await session();
    const a = await waiting(other, "a", T + 1);
    const r = await run(s, a);
    const [taken] = await db.batch(attachMessages(s, r, [a]));
    expect(taken).toBe(0);
  });
});

describe("releaseMessages (an interrupt)", () => {
  it("gives a revoked run's messages back to the waiting, so the next run carries them", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const first = await run(s, a);
    await db.batch(attachMessages(s, first, [a]));
    await revoke(first);
    const [released] = await db.batch(releaseMessages(s, first));
    expect(released).toBe(1);
    const b = await waiting(s, "b", T + 2);
    const second = await run(s, b);
    await db.batch(attachMessages(s, second, [a, b]));
    expect(await carriers(s)).toEqual({ [a]: { run: second, not: null }, [b]: { run: second, not: null } });
  });

  it("gives back the messages of a run staged but never written to D1 (its hand-off dropped)", async () => {
    const s = await session();
    const eventId = unique("ev");
    // Stored as it is today, with the run id chosen before the run row exists.
    await db.batch(
      ...appendUserMessage(
        s,
        {
          platform: "generic",
          sessionKey: `generic:dm:${s}`,
          eventId,
          runId: "run_staged",
          text: "a",
          receivedAt: T + 1,
        },
        T - 1,
      ),
    );
    const [released] = await db.batch(releaseMessages(s, "run_staged"));
    expect(released).toBe(1);
    expect((await carriers(s))[eventId]).toEqual({ run: null, not: null });
  });

  it("never takes messages from a finished or failed run", async () => {
    for (const column of ["finished_at", "failed_at"]) {
      const s = await session();
      const a = await waiting(s, "a", T + 1);
      const r = await run(s, a);
      await db.batch(attachMessages(s, r, [a]));
      await env.DB.prepare(`UPDATE runs SET ${column} = ? WHERE id = ?`)
        .bind(T + 2, r)
        .run();
      const [revoked] = await db.batch(revokeInterrupted(r));
      expect(revoked, `a run with ${column} is not unfinished`).toBe(0);
      const [released] = await db.batch(releaseMessages(s, r));
      expect(released).toBe(0);
      expect((await carriers(s))[a]).toEqual({ run: r, not: null });
    }
  });

  it("never takes messages from a live run", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const r = await run(s, a);
    await db.batch(attachMessages(s, r, [a]));
    const [released] = await db.batch(releaseMessages(s, r));
    expect(released).toBe(0);
    expect((await carriers(s))[a]).toEqual({ run: r, not: null });
  });
});

describe("markNotDispatched", () => {
  it("records waiting messages with the reason, and leaves carried ones alone", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const b = await waiting(s, "b", T + 2);
    const r = await run(s, a);
    await db.batch(attachMessages(s, r, [a]));
    const [marked] = await db.batch(markNotDispatched(s, [a, b], "new_command"));
    expect(marked).toBe(1);
    expect(await carriers(s)).toEqual({ [a]: { run: r, not: null }, [b]: { run: null, not: "new_command" } });
  });

  it("keeps the first reason", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    await db.batch(markNotDispatched(s, [a], "stopped"));
    const [again] = await db.batch(markNotDispatched(s, [a], "session_ended"));
    expect(again).toBe(0);
    expect((await carriers(s))[a]).toEqual({ run: null, not: "stopped" });
  });

  it("markSessionNotDispatched touches only an ended session, and every waiting message of it", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const b = await waiting(s, "b", T + 2);
    const [live] = await db.batch(markSessionNotDispatched(s, "session_ended"));
    expect(live).toBe(0);
    await db.batch(endLive(s, "admin", false, T + 3));
    const [ended] = await db.batch(markSessionNotDispatched(s, "session_ended"));
    expect(ended).toBe(2);
    expect(await carriers(s)).toEqual({
      [a]: { run: null, not: "session_ended" },
      [b]: { run: null, not: "session_ended" },
    });
  });
});

describe("selectWaitingMessages and setRunMessages", () => {
  it("lists what waits, oldest first, and nothing carried or dropped", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const b = await waiting(s, "b", T + 2);
    const c = await waiting(s, "c", T + 3);
    const r = await run(s, a);
    await db.batch(attachMessages(s, r, [a]), markNotDispatched(s, [c], "stopped"));
    const [rows] = await db.batch(selectWaitingMessages(s));
    expect(rows.map((m) => m.eventId)).toEqual([b]);
  });

  it("records the messages a run carries", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    const r = await run(s, a);
    await db.batch(setRunMessages(r, [{ event_id: a }]));
    const row = await env.DB.prepare(`SELECT messages FROM runs WHERE id = ?`).bind(r).first<{ messages: string }>();
    expect(JSON.parse(row!.messages)).toEqual([{ event_id: a }]);
  });
});

describe("GET /admin/sessions/{id}", () => {
  it("shows each user message's run_id (null while it waits) and not_dispatched", async () => {
    const s = await session();
    const a = await waiting(s, "a", T + 1);
    await waiting(s, "b", T + 2);
    const c = await waiting(s, "c", T + 3);
    const r = await run(s, a);
    await db.batch(attachMessages(s, r, [a]), markNotDispatched(s, [c], "stopped"));
    const response = await adminFetch(`/admin/sessions/${s}`);
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.messages.map((m: any) => [m.text, m.run_id, m.not_dispatched])).toEqual([
      ["a", r, null],
      ["b", null, null],
      ["c", null, "stopped"],
    ]);
  });
});
