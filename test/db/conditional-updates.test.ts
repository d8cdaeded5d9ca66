/**
 * Spec invariant 4 at the statement level, against real D1: ending only touches a
 * live row, promoting only a live or recoverable row still past its deadline,
 * reopening only a recoverable row within its policy, and a new session only
 * replaces a row that still carries the end reason its caller saw. These are what
 * make a race lose instead of overwriting a boundary.
 */
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { Database } from "../../src/db/client";
import { endLive, insertSession, promoteExpired, reopenRecoverable, selectSession } from "../../src/db/sessions";
import { END_REASONS, RECOVERABLE_REASONS } from "../../src/domain/end-reasons";
import { unique } from "../helpers";

const db = new Database(env.DB, "background");
const T = 1_900_000_000_000;

async function row(endReason: string | null, lastActiveAt = T): Promise<string> {
  const id = unique("ses");
  await env.DB.prepare(
    `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at, ended_at, end_reason)
      VALUES (?, ?, 'generic', 'dm', ?, ?, ?, ?)`,
  )
    .bind(id, `generic:dm:${id}`, T - 1000, lastActiveAt, endReason === null ? null : T, endReason)
    .run();
  return id;
}

const stateOf = async (id: string) => {
  const [rows] = await db.batch(selectSession(db, id));
  return { endReason: rows[0]!.endReason, endedAt: rows[0]!.endedAt };
};

describe("endLive", () => {
  it("ends a live row", async () => {
    const id = await row(null);
    const [changed] = await db.batch(endLive(id, "admin", false, T + 5));
    expect(changed).toBe(1);
    expect(await stateOf(id)).toEqual({ endReason: "admin", endedAt: T + 5 });
  });

  for (const reason of END_REASONS) {
    it(`never touches a row already ended as ${reason} (first reason wins)`, async () => {
      const id = await row(reason);
      const [changed] = await db.batch(endLive(id, "admin", false, T + 5));
      expect(changed).toBe(0);
      expect(await stateOf(id)).toEqual({ endReason: reason, endedAt: T });
    });
  }
});

describe("promoteExpired", () => {
  it("promotes a live row whose last activity is before liveSince", async () => {
    const id = await row(null, T);
    const [changed] = await db.batch(promoteExpired(id, "idle", T + 1, T + 9));
    expect(changed).toBe(1);
    expect(await stateOf(id)).toEqual({ endReason: "idle", endedAt: T + 9 });
  });

  it("does not promote a row whose activity moved (it is no longer expired)", async () => {
    const id = await row(null, T + 10);
    const [changed] = await db.batch(promoteExpired(id, "idle", T + 1, T + 9));
    expect(changed).toBe(0);
    expect(await stateOf(id)).toEqual({ endReason: null, endedAt: null });
  });

  for (const reason of RECOVERABLE_REASONS) {
    it(`promotes a recoverable (${reason}) row, keeping when it ended`, async () => {
      const id = await row(reason, T);
      const [changed] = await db.batch(promoteExpired(id, "daily", T + 1, T + 9));
      expect(changed).toBe(1);
      expect(await stateOf(id)).toEqual({ endReason: "daily", endedAt: T });
    });
  }

  for (const reason of END_REASONS.filter((r) => !RECOVERABLE_REASONS.includes(r))) {
    it(`never touches a durable boundary (${reason})`, async () => {
      const id = await row(reason, T);
      const [changed] = await db.batch(promoteExpired(id, "idle", T + 1, T + 9));
      expect(changed).toBe(0);
      expect(await stateOf(id)).toEqual({ endReason: reason, endedAt: T });
    });
  }
});

