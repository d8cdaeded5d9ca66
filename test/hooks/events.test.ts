/**
 * Lifecycle event delivery (spec "Lifecycle events" and invariant 7): every URL in
 * HOOK_URLS receives each event as a signed JSON POST, at least once, with the same
 * id on every attempt; failures are retried with backoff, only towards the hooks
 * that failed; a dead-lettered event can be put back by the operator; the
 * transcript of `session.finalized` is bounded; without HOOK_URLS nothing is sent.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EVENT_MAX_ATTEMPTS } from "../../src/hooks/deliver";
import { TRANSCRIPT_MAX_BYTES, TRANSCRIPT_MAX_MESSAGES } from "../../src/hooks/transcript";
import { backoffDelay } from "../../src/http/backoff";
import { SWEEP_GRACE_MS, sweep } from "../../src/sweep";
import {
  MINUTE,
  T0,
  adminFetch,
  alarmOf,
  captureFetch,
  eventsOf,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const HOOK_A = "https://hooks.test/a";
const HOOK_B = "https://hooks-b.test/b";
const SECRET = "hook-secret-for-tests";
const IDLE_60 = JSON.stringify({ mode: "idle", idle_minutes: 60 });

/** Per test: how each hook answers (default 200), and every request that left the isolate. */
let answer: (request: Captured) => Response;
let outbound: { calls: Captured[]; restore: () => void } | null = null;
let unexpected: string[] = [];

function captureHooks(urls: string[]): Captured[] {
  unexpected = [];
  outbound = captureFetch((request) => {
    if (!urls.includes(request.url)) {
      unexpected.push(request.url);
      throw new Error(`unexpected outbound request to ${request.url}`);
    }
    return answer(request);
  });
  return outbound.calls;
}

beforeEach(() => {
  setNow(T0);
  answer = () => new Response("ok");
  useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: `${HOOK_A},${HOOK_B}`, HOOK_SECRET: SECRET });
});
afterEach(() => {
  outbound?.restore();
  outbound = null;
  restoreClock();
  useConfig(null);
  expect(unexpected).toEqual([]);
});

const encoder = new TextEncoder();

/** HMAC-SHA256 of `body` with `secret`, hex, computed here independently of src/crypto. */
async function hmacHex(secret: string, body: string): Promise<string> {
  const key = await crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  const mac = await crypto.subtle.sign("HMAC", key, encoder.encode(body));
  return Array.from(new Uint8Array(mac), (b) => b.toString(16).padStart(2, "0")).join("");
}

const ofType = (calls: Captured[], type: string, sessionId: string) =>
  calls.filter((c) => c.json?.type === type && c.json?.session_id === sessionId);

const sql = (query: string, ...params: unknown[]) =>
  env.DB.prepare(query)
    .bind(...params)
    .run();

async function eventRow(id: string) {
  return env.DB.prepare(`SELECT * FROM events WHERE id = ?`)
    .bind(id)
    .first<{ id: string; status: string; attempts: number; next_attempt_at: number | null; delivered_to: string }>();
}

