/**
 * `POST /webhooks/generic`: verification, validation and spec invariants 1 and 9
 * at the front door. Bad input gets a 4xx and writes nothing.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { WEBHOOK_MAX_BYTES } from "../../src/routes/webhooks";
import {
  BASE,
  adminFetch,
  genericKey,
  messagesOf,
  restoreClock,
  router,
  send,
  sessionsOfKey,
  setNow,
  signedRequest,
  T0,
  unique,
  useConfig,
  tableCounts,
} from "../helpers";

beforeEach(() => setNow(T0));
afterEach(() => {
  restoreClock();
  useConfig(null);
});

function payload(chatId: string, extra: Record<string, unknown> = {}) {
  return JSON.stringify({
    event_id: unique("evt"),
    chat_id: chatId,
    chat_type: "dm",
    user_id: "u1",
    text: "hi",
    ...extra,
  });
}

describe("accepted messages", () => {
  it("stores the message in a new live session and answers 200 with its id", async () => {
    const chat = unique("chat");
    const { status, body } = await send({ chat_id: chat, text: "hello there" });
    expect(status).toBe(200);
    expect(body).toEqual({ accepted: true, session_id: expect.stringMatching(/^ses_/), duplicate: false });
    const [session] = await sessionsOfKey(genericKey(chat));
    expect(session).toMatchObject({
      id: body.session_id,
      end_reason: null,
      ended_at: null,
      started_at: T0,
      last_active_at: T0,
    });
    const messages = await messagesOf(body.session_id);
    expect(messages.map((m) => [m.role, m.text, m.created_at])).toEqual([["user", "hello there", T0]]);
  });

  it("builds the key from chat type, thread and user as the spec says", async () => {
    const chat = unique("grp");
    await send({ chat_id: chat, chat_type: "group", user_id: "u:9", thread_id: "t1" });
    expect(await sessionsOfKey(`generic:group:${chat}:t1:u%3A9`)).toHaveLength(1);
    useConfig({ GROUP_SESSIONS_PER_USER: "false" });
    await send({ chat_id: chat, chat_type: "group", user_id: "u2" });
    expect(await sessionsOfKey(`generic:group:${chat}`)).toHaveLength(1);
  });

  it("accepts numeric ids as strings", async () => {
    const chat = `${Date.now()}${Math.floor(Math.random() * 1000)}`;
    const response = await exports.default.fetch(
      await signedRequest(
        JSON.stringify({ event_id: 42, chat_id: Number(chat), chat_type: "dm", user_id: 7, text: "n" }),
      ),
    );
    expect(response.status).toBe(200);
    expect(await sessionsOfKey(`generic:dm:${chat}`)).toHaveLength(1);
  });
});

describe("bad input gets a 4xx and writes nothing", () => {
  // The message an operator reads: exact where the gateway writes it, else any text.
  const SIGNATURE = "missing or invalid X-Signature-256";
  const cases: [string, () => Promise<Request>, number, string, (string | RegExp)?][] = [
    [
      "a missing signature",
      async () =>
        new Request(`${BASE}/webhooks/generic`, {
          method: "POST",
          body: payload(unique("c")),
          headers: { "content-type": "application/json" },
        }),
      401,
      "bad_signature",
      SIGNATURE,
    ],
    [
      "a signature made with another secret",
      async () => signedRequest(payload(unique("c")), "not-the-secret"),
      401,
      "bad_signature",
      SIGNATURE,
    ],
    [
      "a signature of other bytes",
      async () => {
        const body = payload(unique("c"));
        const request = await signedRequest(body);
        return new Request(request, { body: body.replace("hi", "ho") });
      },
      401,
      "bad_signature",
      SIGNATURE,
    ],
    [
      "a malformed signature header",
      async () =>
        new Request(`${BASE}/webhooks/generic`, {
          method: "POST",
          body: payload(unique("c")),
          headers: { "x-signature-256": "sha256=zz" },
        }),
      401,
      "bad_signature",
      SIGNATURE,
    ],
    [
      "malformed JSON, correctly signed",
      async () => signedRequest(`{"event_id": "e1", "chat_id": `),
      400,
      "invalid_json",
      "body is not valid JSON",
    ],
    // The first failing field is named; a body that is no object at all is "body".
    ["a JSON array, correctly signed", async () => signedRequest(`[1, 2]`), 400, "invalid_body", /^body: /],
    [
      "an unknown chat type",
      async () => signedRequest(payload(unique("c"), { chat_type: "room" })),
      400,
      "invalid_body",
      /^chat_type: ./,
    ],
    ["a missing text", async () => signedRequest(payload(unique("c"), { text: undefined })), 400, "invalid_body"],
    ["an empty text", async () => signedRequest(payload(unique("c"), { text: "" })), 400, "invalid_body"],
    [
      "a body over the size limit",
      async () => signedRequest(payload(unique("c"), { text: "x".repeat(WEBHOOK_MAX_BYTES) })),
      413,
      "payload_too_large",
    ],
  ];

  for (const [name, build, status, code, message = expect.any(String)] of cases) {
    it(`refuses ${name} with ${status}`, async () => {
      const before = await tableCounts();
      const response = await exports.default.fetch(await build());
      expect(response.status).toBe(status);
      expect(await response.json()).toEqual({
        error: { code, message: message instanceof RegExp ? expect.stringMatching(message) : message },
      });
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("answers 404 while GENERIC_WEBHOOK_SECRET is unset", async () => {
    useConfig({ GENERIC_WEBHOOK_SECRET: "" });
    const before = await tableCounts();
    const response = await exports.default.fetch(await signedRequest(payload(unique("c"))));
    expect(response.status).toBe(404);
    expect(await tableCounts()).toEqual(before);
  });

  it("answers 500 naming the key when the configuration is invalid", async () => {
    useConfig({ SESSION_RESET: `{"mode": "sometimes"}` });
    const before = await tableCounts();
    const response = await exports.default.fetch(await signedRequest(payload(unique("c"))));
    expect(response.status).toBe(500);
    const body = (await response.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("invalid_config");
    expect(body.error.message).toContain("SESSION_RESET.mode");
    expect(await tableCounts()).toEqual(before);
  });
});

describe("idempotent ingress (invariant 9)", () => {
  it("stores a retried event once and answers duplicate: true with the same session", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "once" });
    const retry = await send({ chat_id: chat, text: "once", event_id: first.eventId });
    expect(retry.status).toBe(200);
    expect(retry.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(await messagesOf(first.body.session_id)).toHaveLength(1);
    // One hand-off staged, not two: a retry makes no second turn.
    const runs = (await router(genericKey(chat)).outbox()).filter((item) => item.kind === "run");
    expect(runs).toHaveLength(1);
  });

  it("remembers event ids after the routing entry is forgotten", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    const forgotten = await adminFetch(`/admin/routes/${encodeURIComponent(genericKey(chat))}`, { method: "DELETE" });
    expect(forgotten.status).toBe(200);
    const retry = await send({ chat_id: chat, event_id: first.eventId });
    expect(retry.body.duplicate).toBe(true);
    expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
    expect(await messagesOf(first.body.session_id)).toHaveLength(1);
  });

  it("remembers event ids for at least 24 hours, even across a session reset", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    setNow(T0 + 23 * 60 * 60_000 + 59 * 60_000);
    const retry = await send({ chat_id: chat, event_id: first.eventId });
    expect(retry.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
  });

  it("remembers event ids per platform: the same id from another chat is the same event", async () => {
    const eventId = unique("evt");
    const a = await send({ chat_id: unique("a"), event_id: eventId });
    const b = await send({ chat_id: unique("b"), event_id: eventId });
    expect(a.body.duplicate).toBe(false);
    expect(b.body).toEqual({ accepted: true, session_id: a.body.session_id, duplicate: true });
    expect(await messagesOf(a.body.session_id)).toHaveLength(1);
  });

  it("keeps platforms apart: the same id on another platform is a new event", async () => {
    useConfig({ TELEGRAM_BOT_TOKEN: "123:abc", TELEGRAM_WEBHOOK_SECRET: "tg-secret" });
    const updateId = 700_000_000 + Math.floor(Math.random() * 1_000_000);
    const generic = await send({ chat_id: unique("a"), event_id: String(updateId) });
    const chatId = 900_000_000 + Math.floor(Math.random() * 1_000_000);
    const telegram = await exports.default.fetch(
      new Request(`${BASE}/webhooks/telegram`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": "tg-secret" },
        body: JSON.stringify({
          update_id: updateId,
          message: {
            message_id: 1,
            date: 1_900_000_000,
            chat: { id: chatId, type: "private" },
            from: { id: chatId, is_bot: false, first_name: "A" },
            text: "hi",
          },
        }),
      }),
    );
    expect(generic.body.duplicate).toBe(false);
    expect(telegram.status).toBe(200);
    expect(await sessionsOfKey(`telegram:dm:${chatId}`)).toHaveLength(1);
  });
});

describe("no silent drop (invariant 1)", () => {
  it("answers 503 when D1 fails, stores nothing, and stores the retry exactly once", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "before" });
    await env.DB.exec("ALTER TABLE messages RENAME TO messages_away");
    let failed;
    try {
      failed = await send({ chat_id: chat, text: "during" });
    } finally {
      await env.DB.exec("ALTER TABLE messages_away RENAME TO messages");
    }
    expect(failed.status).toBe(503);
    expect(failed.body.error.code).toBe("unavailable");
    // The platform (or the person reading its log) is told it may retry, and why.
    expect(failed.body.error.message).toMatch(/^storage unavailable, retry later \(.*messages/);
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["before"]);
    // The failed attempt left no dedupe mark and no staged hand-off behind.
    const mark = await env.DB.prepare(`SELECT 1 FROM inbound_events WHERE event_id = ?`).bind(failed.eventId).first();
    expect(mark).toBeNull();
    expect((await router(genericKey(chat)).outbox()).filter((i) => i.kind === "run")).toHaveLength(1);

    const retry = await send({ chat_id: chat, text: "during", event_id: failed.eventId });
    expect(retry.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: false });
    const again = await send({ chat_id: chat, text: "during", event_id: failed.eventId });
    expect(again.body.duplicate).toBe(true);
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["before", "during"]);
  });

  it("answers 503 when a new session cannot be created, and creates nothing", async () => {
    const chat = unique("chat");
    await env.DB.exec("ALTER TABLE messages RENAME TO messages_away");
    let failed;
    try {
      failed = await send({ chat_id: chat });
    } finally {
      await env.DB.exec("ALTER TABLE messages_away RENAME TO messages");
    }
    expect(failed.status).toBe(503);
    expect(await sessionsOfKey(genericKey(chat))).toEqual([]);
    expect(await router(genericKey(chat)).outbox()).toEqual([]);
  });
});

it("signs with HMAC-SHA256 of the raw bytes (a re-serialised body does not verify)", async () => {
  const body = `{"event_id":"${unique("e")}", "chat_id":"${unique("c")}","chat_type":"dm","user_id":"u","text":"spaced"}`;
  const signature = await hmacSha256Hex("test-generic-secret", JSON.stringify(JSON.parse(body)));
  const response = await exports.default.fetch(
    new Request(`${BASE}/webhooks/generic`, {
      method: "POST",
      body,
      headers: { "x-signature-256": `sha256=${signature}` },
    }),
  );
  expect(response.status).toBe(401);
});

it("treats an empty thread_id as no thread", async () => {
  const chat = unique("chat");
  const sent = await send({ chat_id: chat, thread_id: "" });
  expect(sent.status).toBe(200);
  expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
});
