/**
 * The routing object's decisions against real D1 (spec invariants 2 to 6): check
 * before reuse, policy on every path, first-wins conditional boundaries, newest row
 * decides, and alarm-driven expiry.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  HOUR,
  MINUTE,
  T0,
  adminFetch,
  alarmOf,
  captureFetch,
  eventsOf,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";

const IDLE_60 = JSON.stringify({ mode: "idle", idle_minutes: 60 });

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: "", HOOK_SECRET: "" });
});
afterEach(() => {
  restoreClock();
  useConfig(null);
});

const sql = (query: string, ...params: unknown[]) =>
  env.DB.prepare(query)
    .bind(...params)
    .run();
const forget = (key: string) => adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
const routeView = async (key: string) =>
  (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json() as Promise<any>;

describe("check before reuse (invariant 2)", () => {
  it("reopens a row ended out of band as agent_close: same id, transcript kept", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await sql(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`, T0, first.body.session_id);
    setNow(T0 + 5 * MINUTE);
    const second = await send({ chat_id: chat, text: "two" });
    expect(second.body.session_id).toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({
      end_reason: null,
      ended_at: null,
      last_active_at: T0 + 5 * MINUTE,
    });
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["one", "two"]);
    expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
  });

  for (const reason of ["new_command", "admin", "suspended", "cron_complete", "compression", "idle", "daily"]) {
    it(`never reuses a row ended out of band as ${reason}: a fresh session starts and the old row stays`, async () => {
      const chat = unique("chat");
      const first = await send({ chat_id: chat, text: "one" });
      await sql(`UPDATE sessions SET end_reason = ?, ended_at = ? WHERE id = ?`, reason, T0 + 1, first.body.session_id);
      setNow(T0 + MINUTE);
      const second = await send({ chat_id: chat, text: "two" });
      expect(second.status).toBe(200);
      expect(second.body.session_id).not.toBe(first.body.session_id);
      expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: reason, ended_at: T0 + 1 });
      expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["one"]);
      expect((await messagesOf(second.body.session_id)).map((m) => m.text)).toEqual(["two"]);
      const fresh = await sessionRow(second.body.session_id);
      expect(fresh).toMatchObject({
        end_reason: null,
        previous_session_id: first.body.session_id,
        reset_reason: reason,
      });
    });
  }
});

describe("policy on every path (invariant 3)", () => {
  it("live path: a message after the deadline ends the old session as idle in the same request", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "early" });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(genericKey(chat));
    setNow(T0 + 60 * MINUTE + 1);
    const late = await send({ chat_id: chat, text: "late" });
    expect(late.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({
      end_reason: "idle",
      ended_at: T0 + 60 * MINUTE + 1,
    });
    expect((await messagesOf(late.body.session_id)).map((m) => m.text)).toEqual(["late"]);
  });

  it("exactly at idle_minutes the session is still live (expired only when now > last + idle)", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    setNow(T0 + 60 * MINUTE);
    expect((await send({ chat_id: chat })).body.session_id).toBe(first.body.session_id);
  });

  it("recovery path: a forgotten entry whose newest row is idle-expired is promoted to idle, and a fresh session starts", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(key);
    expect((await forget(key)).status).toBe(200);
    setNow(T0 + 2 * HOUR);
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    expect(await sessionRow(next.body.session_id)).toMatchObject({ end_reason: null, reset_reason: "idle" });
  });

  it("recovery judges the row's real last activity: the recovered entry's last activity is the newest message's time", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    setNow(T0 + 40 * MINUTE);
    await send({ chat_id: chat });
    await forget(key);
    expect((await routeView(key)).entry).toBeNull();
    // Recovered 50 minutes later: 90 minutes after the first message, but only 50
    // after the last one, so the session is reused.
    setNow(T0 + 90 * MINUTE);
    const third = await send({ chat_id: chat });
    expect(third.body.session_id).toBe(first.body.session_id);
    const view = await routeView(key);
    expect(view.entry.last_active_at).toBe(T0 + 90 * MINUTE);
    expect(view.alarm_at).toBe(T0 + 150 * MINUTE + 1);
  });

  it("recovering never re-arms the idle clock: a recoverable row past its deadline is not reopened", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    await sql(
      `UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`,
      T0 + MINUTE,
      first.body.session_id,
    );
    await forget(genericKey(chat));
    setNow(T0 + 61 * MINUTE);
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    // Promoted to the policy reason; it keeps the time it was released.
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle", ended_at: T0 + MINUTE });
  });

  it("a last activity moved back by SQL is honoured on the next message", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(genericKey(chat));
    setNow(T0 + 10 * MINUTE);
    await sql(`UPDATE sessions SET last_active_at = ? WHERE id = ?`, T0 - 2 * HOUR, first.body.session_id);
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
  });
});

describe("boundaries are first-wins and durable (invariant 4)", () => {
  it("the alarm never overwrites an explicit end made in between", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key); // drain the hand-off
    await sql(
      `UPDATE sessions SET end_reason = 'admin', ended_at = ? WHERE id = ?`,
      T0 + MINUTE,
      first.body.session_id,
    );
    setNow(T0 + 3 * HOUR);
    expect(await runAlarm(key)).toBe(true);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "admin", ended_at: T0 + MINUTE });
  });

  it("an operator end of an ended row changes nothing", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    await sql(`UPDATE sessions SET end_reason = 'suspended', ended_at = ? WHERE id = ?`, T0 + 1, first.body.session_id);
    const response = await adminFetch(`/admin/sessions/${first.body.session_id}/end`, { method: "POST", body: "{}" });
    expect(response.status).toBe(200);
    expect(await response.json()).toMatchObject({
      changed: false,
      session: { end_reason: "suspended", ended_at: T0 + 1 },
    });
  });

  it("a durable boundary is never reopened, even if it is recent", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    await sql(`UPDATE sessions SET end_reason = 'admin', ended_at = ? WHERE id = ?`, T0, first.body.session_id);
    await forget(genericKey(chat));
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "admin" });
  });
});

describe("newest row decides (invariant 5)", () => {
  it("a newest boundary row hides an older recoverable row", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const older = await send({ chat_id: chat, text: "old" });
    await sql(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`, T0, older.body.session_id);
    setNow(T0 + MINUTE);
    const newer = await send({ chat_id: chat, text: "new" }); // reopens the older one (it is the newest)
    expect(newer.body.session_id).toBe(older.body.session_id);
    // Now make a newer boundary row and an older recoverable one.
    await sql(
      `UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`,
      T0 + MINUTE,
      older.body.session_id,
    );
    await sql(
      `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at, ended_at, end_reason)
        VALUES ('ses_boundary_${chat}', ?, 'generic', 'dm', ?, ?, ?, 'new_command')`,
      key,
      T0 + 2 * MINUTE,
      T0 + 2 * MINUTE,
      T0 + 2 * MINUTE,
    );
    await forget(key);
    setNow(T0 + 3 * MINUTE);
    const next = await send({ chat_id: chat, text: "after" });
    expect(next.body.session_id).not.toBe(older.body.session_id);
    expect(next.body.session_id).not.toBe(`ses_boundary_${chat}`);
    expect(await sessionRow(older.body.session_id)).toMatchObject({ end_reason: "agent_close" });
    expect(await sessionRow(next.body.session_id)).toMatchObject({ previous_session_id: `ses_boundary_${chat}` });
  });
});

describe("alarm-driven expiry (invariant 6)", () => {
  it("ends an idle session with no new message, and clears the alarm", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key); // hand-off and echo reply at T0
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);
    setNow(T0 + 60 * MINUTE + 1);
    expect(await runAlarm(key)).toBe(true);
    expect(await sessionRow(first.body.session_id)).toMatchObject({
      end_reason: "idle",
      ended_at: T0 + 60 * MINUTE + 1,
    });
    expect(await alarmOf(key)).toBeNull();
    expect((await routeView(key)).alarm_at).toBeNull();
  });

  it("re-checks when activity moved the deadline, and re-arms", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    setNow(T0 + 30 * MINUTE);
    await send({ chat_id: chat });
    await runAlarm(key); // the hand-off of the second message
    // The alarm may stay at the first deadline (it is earlier), never later than the real one.
    const armed = (await alarmOf(key))!;
    expect(armed).toBeLessThanOrEqual(T0 + 90 * MINUTE + 1);
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
    expect(await alarmOf(key)).toBe(T0 + 90 * MINUTE + 1);
    expect((await routeView(key)).alarm_at).toBe(T0 + 90 * MINUTE + 1);
    setNow(T0 + 90 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
  });

  it("re-checks against a last activity moved by SQL", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    await sql(`UPDATE sessions SET last_active_at = ? WHERE id = ?`, T0 + 45 * MINUTE, first.body.session_id);
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
    expect(await alarmOf(key)).toBe(T0 + 105 * MINUTE + 1);
  });

  it("promotes a recoverable session when its deadline passes, without a message", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    await sql(
      `UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`,
      T0 + MINUTE,
      first.body.session_id,
    );
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle", ended_at: T0 + MINUTE });
  });

  it("mode none never arms an alarm for the session", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }) });
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key); // only the hand-off was due
    expect(await alarmOf(key)).toBeNull();
    expect((await routeView(key)).alarm_at).toBeNull();
    setNow(T0 + 400 * 24 * HOUR);
    expect((await send({ chat_id: chat })).body.session_id).toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ sweep_at: null });
  });

  describe("daily boundaries in a zone with DST", () => {
    // America/New_York, 2031: clocks go forward on 9 March at 02:00 and back on 2 November at 02:00.
    const DAILY_NY = JSON.stringify({ mode: "daily", at_hour: 3, at_minute: 0, timezone: "America/New_York" });

    it("arms the alarm at 03:00 local after the spring change and ends the session there", async () => {
      useConfig({ SESSION_RESET: DAILY_NY });
      const chat = unique("chat");
      const key = genericKey(chat);
      const start = Date.UTC(2031, 2, 8, 17, 0); // 8 March, 12:00 EST
      setNow(start);
      const first = await send({ chat_id: chat });
      await runAlarm(key);
      const boundary = Date.UTC(2031, 2, 9, 7, 0); // 9 March, 03:00 EDT (UTC-4)
      expect((await routeView(key)).alarm_at).toBe(boundary);
      expect(await alarmOf(key)).toBe(boundary);
      setNow(boundary - 1);
      await runAlarm(key);
      expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
      setNow(boundary);
      await runAlarm(key);
      expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "daily", ended_at: boundary });
    });

    it("uses 03:00 EST after the autumn change", async () => {
      useConfig({ SESSION_RESET: DAILY_NY });
      const chat = unique("chat");
      const key = genericKey(chat);
      setNow(Date.UTC(2031, 10, 1, 16, 0)); // 1 November, 12:00 EDT
      const first = await send({ chat_id: chat });
      await runAlarm(key);
      const boundary = Date.UTC(2031, 10, 2, 8, 0); // 2 November, 03:00 EST (UTC-5)
      expect((await routeView(key)).alarm_at).toBe(boundary);
      setNow(boundary + 1);
      const next = await send({ chat_id: chat });
      expect(next.body.session_id).not.toBe(first.body.session_id);
      expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "daily" });
    });
  });
});

describe("one key, many messages at once", () => {
  it("serialises concurrent messages: one session, all stored, none twice", async () => {
    const chat = unique("chat");
    const texts = Array.from({ length: 25 }, (_, i) => `m${i}`);
    const results = await Promise.all(texts.map((text) => send({ chat_id: chat, text })));
    expect(results.every((r) => r.status === 200 && r.body.duplicate === false)).toBe(true);
    const sessionIds = new Set(results.map((r) => r.body.session_id));
    expect(sessionIds.size).toBe(1);
    const stored = await messagesOf([...sessionIds][0]!);
    expect(stored.map((m) => m.text).sort()).toEqual([...texts].sort());
    expect(stored.map((m) => m.seq)).toEqual(texts.map((_, i) => i + 1));
  });
});

describe("lifecycle events of routing", () => {
  it("writes session.ended and session.finalized once for an idle end, and session.reset for its replacement", async () => {
    useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: "https://hooks.test/a", HOOK_SECRET: "s" });
    const hooks = captureFetch(() => new Response("ok"));
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(genericKey(chat));
    setNow(T0 + 2 * HOUR);
    const next = await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    hooks.restore();
    // Delivered one session at a time, in the order the changes happened.
    expect(hooks.calls.map((c) => [c.json.type, c.json.session_id === first.body.session_id ? "old" : "new"])).toEqual([
      ["session.started", "old"],
      ["session.ended", "old"],
      ["session.finalized", "old"],
      ["session.started", "new"],
      ["session.reset", "new"],
    ]);
    const old = await eventsOf(first.body.session_id);
    expect(old.map((e) => [e.type, e.reason])).toEqual([
      ["session.started", null],
      ["session.ended", "idle"],
      ["session.finalized", "idle"],
    ]);
    // Listed (and delivered) in the order the changes happened.
    const fresh = ((await (await adminFetch(`/admin/sessions/${next.body.session_id}`)).json()) as any).events;
    expect(fresh.map((e: any) => [e.type, e.reason])).toEqual([
      ["session.started", "idle"],
      ["session.reset", "idle"],
    ]);
    expect(fresh[1].payload).toMatchObject({
      previous_session_id: first.body.session_id,
      had_activity: true,
    });
  });
});

describe("rows edited by SQL", () => {
  it("a row ended by SQL without ended_at is honoured: the next message starts fresh and the end gets its time", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await sql(`UPDATE sessions SET end_reason = 'admin' WHERE id = ?`, first.body.session_id);
    setNow(T0 + MINUTE);
    const next = await send({ chat_id: chat, text: "two" });
    expect(next.status).toBe(200);
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "admin", ended_at: T0 + MINUTE });
    const ended = (await eventsOf(first.body.session_id)).filter((e) => e.type === "session.ended");
    expect(ended).toHaveLength(1);
  });
});

describe("a recoverable row that /new replaced", () => {
  it("is still promoted by the alarm at its deadline, and finalized then", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await sql(
      `UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`,
      T0 + 1,
      first.body.session_id,
    );
    setNow(T0 + 10 * MINUTE);
    const fresh = await send({ chat_id: chat, text: "/new" });
    expect(fresh.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "agent_close" });
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle", ended_at: T0 + 1 });
    const finalized = (await eventsOf(first.body.session_id)).filter((e) => e.type === "session.finalized");
    expect(finalized.map((e) => e.reason)).toEqual(["idle"]);
    // The fresh session is untouched (its own deadline is later).
    expect(await sessionRow(fresh.body.session_id)).toMatchObject({ end_reason: null });
  });
});
