/**
 * `POST /webhooks/telegram`: the secret token header, updates mapped to session
 * keys, dedupe on `update_id`, commands, reset notices, progress, and the exact
 * `sendMessage` calls the Bot API receives, with their retry classification.
 * Fixtures in test/fixtures/telegram are recorded-shape Bot API payloads; each test
 * gives them fresh ids, because storage is shared by the tests of this file.
 */
import type { Update } from "@grammyjs/types";
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AGENT_TOKEN, AGENT_URL, agentApi } from "../agent/support";
import anonymousAdmin from "../fixtures/telegram/anonymous-admin.json";
import blocked403 from "../fixtures/telegram/blocked-403.json";
import callbackQuery from "../fixtures/telegram/callback-query.json";
import channelPost from "../fixtures/telegram/channel-post.json";
import editedMessage from "../fixtures/telegram/edited-message.json";
import forumTopic from "../fixtures/telegram/forum-topic.json";
import groupText from "../fixtures/telegram/group-text.json";
import newChatMembers from "../fixtures/telegram/new-chat-members.json";
import privateText from "../fixtures/telegram/private-text.json";
import retry429 from "../fixtures/telegram/retry-429.json";
import sendOk from "../fixtures/telegram/send-ok.json";
import supergroupReply from "../fixtures/telegram/supergroup-reply.json";
import {
  BASE,
  HOUR,
  T0,
  captureFetch,
  messagesOf,
  restoreClock,
  runAlarm as runAlarmOnly,
  router,
  sessionsOfKey,
  setNow,
  useConfig,
  type Captured,
  tableCounts,
  deliveriesOf,
} from "../helpers";

/**
 * Runs the key's alarm and waits for the work it started: once a run shows typing,
 * the alarm no longer waits for the hand-off's drain to end (it must come back in 4 s).
 */
async function runAlarm(key: string): Promise<boolean> {
  const ran = await runAlarmOnly(key);
  await router(key).drained();
  return ran;
}
import { adapterContract, answerOf } from "./contract";

const TOKEN = "7000000001:AAtest-bot-token";
const SECRET = "tg-webhook-secret_1";
const API = "https://telegram.test";
const SEND_URL = `${API}/bot${TOKEN}/sendMessage`;

const telegramConfig = (extra: Record<string, string> = {}) => ({
  TELEGRAM_BOT_TOKEN: TOKEN,
  TELEGRAM_WEBHOOK_SECRET: SECRET,
  TELEGRAM_API_BASE: API,
  SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
  ...extra,
});

/** What the Bot API answers next; an empty queue answers 200 with a sent message. */
// Factories, not responses: a Response made in the test's context cannot be read by the
// routing object (I/O belongs to the request that made it), so each is made when asked for.
let apiAnswers: (() => Response)[];
let outbound: { calls: Captured[]; restore: () => void };
/** The agent's answer when a test configures AGENT_URL. */
let agentAnswer: () => Response;