describe("delivery to every hook URL", () => {
  it("POSTs session.started as signed JSON to each hook URL, with X-Sessiongate-Event equal to the id", async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hi" });
    const sessionId = sent.body.session_id;
    expect(calls).toHaveLength(0); // nothing leaves before the alarm
    await runAlarm(key);

    const started = ofType(calls, "session.started", sessionId);
    expect(started.map((c) => c.url).sort()).toEqual([HOOK_A, HOOK_B].sort());
    for (const call of started) {
      expect(call.method).toBe("POST");
      expect(call.headers["content-type"]).toContain("application/json");
      expect(call.json).toMatchObject({
        id: `ev_${sessionId}_started`,
        type: "session.started",
        session_id: sessionId,
        session_key: key,
        reason: null,
        occurred_at: T0,
        parent_session_id: null,
      });
      expect(call.headers["x-sessiongate-event"]).toBe(call.json.id);
      expect(call.headers["x-sessiongate-signature"]).toBe(`sha256=${await hmacHex(SECRET, call.body)}`);
    }
    // Both hooks got the same bytes.
    expect(started[0]!.body).toBe(started[1]!.body);
    // A signature made with another secret does not match.
    expect(started[0]!.headers["x-sessiongate-signature"]).not.toBe(
      `sha256=${await hmacHex("another-secret", started[0]!.body)}`,
    );
    expect(await eventRow(`ev_${sessionId}_started`)).toMatchObject({ status: "sent", attempts: 1 });
  });

  it("an idle reset delivers session.ended and session.finalized (transcript oldest first) of the old session, and session.reset of the new one", async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    const oldId = first.body.session_id;
    setNow(T0 + 1_000);
    await runAlarm(key); // echo reply at T0 + 1 s
    setNow(T0 + 2 * MINUTE);
    await send({ chat_id: chat, text: "two" });
    setNow(T0 + 3 * MINUTE);
    await runAlarm(key); // echo reply at T0 + 3 min

    const resetAt = T0 + 3 * MINUTE + 61 * MINUTE;
    setNow(resetAt);
    const next = await send({ chat_id: chat, text: "three" });
    const newId = next.body.session_id;
    expect(newId).not.toBe(oldId);
    await runAlarm(key);

    for (const url of [HOOK_A, HOOK_B]) {
      const toHook = calls.filter((c) => c.url === url);
      const ended = ofType(toHook, "session.ended", oldId);
      expect(ended).toHaveLength(1);
      expect(ended[0]!.json).toMatchObject({
        type: "session.ended",
        session_id: oldId,
        session_key: key,
        reason: "idle",
        occurred_at: resetAt,
      });
      expect(ended[0]!.headers["x-sessiongate-event"]).toBe(ended[0]!.json.id);

      const finalized = ofType(toHook, "session.finalized", oldId);
      expect(finalized).toHaveLength(1);
      const body = finalized[0]!.json;
      expect(body).toMatchObject({
        id: `ev_${oldId}_finalized`,
        type: "session.finalized",
        session_id: oldId,
        session_key: key,
        reason: "idle",
        occurred_at: resetAt,
        truncated: false,
      });
      expect(body.transcript).toEqual([
        { role: "user", text: "one", at: T0, attachments: [] },
        { role: "assistant", text: "echo: one", at: T0 + 1_000, attachments: [] },
        { role: "user", text: "two", at: T0 + 2 * MINUTE, attachments: [] },
        { role: "assistant", text: "echo: two", at: T0 + 3 * MINUTE, attachments: [] },
      ]);
      expect(finalized[0]!.headers["x-sessiongate-event"]).toBe(body.id);
      expect(finalized[0]!.headers["x-sessiongate-signature"]).toBe(
        `sha256=${await hmacHex(SECRET, finalized[0]!.body)}`,
      );

      const reset = ofType(toHook, "session.reset", newId);
      expect(reset).toHaveLength(1);
      expect(reset[0]!.json).toMatchObject({
        id: `ev_${newId}_reset`,
        type: "session.reset",
        session_id: newId,
        session_key: key,
        reason: "idle",
        occurred_at: resetAt,
        previous_session_id: oldId,
        had_activity: true,
      });
      expect(reset[0]!.headers["x-sessiongate-signature"]).toBe(`sha256=${await hmacHex(SECRET, reset[0]!.body)}`);
    }
    // The new session's started event names no parent (a reset is not a rotation).
    expect(ofType(calls, "session.started", newId)[0]!.json).toMatchObject({ parent_session_id: null });
  });

  it("session.reset after /new of an empty session says had_activity false", async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "/new" }); // a live, empty session
    const second = await send({ chat_id: chat, text: "/new" });
    expect(second.body.session_id).not.toBe(first.body.session_id);
    await runAlarm(key);
    const reset = ofType(calls, "session.reset", second.body.session_id);
    expect(reset).toHaveLength(2);
    expect(reset[0]!.json).toMatchObject({
      reason: "new_command",
      previous_session_id: first.body.session_id,
      had_activity: false,
    });
  });
});