describe("reopenRecoverable", () => {
  for (const reason of RECOVERABLE_REASONS) {
    it(`reopens ${reason} within the policy`, async () => {
      const id = await row(reason, T);
      const [changed] = await db.batch(reopenRecoverable(id, `generic:dm:${id}`, T - 1, null));
      expect(changed).toBe(1);
      expect(await stateOf(id)).toEqual({ endReason: null, endedAt: null });
    });
  }

  it("does not reopen a recoverable row past its policy", async () => {
    const id = await row("agent_close", T);
    const [changed] = await db.batch(reopenRecoverable(id, `generic:dm:${id}`, T + 1, null));
    expect(changed).toBe(0);
    expect(await stateOf(id)).toEqual({ endReason: "agent_close", endedAt: T });
  });

  it("does not reopen a recoverable row that is not its key's newest (invariant 5)", async () => {
    const id = await row("agent_close", T);
    const key = `generic:dm:${id}`;
    await env.DB.prepare(
      `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at)
        VALUES (?, ?, 'generic', 'dm', ?, ?)`,
    )
      .bind(unique("ses"), key, T, T)
      .run();
    const [changed] = await db.batch(reopenRecoverable(id, key, T - 1, null));
    expect(changed).toBe(0);
    expect(await stateOf(id)).toEqual({ endReason: "agent_close", endedAt: T });
  });

  for (const reason of [null, ...END_REASONS.filter((r) => !RECOVERABLE_REASONS.includes(r))]) {
    it(`never touches a ${reason ?? "live"} row`, async () => {
      const id = await row(reason, T);
      const before = await stateOf(id);
      const [changed] = await db.batch(reopenRecoverable(id, `generic:dm:${id}`, T - 1, null));
      expect(changed).toBe(0);
      expect(await stateOf(id)).toEqual(before);
    });
  }
});

describe("insertSession", () => {
  // A fresh session follows a row of its own key (`row` keys each row by its id).
  const fresh = (replaced: { sessionId: string; reason: string } | null) => ({
    id: unique("ses"),
    sessionKey: replaced ? `generic:dm:${replaced.sessionId}` : unique("key"),
    platform: "generic",
    chatType: "dm",
    startedAt: T + 100,
    parentSessionId: null,
    replaced: replaced ? { sessionId: replaced.sessionId, reason: replaced.reason as never, hadActivity: true } : null,
    noticePending: null,
    sweepAt: null,
  });

  it("replaces a row that carries the end reason its caller saw", async () => {
    const old = await row("new_command");
    const [inserted] = await db.batch(...insertSession(fresh({ sessionId: old, reason: "new_command" }), null));
    expect(inserted).toBe(1);
  });

  it("refuses to replace a row that is live again, or ended otherwise, so a key never has two live rows", async () => {
    const live = await row(null);
    expect((await db.batch(...insertSession(fresh({ sessionId: live, reason: "idle" }), null)))[0]).toBe(0);
    const other = await row("admin");
    expect((await db.batch(...insertSession(fresh({ sessionId: other, reason: "idle" }), null)))[0]).toBe(0);
  });

  it("refuses to follow a row that is no longer its key's newest (a stale entry), so a key never has two live rows", async () => {
    const old = await row("admin");
    const newer = fresh({ sessionId: old, reason: "admin" });
    expect((await db.batch(...insertSession(newer, null)))[0]).toBe(1);
    // A caller still working from the old row, as a kill before the entry adopted `newer` leaves it.
    const again = { ...fresh({ sessionId: old, reason: "admin" }), startedAt: T + 200 };
    expect((await db.batch(...insertSession(again, null)))[0]).toBe(0);
    const { results } = await env.DB.prepare(`SELECT id FROM sessions WHERE session_key = ? AND end_reason IS NULL`)
      .bind(`generic:dm:${old}`)
      .all<{ id: string }>();
    expect(results.map((r) => r.id)).toEqual([newer.id]);
  });

  it("starts a key with no row without following anything, and refuses once the key has one", async () => {
    const first = fresh(null);
    expect((await db.batch(...insertSession(first, null)))[0]).toBe(1);
    expect((await db.batch(...insertSession({ ...first, id: unique("ses") }, null)))[0]).toBe(0);
  });
});