beforeEach(() => {
  setNow(T0);
  useConfig(telegramConfig());
  apiAnswers = [];
  agentAnswer = () => new Response(null, { status: 202 });
  outbound = captureFetch((request) => {
    if (request.url === SEND_URL) return apiAnswers.shift()?.() ?? Response.json(sendOk);
    if (request.url === AGENT_URL) return agentAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

const sent = () => outbound.calls.filter((c) => c.url === SEND_URL);
const bodies = () => sent().map((c) => c.json);

let counter = 0;
/** A fresh positive id, unique within this file. */
function fresh(): number {
  counter += 1;
  return 900_000_000 + counter * 1000 + Math.floor(Math.random() * 1000);
}

/**
 * A fixture with fresh ids: the update id, the chat (negative for groups and
 * channels, as Telegram gives them), the sender and, where present, `sender_chat`.
 */
function update(fixture: object, edit: (message: any) => void = () => {}): Update & { [k: string]: any } {
  const copy = structuredClone(fixture) as any;
  copy.update_id = fresh();
  const message = copy.message ?? copy.channel_post ?? copy.edited_message ?? copy.callback_query?.message;
  if (message) {
    const chatId = message.chat.type === "private" ? fresh() : -(1_000_000_000_000 + fresh());
    const sameSender = message.sender_chat?.id === message.chat.id;
    message.chat.id = chatId;
    if (message.chat.type === "private" && message.from) message.from.id = chatId;
    else if (message.from && !message.from.is_bot) message.from.id = fresh();
    if (sameSender) message.sender_chat.id = chatId;
    edit(message);
  }
  return copy;
}

async function post(body: unknown, secret: string | null = SECRET): Promise<Response> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (secret !== null) headers["x-telegram-bot-api-secret-token"] = secret;
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/telegram`, {
      method: "POST",
      headers,
      body: typeof body === "string" ? body : JSON.stringify(body),
    }),
  );
}

const dmKey = (u: any) => `telegram:dm:${u.message.chat.id}`;

/** The one session of a key. */
async function onlySession(key: string) {
  const rows = await sessionsOfKey(key);
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

// What every adapter must do (dedupe, commands, notices, delivery retries, no silent
// drop), run with this file's requests and fake Bot API.
adapterContract({
  platform: "telegram",
  chat: () => {
    const id = fresh();
    return { key: `telegram:dm:${id}`, id };
  },
  message: (chat, text) =>
    update(privateText, (m) => {
      m.chat.id = chat.id;
      m.from.id = chat.id;
      m.text = text;
    }),
  eventId: (u) => String(u.update_id),
  post: async (u) => answerOf(await post(u)),
  accepted: {},
  commandAnswer: { in: "chat" },
  sends: () => sent().map(({ method, url, json }) => ({ method, url, json })),
  sendTo: (chat, text) => ({ method: "POST", url: SEND_URL, json: { chat_id: chat.id, text } }),
  answerNext: (...answers) => apiAnswers.push(...answers),
  failures: {
    serverErrors: [
      () => Response.json({ ok: false, error_code: 502, description: "Bad Gateway" }, { status: 502 }),
      () => new Response("upstream timeout", { status: 504 }),
    ],
    // Telegram gives the delay in the body, `parameters.retry_after` (seconds): 7 here.
    rateLimit: { answer: () => Response.json(retry429, { status: 429 }), retryAfterMs: 7_000 },
    permanent: [
      { what: "403 bot blocked by the user", answer: () => Response.json(blocked403, { status: 403 }) },
      {
        what: "400 chat not found",
        answer: () =>
          Response.json({ ok: false, error_code: 400, description: "Bad Request: chat not found" }, { status: 400 }),
      },
      {
        what: "401 unauthorized (a revoked token)",
        answer: () => Response.json({ ok: false, error_code: 401, description: "Unauthorized" }, { status: 401 }),
      },
    ],
  },
});

describe("configuration", () => {
  it("answers 404 while no Telegram secret is set, and stores nothing", async () => {
    useConfig({});
    const before = await tableCounts();
    const response = await post(update(privateText));
    expect(response.status).toBe(404);
    expect(await response.json()).toEqual({ error: { code: "not_configured", message: expect.any(String) } });
    expect(await tableCounts()).toEqual(before);
  });

  for (const [set, missing] of [
    ["TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET"],
    ["TELEGRAM_WEBHOOK_SECRET", "TELEGRAM_BOT_TOKEN"],
  ] as const) {
    it(`answers 500 naming ${missing} when only ${set} is set`, async () => {
      useConfig({ [set]: "x" });
      const before = await tableCounts();
      const response = await post(update(privateText));
      expect(response.status).toBe(500);
      const body = (await response.json()) as any;
      expect(body.error.code).toBe("invalid_config");
      expect(body.error.message).toContain(missing);
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("answers 500 naming TELEGRAM_API_BASE when it is not a URL", async () => {
    useConfig(telegramConfig({ TELEGRAM_API_BASE: "not a url" }));
    const response = await post(update(privateText));
    expect(response.status).toBe(500);
    expect(((await response.json()) as any).error.message).toContain("TELEGRAM_API_BASE");
  });

  it("sends to https://api.telegram.org when TELEGRAM_API_BASE is unset", async () => {
    const { TELEGRAM_API_BASE: _, ...rest } = telegramConfig();
    useConfig(rest);
    outbound.restore();
    outbound = captureFetch((request) => {
      if (request.url === `https://api.telegram.org/bot${TOKEN}/sendMessage`) return Response.json(sendOk);
      throw new Error(`unexpected outbound request to ${request.url}`);
    });
    const u = update(privateText);
    expect((await post(u)).status).toBe(200);
    await runAlarm(dmKey(u));
    expect(outbound.calls).toHaveLength(1);
  });
});