describe("retries", () => {
  it("a receiver that fails twice gets the event exactly once successfully, with the same id on all three attempts", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK_A, HOOK_SECRET: SECRET });
    let failuresLeft = 2;
    const statuses: number[] = [];
    answer = () => {
      const status = failuresLeft-- > 0 ? 500 : 200;
      statuses.push(status);
      return new Response(status === 200 ? "ok" : "boom", { status });
    };
    const calls = captureHooks([HOOK_A]);
    const sent = await send({ chat_id: chat });
    const eventId = `ev_${sent.body.session_id}_started`;

    await runAlarm(key); // attempt 1 at T0: 500
    expect(calls).toHaveLength(1);
    expect(await eventRow(eventId)).toMatchObject({ status: "pending", attempts: 1, next_attempt_at: T0 + 1_000 });
    // The alarm comes back for the retry, not before.
    expect(await alarmOf(key)).toBe(T0 + 1_000);

    setNow(T0 + 999); // not due yet: nothing is sent
    await runAlarm(key);
    expect(calls).toHaveLength(1);

    setNow(T0 + 1_000); // attempt 2: 500, next in 2 s
    await runAlarm(key);
    expect(calls).toHaveLength(2);
    expect(await eventRow(eventId)).toMatchObject({ status: "pending", attempts: 2, next_attempt_at: T0 + 3_000 });

    setNow(T0 + 3_000); // attempt 3: 200
    await runAlarm(key);
    expect(calls).toHaveLength(3);
    expect(statuses).toEqual([500, 500, 200]);
    expect(calls.map((c) => c.headers["x-sessiongate-event"])).toEqual([eventId, eventId, eventId]);
    expect(calls.map((c) => c.json.id)).toEqual([eventId, eventId, eventId]);
    // The same bytes every time, each signed.
    expect(new Set(calls.map((c) => c.body)).size).toBe(1);
    expect(calls[2]!.headers["x-sessiongate-signature"]).toBe(`sha256=${await hmacHex(SECRET, calls[2]!.body)}`);
    expect(await eventRow(eventId)).toMatchObject({ status: "sent", attempts: 3, next_attempt_at: null });
    // Nothing is owed any more: the object keeps no events work, and its alarm waits for the session's deadline.
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual([]);
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);

    // Nothing more: later alarms and the sweep leave a sent event alone.
    setNow(T0 + 10 * MINUTE);
    await runAlarm(key);
    await sweep(env, Date.now());
    expect(calls).toHaveLength(3);
  });

  it("a network error (no answer at all) is retried with the same id, after the backoff", async () => {
    useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK_A, HOOK_SECRET: SECRET });
    let down = true;
    answer = () => {
      if (down) throw new TypeError("network connection lost");
      return new Response("ok");
    };
    const calls = captureHooks([HOOK_A]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    const eventId = `ev_${sent.body.session_id}_started`;
    await runAlarm(key);
    expect(await eventRow(eventId)).toMatchObject({
      status: "pending",
      attempts: 1,
      next_attempt_at: T0 + backoffDelay(1),
    });
    down = false;
    setNow(T0 + backoffDelay(1));
    await runAlarm(key);
    expect(calls.map((c) => c.headers["x-sessiongate-event"])).toEqual([eventId, eventId]);
    expect(await eventRow(eventId)).toMatchObject({ status: "sent", attempts: 2 });
  });

  it("with two hook URLs of which one fails, only the failing one is retried", async () => {
    let bFailures = 1;
    answer = (request) => {
      if (request.url === HOOK_B && bFailures-- > 0) return new Response("down", { status: 503 });
      return new Response("ok");
    };
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    const eventId = `ev_${sent.body.session_id}_started`;
    await runAlarm(key);
    expect(calls.map((c) => c.url).sort()).toEqual([HOOK_A, HOOK_B].sort());
    const row = await eventRow(eventId);
    expect(row).toMatchObject({ status: "pending", attempts: 1 });
    expect(JSON.parse(row!.delivered_to)).toEqual([HOOK_A]);

    setNow(T0 + 1_000);
    await runAlarm(key);
    const toA = calls.filter((c) => c.url === HOOK_A);
    const toB = calls.filter((c) => c.url === HOOK_B);
    expect(toA).toHaveLength(1);
    expect(toB).toHaveLength(2);
    expect(toB.map((c) => c.headers["x-sessiongate-event"])).toEqual([eventId, eventId]);
    expect(await eventRow(eventId)).toMatchObject({ status: "sent", attempts: 2 });
    expect(JSON.parse((await eventRow(eventId))!.delivered_to).sort()).toEqual([HOOK_A, HOOK_B].sort());
  });

  describe("dead letter", () => {
    /** Fails every attempt of the session's started event until it is dead-lettered; returns its id. */
    async function deadLetter(calls: Captured[], key: string, sessionId: string): Promise<string> {
      const eventId = `ev_${sessionId}_started`;
      await runAlarm(key);
      for (let attempt = 2; attempt <= EVENT_MAX_ATTEMPTS; attempt++) {
        const row = await eventRow(eventId);
        expect(row).toMatchObject({ status: "pending", attempts: attempt - 1 });
        setNow(row!.next_attempt_at!);
        await runAlarm(key);
      }
      expect(await eventRow(eventId)).toMatchObject({
        status: "failed",
        attempts: EVENT_MAX_ATTEMPTS,
        next_attempt_at: null,
      });
      expect(calls.filter((c) => c.json?.id === eventId)).toHaveLength(EVENT_MAX_ATTEMPTS);
      return eventId;
    }

    it(`after ${EVENT_MAX_ATTEMPTS} failures the event is failed and no longer attempted`, async () => {
      useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK_A, HOOK_SECRET: SECRET });
      answer = () => new Response("down", { status: 500 });
      const calls = captureHooks([HOOK_A]);
      const chat = unique("chat");
      const key = genericKey(chat);
      const sent = await send({ chat_id: chat });
      const eventId = await deadLetter(calls, key, sent.body.session_id);
      // Later alarms (the session's idle end writes new events) and the sweep leave it alone.
      setNow(Date.now() + 2 * 60 * MINUTE);
      await runAlarm(key);
      expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
      expect(ofType(calls, "session.finalized", sent.body.session_id)).toHaveLength(1);
      await sweep(env, Date.now() + SWEEP_GRACE_MS);
      await runAlarm(key);
      expect(calls.filter((c) => c.json?.id === eventId)).toHaveLength(EVENT_MAX_ATTEMPTS);
      expect(await eventRow(eventId)).toMatchObject({ status: "failed", attempts: EVENT_MAX_ATTEMPTS });
    });

    it("POST /admin/events/{id}/retry puts a failed event back and the sweep delivers it", async () => {
      useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK_A, HOOK_SECRET: SECRET });
      let up = false;
      answer = () => (up ? new Response("ok") : new Response("down", { status: 500 }));
      const calls = captureHooks([HOOK_A]);
      const chat = unique("chat");
      const key = genericKey(chat);
      const sent = await send({ chat_id: chat });
      const eventId = await deadLetter(calls, key, sent.body.session_id);

      up = true;
      const unauthorised = await adminFetch(`/admin/events/${eventId}/retry`, {
        method: "POST",
        headers: { authorization: "Bearer wrong" },
      });
      expect(unauthorised.status).toBe(401);
      expect(await eventRow(eventId)).toMatchObject({ status: "failed" });

      const retriedAt = Date.now();
      const retry = await adminFetch(`/admin/events/${eventId}/retry`, { method: "POST" });
      expect(retry.status).toBe(200);
      // The event as it now stands.
      expect(((await retry.json()) as any).event).toMatchObject({ id: eventId, status: "pending", attempts: 0 });
      expect(await eventRow(eventId)).toMatchObject({ status: "pending", attempts: 0, next_attempt_at: retriedAt });

      setNow(retriedAt + SWEEP_GRACE_MS);
      await sweep(env, Date.now());
      const delivered = calls.filter((c) => c.json?.id === eventId);
      expect(delivered).toHaveLength(EVENT_MAX_ATTEMPTS + 1);
      expect(delivered.at(-1)!.headers["x-sessiongate-event"]).toBe(eventId);
      expect(delivered.at(-1)!.headers["x-sessiongate-signature"]).toBe(
        `sha256=${await hmacHex(SECRET, delivered.at(-1)!.body)}`,
      );
      expect(await eventRow(eventId)).toMatchObject({ status: "sent", attempts: 1 });

      // Delivered once: neither the alarm nor another sweep sends it again.
      await runAlarm(key);
      await sweep(env, Date.now() + SWEEP_GRACE_MS);
      expect(calls.filter((c) => c.json?.id === eventId)).toHaveLength(EVENT_MAX_ATTEMPTS + 1);
    });

    it("a retried event is delivered without waiting for the Cron Trigger (the routing object's alarm)", async () => {
      useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK_A, HOOK_SECRET: SECRET });
      let up = false;
      answer = () => (up ? new Response("ok") : new Response("down", { status: 500 }));
      const calls = captureHooks([HOOK_A]);
      const chat = unique("chat");
      const key = genericKey(chat);
      const sent = await send({ chat_id: chat });
      const eventId = await deadLetter(calls, key, sent.body.session_id);

      up = true;
      const retry = await adminFetch(`/admin/events/${eventId}/retry`, { method: "POST" });
      expect(retry.status).toBe(200);
      // Spec: retries of event deliveries never wait on the Cron Trigger alone. Within
      // the first backoff steps, the gateway itself (the routing object) delivers it.
      setNow(Date.now() + 3_000);
      await runAlarm(key);
      expect(calls.filter((c) => c.json?.id === eventId)).toHaveLength(EVENT_MAX_ATTEMPTS + 1);
      expect(await eventRow(eventId)).toMatchObject({ status: "sent" });
    });

    it("retry of an already sent event is a 409 and of an unknown one a 404", async () => {
      const calls = captureHooks([HOOK_A, HOOK_B]);
      const chat = unique("chat");
      const sent = await send({ chat_id: chat });
      await runAlarm(genericKey(chat));
      const eventId = `ev_${sent.body.session_id}_started`;
      expect(await eventRow(eventId)).toMatchObject({ status: "sent" });
      expect((await adminFetch(`/admin/events/${eventId}/retry`, { method: "POST" })).status).toBe(409);
      expect((await adminFetch(`/admin/events/${unique("ev_nope")}/retry`, { method: "POST" })).status).toBe(404);
      expect(await eventRow(eventId)).toMatchObject({ status: "sent", attempts: 1 });
      expect(ofType(calls, "session.started", sent.body.session_id)).toHaveLength(2);
    });
  });
});

