/**
 * Another writer between the gateway's read of a session and its batch (an
 * operator's SQL; spec invariants 4 and 5): the batch's conditional statements miss,
 * and the routing object reads the row again and decides again. A message never
 * lands in a session that ended under it, no end is counted that did not happen, and
 * after MAX_ROUTING_ATTEMPTS lost races the webhook gets a 503, so the platform
 * retries, with nothing stored. The writes slip in through `injectD1Fault`'s
 * `before`, which runs the test's SQL on the same D1 just before the matched batch.
 */
import { env } from "cloudflare:test";
import { afterEach, beforeEach, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { metrics } from "../../src/metrics";
import { MAX_ROUTING_ATTEMPTS } from "../../src/routing/context";
import { agentConfig, fakeServices, replyWith } from "../agent/support";
import {
  MINUTE,
  T0,
  alarmAfterRestart,
  endOtherwiseBySql,
  eventsOf,
  genericKey,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
  services = fakeServices((request) => replyWith(`re: ${request.json.message.text}`));
});
afterEach(() => {
  injectD1Fault(null);
  services.restore();
  restoreClock();
  useConfig(null);
});

/** The batch that stores a user message (every routing path writes one). */
const storesAMessage = (sql: readonly string[]) => sql.some((s) => s.includes("INSERT INTO messages"));

/** A key with one answered message, its session's id. */
async function answered(chat: string): Promise<string> {
  const first = await send({ chat_id: chat, text: "hello" });
  await runAlarm(genericKey(chat));
  return first.body.session_id as string;
}

const userTexts = async (sessionId: string) =>
  (await messagesOf(sessionId)).filter((m) => m.role === "user").map((m) => m.text);

it("a session ended by SQL (agent_close) just before a message's append: the message reopens it, stored once", async () => {
  const chat = unique("chat");
  const sessionId = await answered(chat);
  setNow(T0 + MINUTE);
  const slipped = injectD1Fault({
    match: storesAMessage,
    before: (db) =>
      db
        .prepare(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`)
        .bind(T0 + MINUTE, sessionId)
        .run(),
  });
  const sent = await send({ chat_id: chat, text: "again" });
  expect(slipped.hits()).toBe(1);
  expect(sent.status).toBe(200);
  expect(sent.body).toMatchObject({ session_id: sessionId, duplicate: false });
  expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
  expect(await userTexts(sessionId)).toEqual(["hello", "again"]);
  expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
});

it("an expired session whose activity another writer moved just before the batch ending it: the message joins it, no end counted", async () => {
  const chat = unique("chat");
  const sessionId = await answered(chat);
  // Past the 60-minute idle deadline: the message would end the session and start a fresh one.
  const later = T0 + 61 * MINUTE;
  setNow(later);
  const idleEnds = metrics.sessions_ended.idle ?? 0;
  // Just before the batch that would end it (the steady append before it missed, the row being expired).
  const slipped = injectD1Fault({
    match: (sql) => storesAMessage(sql) && sql.some((s) => s.includes("SET end_reason = ?, ended_at = COALESCE")),
    before: (db) => db.prepare(`UPDATE sessions SET last_active_at = ? WHERE id = ?`).bind(later, sessionId).run(),
  });
  const sent = await send({ chat_id: chat, text: "still here" });
  expect(slipped.hits()).toBe(1);
  expect(sent.body).toMatchObject({ session_id: sessionId, duplicate: false });
  expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
  expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
  expect(metrics.sessions_ended.idle ?? 0).toBe(idleEnds);
  expect(await userTexts(sessionId)).toEqual(["hello", "still here"]);
});

it("a message that loses the race MAX_ROUTING_ATTEMPTS times is a 503 that says so, with nothing stored; the platform's retry lands once", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const sessionId = await answered(chat);
  setNow(T0 + MINUTE);
  // Every batch finds the row ended otherwise than its read said: recoverable, then not, and so on.
  const slipped = injectD1Fault({
    match: storesAMessage,
    times: Infinity,
    before: endOtherwiseBySql(sessionId, T0 + MINUTE),
  });
  const failed = await send({ chat_id: chat, text: "lost" });
  // The steady path's append, then one batch per attempt.
  expect(slipped.hits()).toBe(1 + MAX_ROUTING_ATTEMPTS);
  expect(failed).toMatchObject({
    status: 503,
    body: {
      error: { message: expect.stringContaining(`routing did not settle after ${MAX_ROUTING_ATTEMPTS} attempts`) },
    },
  });
  const stored = await env.DB.prepare(
    `SELECT COUNT(*) AS n FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.session_key = ? AND m.text = 'lost'`,
  )
    .bind(key)
    .first<{ n: number }>();
  expect(stored?.n).toBe(0);
  // Nothing of it was stored, so no hand-off of it is left to confirm.
  expect(await router(key).outbox()).toEqual([]);
  injectD1Fault(null);
  const retried = await send({ chat_id: chat, text: "lost", event_id: failed.eventId });
  expect(retried.status).toBe(200);
  await runAlarm(key);
  expect(services.agentCalls().map((c) => c.json.message.text)).toEqual(["hello", "lost"]);
});

it("a newer session of the key written just before a fresh session's insert: the message lands in it, the key keeps one live row", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const expired = await answered(chat);
  const later = T0 + 61 * MINUTE;
  setNow(later);
  // What a routing object killed after D1 stored a session, before its entry learnt it, leaves behind.
  const newer = unique("ses");
  const slipped = injectD1Fault({
    match: (sql) => storesAMessage(sql) && sql.some((s) => s.includes("INSERT INTO sessions")),
    before: (db) =>
      db
        .prepare(
          `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at, message_count)
            VALUES (?, ?, 'generic', 'dm', ?, ?, 0)`,
        )
        .bind(newer, key, later, later)
        .run(),
  });
  const sent = await send({ chat_id: chat, text: "after a while" });
  expect(slipped.hits()).toBe(1);
  expect(sent).toMatchObject({ status: 200, body: { session_id: newer } });
  expect((await sessionsOfKey(key)).map((row) => [row.id, row.end_reason])).toEqual([
    [expired, "idle"],
    [newer, null],
  ]);
  expect(await userTexts(newer)).toEqual(["after a while"]);
});

it("a durable end written by SQL before the deadline is found by the next look (a restart's alarm): ended and finalized at once", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const sessionId = await answered(chat);
  setNow(T0 + MINUTE);
  await env.DB.prepare(`UPDATE sessions SET end_reason = 'admin', ended_at = ? WHERE id = ?`)
    .bind(T0 + MINUTE, sessionId)
    .run();
  // A fresh instance knows no deadline, so its alarm reads the row, 59 minutes before the old deadline.
  await alarmAfterRestart(key);
  expect((await eventsOf(sessionId)).map((e) => e.type)).toEqual([
    "session.started",
    "session.ended",
    "session.finalized",
  ]);
  expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "admin", sweep_at: null });
});