describe("verification and validation", () => {
  const refused: [string, string | null][] = [
    ["a missing secret header", null],
    ["an empty secret header", ""],
    ["a wrong secret", "tg-webhook-secret_2"],
    ["the secret with a suffix", `${SECRET}x`],
    ["a prefix of the secret", SECRET.slice(0, -1)],
    ["the bot token instead of the secret", TOKEN],
  ];
  for (const [what, header] of refused) {
    it(`refuses ${what} with 401 and stores nothing`, async () => {
      const before = await tableCounts();
      const response = await post(update(privateText), header);
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual({ error: { code: "bad_signature", message: expect.any(String) } });
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }

  it("checks the secret before reading the body", async () => {
    const response = await post(`{"update_id": `, "wrong");
    expect(response.status).toBe(401);
  });

  const malformed: [string, () => unknown, string][] = [
    ["malformed JSON", () => `{"update_id": 1, "message": `, "invalid_json"],
    ["a body that is not an object", () => "[]", "invalid_body"],
    ["a missing update_id", () => ({ message: update(privateText).message }), "invalid_body"],
    ["a string update_id", () => ({ ...update(privateText), update_id: "12" }), "invalid_body"],
    ["an unknown chat type", () => update(privateText, (m) => (m.chat.type = "room")), "invalid_body"],
    ["a chat without id", () => update(privateText, (m) => delete m.chat.id), "invalid_body"],
    ["a non-string text", () => update(privateText, (m) => (m.text = 42)), "invalid_body"],
  ];
  for (const [what, body, code] of malformed) {
    it(`answers 400 to ${what} with a valid secret, and stores nothing`, async () => {
      const before = await tableCounts();
      const response = await post(body());
      expect(response.status).toBe(400);
      expect(await response.json()).toEqual({ error: { code, message: expect.any(String) } });
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("routing text messages", () => {
  it("routes a private message to telegram:dm:{chat} and replies with sendMessage", async () => {
    const u = update(privateText);
    const response = await post(u);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({});
    const session = await onlySession(dmKey(u));
    expect(session).toMatchObject({ end_reason: null, started_at: T0 });
    expect((await messagesOf(session.id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "What is the capital of Peru?"],
    ]);
    expect(outbound.calls).toHaveLength(0); // nothing is sent before the webhook is answered
    await runAlarm(dmKey(u));
    expect(outbound.calls).toHaveLength(1);
    const call = outbound.calls[0]!;
    expect(call.method).toBe("POST");
    expect(call.url).toBe(`https://telegram.test/bot${TOKEN}/sendMessage`);
    expect(call.headers["content-type"]).toBe("application/json");
    expect(call.json).toEqual({ chat_id: u.message!.chat.id, text: "echo: What is the capital of Peru?" });
    expect(await deliveriesOf(session.id)).toMatchObject([
      { platform: "telegram", kind: "reply", status: "sent", attempts: 1, last_status: 200, last_error: null },
    ]);
  });

  it("hands the agent the message with the update id as its event id and the message date", async () => {
    useConfig(telegramConfig({ AGENT_URL, AGENT_TOKEN }));
    const u = update(privateText);
    await post(u);
    await runAlarm(dmKey(u));
    const handOff = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    expect(handOff.message).toMatchObject({
      event_id: String(u.update_id),
      platform: "telegram",
      chat_id: String(u.message!.chat.id),
      chat_type: "dm",
      user_id: String(u.message!.from!.id),
      thread_id: null,
      text: "What is the capital of Peru?",
    });
  });

  it("routes a basic group message to telegram:group:{chat}:{user}", async () => {
    const u = update(groupText);
    expect((await post(u)).status).toBe(200);
    const key = `telegram:group:${u.message!.chat.id}:${u.message!.from!.id}`;
    await onlySession(key);
    await runAlarm(key);
    expect(bodies()).toEqual([{ chat_id: u.message!.chat.id, text: "echo: who wrote the dragon book?" }]);
  });

  it("gives each member of a group their own session, or one shared one with GROUP_SESSIONS_PER_USER=false", async () => {
    const u = update(groupText);
    const chat = u.message!.chat.id;
    const other = structuredClone(u) as any;
    other.update_id = fresh();
    other.message.from.id = fresh();
    await post(u);
    await post(other);
    await onlySession(`telegram:group:${chat}:${u.message!.from!.id}`);
    await onlySession(`telegram:group:${chat}:${other.message.from.id}`);

    useConfig(telegramConfig({ GROUP_SESSIONS_PER_USER: "false" }));
    const shared = update(groupText);
    const sharedOther = structuredClone(shared) as any;
    sharedOther.update_id = fresh();
    sharedOther.message.from.id = fresh();
    await post(shared);
    await post(sharedOther);
    const session = await onlySession(`telegram:group:${shared.message!.chat.id}`);
    expect(await messagesOf(session.id)).toHaveLength(2);
  });

  it("keeps a reply in a supergroup out of any thread: message_thread_id without is_topic_message is not a topic", async () => {
    const u = update(supergroupReply);
    await post(u);
    const key = `telegram:group:${u.message!.chat.id}:${u.message!.from!.id}`;
    await onlySession(key);
    await runAlarm(key);
    expect(bodies()).toEqual([{ chat_id: u.message!.chat.id, text: "echo: and what about loops?" }]);
  });

  it("routes a forum topic message to its thread, and replies in that topic", async () => {
    const u = update(forumTopic);
    await post(u);
    const key = `telegram:group:${u.message!.chat.id}:5512:${u.message!.from!.id}`;
    await onlySession(key);
    await runAlarm(key);
    expect(bodies()).toEqual([
      { chat_id: u.message!.chat.id, text: "echo: Summarise this topic please", message_thread_id: 5512 },
    ]);
  });

  it("keeps topics of one forum apart, and the General topic (no is_topic_message) outside any thread", async () => {
    const a = update(forumTopic);
    const chat = a.message!.chat.id;
    const user = a.message!.from!.id;
    const b = structuredClone(a) as any;
    b.update_id = fresh();
    b.message.message_thread_id = 6001;
    const general = structuredClone(a) as any;
    general.update_id = fresh();
    delete general.message.message_thread_id;
    delete general.message.is_topic_message;
    for (const u of [a, b, general]) expect((await post(u)).status).toBe(200);
    await onlySession(`telegram:group:${chat}:5512:${user}`);
    await onlySession(`telegram:group:${chat}:6001:${user}`);
    await onlySession(`telegram:group:${chat}:${user}`);
  });

  it("keys a message sent on behalf of a chat (anonymous admin) by that chat, not the placeholder user", async () => {
    const u = update(anonymousAdmin);
    await post(u);
    const chat = u.message!.chat.id;
    await onlySession(`telegram:group:${chat}:${chat}`);
    expect(await sessionsOfKey(`telegram:group:${chat}:1087968824`)).toEqual([]);
  });

  it("routes a channel post to telegram:channel:{chat}:{chat} and posts the reply in the channel", async () => {
    const u = update(channelPost);
    const response = await post(u);
    expect(response.status).toBe(200);
    const chat = u.channel_post!.chat.id;
    const key = `telegram:channel:${chat}:${chat}`;
    await onlySession(key);
    await runAlarm(key);
    expect(bodies()).toEqual([{ chat_id: chat, text: "echo: v1.2 is out" }]);
  });

  it("keys a channel post without sender_chat by its chat", async () => {
    const u = update(channelPost, (m) => delete m.sender_chat);
    await post(u);
    const chat = u.channel_post!.chat.id;
    await onlySession(`telegram:channel:${chat}:${chat}`);
  });
});

describe("updates that are not routed answer 200 and store nothing", () => {
  const ignored: [string, object][] = [
    ["an edited message (an edit is not a new turn)", editedMessage],
    ["an edited channel post", { update_id: 0, edited_channel_post: { ...channelPost.channel_post, edit_date: 1 } }],
    ["a service message (new members)", newChatMembers],
    ["a callback query", callbackQuery],
    ["a message with empty text", update(privateText, (m) => (m.text = ""))],
    ["an update of a kind the gateway does not know", { update_id: 0, some_future_update: { id: 1 } }],
  ];
  for (const [what, fixture] of ignored) {
    it(`ignores ${what}`, async () => {
      const before = await tableCounts();
      const response = await post(update(fixture));
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({});
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }

  it("does not answer the edit of a message it already answered", async () => {
    const u = update(privateText);
    await post(u);
    await runAlarm(dmKey(u));
    const edit = structuredClone(editedMessage) as any;
    edit.update_id = fresh();
    edit.edited_message.chat.id = u.message!.chat.id;
    expect((await post(edit)).status).toBe(200);
    await runAlarm(dmKey(u));
    const session = await onlySession(dmKey(u));
    expect((await messagesOf(session.id)).map((m) => m.text)).toEqual([
      "What is the capital of Peru?",
      "echo: What is the capital of Peru?",
    ]);
    expect(sent()).toHaveLength(1);
  });
});

describe("commands", () => {
  it("/new@botname in a forum topic resets that topic's session and answers in the topic", async () => {
    const u = update(forumTopic);
    const chat = u.message!.chat.id;
    const key = `telegram:group:${chat}:5512:${u.message!.from!.id}`;
    await post(u);
    const command = structuredClone(u) as any;
    command.update_id = fresh();
    command.message.text = "/new@sessiongate_bot";
    await post(command);
    const rows = await sessionsOfKey(key);
    expect(rows.map((r) => r.end_reason)).toEqual(["new_command", null]);
    await runAlarm(key);
    expect(bodies()).toContainEqual({ chat_id: chat, text: "Started a new session.", message_thread_id: 5512 });
    expect(bodies().map((b) => b.text)).not.toContain("echo: /new@sessiongate_bot");
  });
});

describe("replies", () => {
  it("sends agent progress as a normal message in the same chat and topic", async () => {
    useConfig(telegramConfig({ AGENT_URL, AGENT_TOKEN }));
    const u = update(forumTopic);
    const key = `telegram:group:${u.message!.chat.id}:5512:${u.message!.from!.id}`;
    await post(u);
    await runAlarm(key);
    const run = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    const posted = await agentApi(`/v1/runs/${run.run_id}/progress`, run.run_token, { text: "Reading the topic…" });
    expect(posted).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(bodies()).toEqual([{ chat_id: u.message!.chat.id, text: "Reading the topic…", message_thread_id: 5512 }]);
    expect(await deliveriesOf(run.session.id)).toMatchObject([{ kind: "progress", status: "sent", last_status: 200 }]);

    const reply = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "Here is the summary." });
    expect(reply.status).toBe(200);
    await runAlarm(key);
    expect(bodies().at(-1)).toEqual({
      chat_id: u.message!.chat.id,
      text: "Here is the summary.",
      message_thread_id: 5512,
    });
  });

  it("splits a reply over 4,096 characters into messages sent in order", async () => {
    useConfig(telegramConfig({ AGENT_URL, AGENT_TOKEN }));
    const long = `${"a".repeat(3000)}\n${"b".repeat(3000)}`;
    agentAnswer = () => Response.json({ reply: long });
    const u = update(privateText);
    await post(u);
    await runAlarm(dmKey(u));
    expect(bodies()).toEqual([
      { chat_id: u.message!.chat.id, text: "a".repeat(3000) },
      { chat_id: u.message!.chat.id, text: "b".repeat(3000) },
    ]);
    const session = await onlySession(dmKey(u));
    expect(await deliveriesOf(session.id)).toMatchObject([{ kind: "reply", status: "sent", attempts: 1 }]);
  });
});

describe("send failures (visible in the operator API)", () => {
  async function firstReply(fixture: object = privateText) {
    const u = update(fixture);
    const key = dmKey(u);
    await post(u);
    await runAlarm(key);
    const session = await onlySession(key);
    return { u, key, session };
  }

  it("records a long reply whose second part fails as failed, so a retry never repeats the first part", async () => {
    useConfig(telegramConfig({ AGENT_URL, AGENT_TOKEN }));
    agentAnswer = () => Response.json({ reply: "x".repeat(5000) });
    apiAnswers.push(
      () => Response.json(sendOk),
      () => Response.json(retry429, { status: 429 }),
    );
    const { key, session } = await firstReply();
    expect(sent()).toHaveLength(2);
    expect(await deliveriesOf(session.id)).toMatchObject([
      { status: "failed", attempts: 1, last_status: 429, last_error: expect.stringContaining("part 2 of 2") },
    ]);
    setNow(T0 + HOUR);
    await runAlarm(key);
    expect(sent()).toHaveLength(2);
  });
});