describe("the transcript bound", () => {
  /** Adds `count` messages after the session's current ones by SQL, keeping message_count and last_active_at consistent. */
  async function addMessages(sessionId: string, count: number, text: (i: number) => string, firstAt: number) {
    const row = (await sessionRow(sessionId))!;
    const statements = [];
    for (let i = 1; i <= count; i++) {
      statements.push(
        env.DB.prepare(`INSERT INTO messages (session_id, seq, role, text, created_at) VALUES (?, ?, ?, ?, ?)`).bind(
          sessionId,
          row.message_count + i,
          i % 2 === 1 ? "user" : "assistant",
          text(i),
          firstAt + i,
        ),
      );
    }
    for (let i = 0; i < statements.length; i += 100) await env.DB.batch(statements.slice(i, i + 100));
    await sql(
      `UPDATE sessions SET message_count = message_count + ?, last_active_at = ? WHERE id = ?`,
      count,
      firstAt + count,
      sessionId,
    );
  }

  async function finalizeByOperator(calls: Captured[], key: string, sessionId: string) {
    const end = await adminFetch(`/admin/sessions/${sessionId}/end`, { method: "POST", body: "{}" });
    expect(end.status).toBe(200);
    await runAlarm(key);
    const finalized = ofType(calls, "session.finalized", sessionId).filter((c) => c.url === HOOK_A);
    expect(finalized).toHaveLength(1);
    return finalized[0]!;
  }

  it(`keeps the newest ${TRANSCRIPT_MAX_MESSAGES} messages, oldest first, and says truncated when there are more`, async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "m0" });
    await runAlarm(key); // the echo reply: seq 2
    const extra = TRANSCRIPT_MAX_MESSAGES + 100;
    await addMessages(sent.body.session_id, extra, (i) => `bulk ${i}`, T0 + 1_000);
    const total = 2 + extra;
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ message_count: total });
    setNow(T0 + 5 * MINUTE);
    const call = await finalizeByOperator(calls, key, sent.body.session_id);
    const { transcript, truncated } = call.json;
    expect(truncated).toBe(true);
    expect(transcript).toHaveLength(TRANSCRIPT_MAX_MESSAGES);
    // The newest ones, oldest first: bulk 101 .. bulk 600.
    expect(transcript[0]).toEqual({
      role: "user",
      text: `bulk ${extra - TRANSCRIPT_MAX_MESSAGES + 1}`,
      at: T0 + 1_101,
      attachments: [],
    });
    expect(transcript.at(-1)).toEqual({
      role: "assistant",
      text: `bulk ${extra}`,
      at: T0 + 1_000 + extra,
      attachments: [],
    });
    const times = transcript.map((line: { at: number }) => line.at);
    expect(times).toEqual([...times].sort((a, b) => a - b));
    expect(call.headers["x-sessiongate-signature"]).toBe(`sha256=${await hmacHex(SECRET, call.body)}`);
  });

  it(`exactly ${TRANSCRIPT_MAX_MESSAGES} messages are not truncated`, async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "m0" });
    await runAlarm(key);
    await addMessages(sent.body.session_id, TRANSCRIPT_MAX_MESSAGES - 2, (i) => `bulk ${i}`, T0 + 1_000);
    setNow(T0 + 5 * MINUTE);
    const call = await finalizeByOperator(calls, key, sent.body.session_id);
    expect(call.json.truncated).toBe(false);
    expect(call.json.transcript).toHaveLength(TRANSCRIPT_MAX_MESSAGES);
    expect(call.json.transcript[0]).toEqual({ role: "user", text: "m0", at: T0, attachments: [] });
  });

  it(`keeps the newest messages within ${TRANSCRIPT_MAX_BYTES} bytes of text and says truncated`, async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "small" });
    await runAlarm(key);
    // Three messages of 100 KiB: only the newest two fit in 256 KiB.
    const big = (i: number) => String(i).repeat(100 * 1024);
    await addMessages(sent.body.session_id, 3, big, T0 + 1_000);
    setNow(T0 + 5 * MINUTE);
    const call = await finalizeByOperator(calls, key, sent.body.session_id);
    expect(call.json.truncated).toBe(true);
    expect(call.json.transcript.map((line: { text: string; at: number }) => [line.text.length, line.at])).toEqual([
      [100 * 1024, T0 + 1_002],
      [100 * 1024, T0 + 1_003],
    ]);
    expect(call.json.transcript[0].text).toBe(big(2));
    expect(call.json.transcript[1].text).toBe(big(3));
  });
});

describe("without HOOK_URLS", () => {
  it("records every event with status skipped and sends nothing", async () => {
    useConfig({ SESSION_RESET: IDLE_60 });
    const calls = captureHooks([]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const command = await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    setNow(T0 + 2 * MINUTE + 60 * MINUTE);
    await runAlarm(key); // the idle end of the empty session /new made
    await sweep(env, Date.now() + 10 * SWEEP_GRACE_MS);

    const old = await eventsOf(first.body.session_id);
    expect(old.map((e) => [e.type, e.reason, e.status]).sort()).toEqual([
      ["session.ended", "new_command", "skipped"],
      ["session.finalized", "new_command", "skipped"],
      ["session.started", null, "skipped"],
    ]);
    const fresh = await eventsOf(command.body.session_id);
    expect(fresh.map((e) => [e.type, e.reason]).sort()).toEqual([
      ["session.ended", "idle"],
      ["session.finalized", "idle"],
      ["session.reset", "new_command"],
      ["session.started", "new_command"],
    ]);
    expect(fresh.every((e) => e.status === "skipped")).toBe(true);
    const rows = await env.DB.prepare(`SELECT attempts, next_attempt_at FROM events WHERE session_id IN (?, ?)`)
      .bind(first.body.session_id, command.body.session_id)
      .all<{ attempts: number; next_attempt_at: number | null }>();
    expect(rows.results.every((r) => r.attempts === 0 && r.next_attempt_at === null)).toBe(true);
    expect(calls).toHaveLength(0);
  });
});

describe("an operator end of a row ended out of band", () => {
  it("delivers the events that end writes for a row ended by SQL with no ended_at, though the row was not changed", async () => {
    const calls = captureHooks([HOOK_A, HOOK_B]);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hi" });
    const sessionId = sent.body.session_id;
    await runAlarm(key);
    // Ended out of band, without ended_at and without its events.
    await sql(`UPDATE sessions SET end_reason = 'new_command' WHERE id = ?`, sessionId);
    setNow(T0 + MINUTE);
    const end = await adminFetch(`/admin/sessions/${sessionId}/end`, { method: "POST", body: "{}" });
    expect(end.status).toBe(200);
    expect((await end.json<any>()).changed).toBe(false);
    await runAlarm(key);
    const ended = ofType(calls, "session.ended", sessionId);
    expect(ended.map((c) => c.url).sort()).toEqual([HOOK_A, HOOK_B].sort());
    expect(ended[0]!.json).toMatchObject({ reason: "new_command", occurred_at: T0 + MINUTE });
    expect((await eventsOf(sessionId)).every((event) => event.status === "sent")).toBe(true);
  });
});
