/**
 * `GET|POST /webhooks/whatsapp`: the subscription challenge, `X-Hub-Signature-256`
 * over the raw bytes, text messages as direct messages (several per delivery, in
 * order), dedupe on the message id, commands, reset notices, progress, and the exact
 * Graph API calls with their retry classification. Fixtures in
 * test/fixtures/whatsapp are recorded-shape Cloud API payloads; each test gives them
 * fresh sender and message ids, because storage is shared by the tests of this file.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { AGENT_TOKEN, AGENT_URL, agentApi } from "../agent/support";
import accountUpdate from "../fixtures/whatsapp/account-update.json";
import batch from "../fixtures/whatsapp/batch.json";
import error130429 from "../fixtures/whatsapp/error-130429.json";
import error131000 from "../fixtures/whatsapp/error-131000.json";
import error131026 from "../fixtures/whatsapp/error-131026.json";
import error131047 from "../fixtures/whatsapp/error-131047.json";
import error131056 from "../fixtures/whatsapp/error-131056.json";
import reactionMessage from "../fixtures/whatsapp/reaction-message.json";
import replyContext from "../fixtures/whatsapp/reply-context.json";
import sendOk from "../fixtures/whatsapp/send-ok.json";
import statusDelivered from "../fixtures/whatsapp/status-delivered.json";
import statusFailed from "../fixtures/whatsapp/status-failed.json";
import textMessage from "../fixtures/whatsapp/text-message.json";
import unsupportedMessage from "../fixtures/whatsapp/unsupported-message.json";
import {
  BASE,
  T0,
  captureFetch,
  messagesOf,
  restoreClock,
  router,
  runAlarm as runAlarmOnly,
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

const VERIFY_TOKEN = "wa-verify-token";
const APP_SECRET = "wa-app-secret-0123456789abcdef";
const ACCESS_TOKEN = "EAAGtestAccessToken";
const PHONE_NUMBER_ID = "100000000000001";
const API = "https://graph.test/v21.0";
/** The phone number id of the fixtures' `metadata`. */
const FIXTURE_PHONE_ID = "106540352242922";
const SEND_URL = `${API}/${FIXTURE_PHONE_ID}/messages`;

const whatsappConfig = (extra: Record<string, string> = {}) => ({
  WHATSAPP_VERIFY_TOKEN: VERIFY_TOKEN,
  WHATSAPP_APP_SECRET: APP_SECRET,
  WHATSAPP_ACCESS_TOKEN: ACCESS_TOKEN,
  WHATSAPP_PHONE_NUMBER_ID: PHONE_NUMBER_ID,
  WHATSAPP_API_BASE: API,
  SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
  ...extra,
});

/** What the Graph API answers next; an empty queue answers 200 with a message id. */
// Factories, not responses: a Response made in the test's context cannot be read by the
// routing object (I/O belongs to the request that made it), so each is made when asked for.
let apiAnswers: (() => Response)[];
let outbound: { calls: Captured[]; restore: () => void };
let agentAnswer: () => Response;

beforeEach(() => {
  setNow(T0);
  useConfig(whatsappConfig());
  apiAnswers = [];
  agentAnswer = () => new Response(null, { status: 202 });
  outbound = captureFetch((request) => {
    if (request.url.startsWith(`${API}/`) && request.url.endsWith("/messages"))
      return apiAnswers.shift()?.() ?? Response.json(sendOk);
    if (request.url === AGENT_URL) return agentAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

// Replies only: the read receipt with typing indicator made at dispatch has its own tests (test/routing/typing.test.ts).
const sent = () => outbound.calls.filter((c) => c.url.startsWith(`${API}/`) && c.json?.status !== "read");
const bodies = () => sent().map((c) => c.json);
const textTo = (to: string, body: string) => ({ messaging_product: "whatsapp", to, type: "text", text: { body } });

let counter = 0;
function freshNumber(): string {
  counter += 1;
  return `${4915100000000 + counter * 1000 + Math.floor(Math.random() * 1000)}`;
}

/**
 * A fixture with fresh ids: each sender gets a fresh number (the same one for all
 * their messages in the delivery) and each message a fresh id. Returns the
 * delivery and the senders' new numbers, in order of first appearance.
 */
function delivery(fixture: object, edit: (value: any) => void = () => {}): { body: any; senders: string[] } {
  const body = structuredClone(fixture) as any;
  const numbers = new Map<string, string>();
  for (const entry of body.entry ?? []) {
    for (const change of entry.changes ?? []) {
      for (const message of change.value?.messages ?? []) {
        if (!numbers.has(message.from)) numbers.set(message.from, freshNumber());
        message.from = numbers.get(message.from);
        message.id = `wamid.${crypto.randomUUID()}`;
      }
      for (const contact of change.value?.contacts ?? []) contact.wa_id = numbers.get(contact.wa_id) ?? contact.wa_id;
      if (change.value) edit(change.value);
    }
  }
  return { body, senders: [...numbers.values()] };
}

async function post(body: unknown, signature?: string | null): Promise<Response> {
  const raw = typeof body === "string" ? body : JSON.stringify(body);
  const headers: Record<string, string> = { "content-type": "application/json" };
  const header = signature === undefined ? `sha256=${await hmacSha256Hex(APP_SECRET, raw)}` : signature;
  if (header !== null) headers["x-hub-signature-256"] = header;
  return exports.default.fetch(new Request(`${BASE}/webhooks/whatsapp`, { method: "POST", headers, body: raw }));
}

async function verifyGet(params: Record<string, string>): Promise<Response> {
  const query = new URLSearchParams(params).toString();
  return exports.default.fetch(new Request(`${BASE}/webhooks/whatsapp?${query}`));
}

const keyOf = (from: string) => `whatsapp:dm:${from}`;

async function onlySession(key: string) {
  const rows = await sessionsOfKey(key);
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

/** Another text message from the same sender, with a fresh id. */
function textFrom(from: string, text: string) {
  const { body } = delivery(textMessage);
  const message = body.entry[0].changes[0].value.messages[0];
  message.from = from;
  message.text.body = text;
  body.entry[0].changes[0].value.contacts[0].wa_id = from;
  return body;
}

// What every adapter must do (dedupe, commands, notices, delivery retries, no silent
// drop), run with this file's requests and fake Graph API.
adapterContract({
  platform: "whatsapp",
  chat: () => {
    const from = freshNumber();
    return { key: keyOf(from), from };
  },
  message: (chat, text) => textFrom(chat.from, text),
  eventId: (body) => body.entry[0].changes[0].value.messages[0].id,
  post: async (body) => answerOf(await post(body)),
  accepted: {},
  commandAnswer: { in: "chat" },
  sends: () => sent().map(({ method, url, json }) => ({ method, url, json })),
  sendTo: (chat, text) => ({ method: "POST", url: SEND_URL, json: textTo(chat.from, text) }),
  answerNext: (...answers) => apiAnswers.push(...answers),
  failures: {
    serverErrors: [() => Response.json(error131000, { status: 500 }), () => new Response(null, { status: 503 })],
    rateLimit: {
      answer: () => Response.json(error130429, { status: 429, headers: { "retry-after": "30" } }),
      retryAfterMs: 30_000,
    },
    permanent: [
      { what: "error 131047 (outside the 24-hour window)", answer: () => Response.json(error131047, { status: 400 }) },
      { what: "error 131026 (undeliverable)", answer: () => Response.json(error131026, { status: 400 }) },
      {
        what: "a 401 (expired access token)",
        answer: () =>
          Response.json(
            { error: { message: "Error validating access token", type: "OAuthException", code: 190, fbtrace_id: "x" } },
            { status: 401 },
          ),
      },
    ],
  },
});

describe("configuration", () => {
  it("answers 404 to POST and GET while no WhatsApp secret is set, and stores nothing", async () => {
    useConfig({});
    const before = await tableCounts();
    expect((await post(delivery(textMessage).body)).status).toBe(404);
    expect(
      (await verifyGet({ "hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1" })).status,
    ).toBe(404);
    expect(await tableCounts()).toEqual(before);
  });

  const keys = [
    "WHATSAPP_VERIFY_TOKEN",
    "WHATSAPP_APP_SECRET",
    "WHATSAPP_ACCESS_TOKEN",
    "WHATSAPP_PHONE_NUMBER_ID",
  ] as const;
  for (const missing of keys) {
    it(`answers 500 naming ${missing} when the other secrets are set`, async () => {
      useConfig(whatsappConfig({ [missing]: "" }));
      const before = await tableCounts();
      for (const response of [
        await post(delivery(textMessage).body),
        await verifyGet({ "hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1" }),
      ]) {
        expect(response.status).toBe(500);
        const body = (await response.json()) as any;
        expect(body.error.code).toBe("invalid_config");
        expect(body.error.message).toContain(missing);
      }
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("answers 500 naming WHATSAPP_API_BASE when it is not an http(s) URL", async () => {
    useConfig(whatsappConfig({ WHATSAPP_API_BASE: "ftp://graph.test" }));
    const response = await post(delivery(textMessage).body);
    expect(response.status).toBe(500);
    expect(((await response.json()) as any).error.message).toContain("WHATSAPP_API_BASE");
  });

  it("sends to https://graph.facebook.com/v21.0 when WHATSAPP_API_BASE is unset", async () => {
    const { WHATSAPP_API_BASE: _, ...rest } = whatsappConfig();
    useConfig(rest);
    outbound.restore();
    outbound = captureFetch((request) => {
      if (request.url === `https://graph.facebook.com/v21.0/${FIXTURE_PHONE_ID}/messages`) return Response.json(sendOk);
      throw new Error(`unexpected outbound request to ${request.url}`);
    });
    const { body, senders } = delivery(textMessage);
    expect((await post(body)).status).toBe(200);
    await runAlarm(keyOf(senders[0]!));
    expect(outbound.calls).toHaveLength(1);
  });
});

describe("subscription challenge (GET)", () => {
  it("answers hub.challenge as plain text for hub.mode=subscribe with the verify token", async () => {
    const response = await verifyGet({
      "hub.mode": "subscribe",
      "hub.verify_token": VERIFY_TOKEN,
      "hub.challenge": "1158201444",
    });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toContain("text/plain");
    expect(await response.text()).toBe("1158201444");
  });

  const refused: [string, Record<string, string>][] = [
    ["a wrong verify token", { "hub.mode": "subscribe", "hub.verify_token": "nope", "hub.challenge": "1" }],
    ["a missing verify token", { "hub.mode": "subscribe", "hub.challenge": "1" }],
    [
      "the verify token with a suffix",
      { "hub.mode": "subscribe", "hub.verify_token": `${VERIFY_TOKEN}x`, "hub.challenge": "1" },
    ],
    ["another mode", { "hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1" }],
    ["a missing mode", { "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1" }],
    ["a missing challenge", { "hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN }],
    ["no parameters at all", {}],
  ];
  for (const [what, params] of refused) {
    it(`answers 403 to ${what}`, async () => {
      const response = await verifyGet(params);
      expect(response.status).toBe(403);
      expect(await response.json()).toEqual({
        error: { code: "forbidden", message: "not a valid webhook verification request" },
      });
    });
  }

  it("answers 403 to a request without hub.verify_token even when the verify token is spelled null", async () => {
    useConfig(whatsappConfig({ WHATSAPP_VERIFY_TOKEN: "null" }));
    expect((await verifyGet({ "hub.mode": "subscribe", "hub.challenge": "1" })).status).toBe(403);
    const response = await verifyGet({ "hub.mode": "subscribe", "hub.verify_token": "null", "hub.challenge": "2" });
    expect([response.status, await response.text()]).toEqual([200, "2"]);
  });
});

describe("signature and validation (POST)", () => {
  const refused: [string, (raw: string) => Promise<string | null>][] = [
    ["a missing signature", async () => null],
    ["an empty signature", async () => ""],
    ["a signature with another secret", async (raw) => `sha256=${await hmacSha256Hex("other-secret", raw)}`],
    ["a signature of other bytes", async (raw) => `sha256=${await hmacSha256Hex(APP_SECRET, `${raw} `)}`],
    [
      "a signature of the re-serialised body",
      async (raw) => `sha256=${await hmacSha256Hex(APP_SECRET, JSON.stringify(JSON.parse(raw)))}`,
    ],
    ["a hex signature without the sha256= prefix", async (raw) => hmacSha256Hex(APP_SECRET, raw)],
    ["a sha1= signature", async (raw) => `sha1=${(await hmacSha256Hex(APP_SECRET, raw)).slice(0, 40)}`],
    ["a truncated signature", async (raw) => `sha256=${(await hmacSha256Hex(APP_SECRET, raw)).slice(0, 63)}`],
    ["a signature that is not hex", async () => `sha256=${"z".repeat(64)}`],
  ];
  for (const [what, sign] of refused) {
    it(`refuses ${what} with 401 and stores nothing`, async () => {
      // Spaced like Meta's own bodies, so a re-serialisation differs from the bytes sent.
      const raw = JSON.stringify(delivery(textMessage).body, null, 1);
      const before = await tableCounts();
      const response = await post(raw, await sign(raw));
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual({
        error: { code: "bad_signature", message: "missing or invalid X-Hub-Signature-256" },
      });
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }

  it("accepts an upper-case hex signature of the exact bytes", async () => {
    const { body, senders } = delivery(textMessage);
    const raw = JSON.stringify(body, null, 2);
    const response = await post(raw, `sha256=${(await hmacSha256Hex(APP_SECRET, raw)).toUpperCase()}`);
    expect(response.status).toBe(200);
    await onlySession(keyOf(senders[0]!));
  });

  const malformed: [string, () => unknown, string][] = [
    ["malformed JSON", () => `{"object": "whatsapp_business_account", "entry": [`, "invalid_json"],
    ["a body without entry", () => ({ object: "whatsapp_business_account" }), "invalid_body"],
    ["an entry that is not a list", () => ({ object: "whatsapp_business_account", entry: {} }), "invalid_body"],
    ["a message without id", () => delivery(textMessage, (value) => delete value.messages[0].id).body, "invalid_body"],
    [
      "a message without sender",
      () => delivery(textMessage, (value) => delete value.messages[0].from).body,
      "invalid_body",
    ],
    [
      "a text whose body is not a string",
      () => delivery(textMessage, (value) => (value.messages[0].text.body = 7)).body,
      "invalid_body",
    ],
  ];
  for (const [what, body, code] of malformed) {
    it(`answers 400 to ${what}, correctly signed, and stores nothing`, async () => {
      const before = await tableCounts();
      const response = await post(body());
      expect(response.status).toBe(400);
      expect(await response.json()).toEqual({ error: { code, message: expect.any(String) } });
      expect(await tableCounts()).toEqual(before);
    });
  }

  // [what, the delivery, the field the 400 names]
  const named: [string, () => unknown, string][] = [
    [
      "a message without id",
      () => delivery(textMessage, (value) => delete value.messages[0].id).body,
      "entry.0.changes.0.value.messages.0.id",
    ],
    [
      "a message without type",
      () => delivery(textMessage, (value) => delete value.messages[0].type).body,
      "entry.0.changes.0.value.messages.0.type",
    ],
    [
      "a messages change whose messages are not a list",
      () => delivery(textMessage, (value) => (value.messages = { 0: value.messages[0] })).body,
      "entry.0.changes.0.value.messages",
    ],
    [
      "a messages change of the second entry whose value is not an object",
      () => {
        const body = delivery(textMessage).body;
        body.entry.push({ id: "2", changes: [{ field: "messages", value: "not an object" }] });
        return body;
      },
      "entry.1.changes.0.value",
    ],
  ];
  for (const [what, body, field] of named) {
    it(`names the field that failed: ${what}`, async () => {
      const before = await tableCounts();
      const response = await post(body());
      expect(response.status).toBe(400);
      const message: string = ((await response.json()) as any).error.message;
      expect(message.slice(0, field.length + 2)).toBe(`${field}: `);
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("routing text messages", () => {
  it("routes a text message to whatsapp:dm:{wa_id} and replies from the delivery's phone number", async () => {
    const { body, senders } = delivery(textMessage);
    const from = senders[0]!;
    const response = await post(body);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({});
    const session = await onlySession(keyOf(from));
    expect((await messagesOf(session.id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "Does it come in another color?"],
    ]);
    expect(outbound.calls).toHaveLength(0); // nothing is sent before the webhook is answered
    await runAlarm(keyOf(from));
    expect(outbound.calls).toHaveLength(1);
    const call = outbound.calls[0]!;
    expect(call.method).toBe("POST");
    expect(call.url).toBe(`https://graph.test/v21.0/106540352242922/messages`);
    expect(call.headers.authorization).toBe(`Bearer ${ACCESS_TOKEN}`);
    expect(call.headers["content-type"]).toBe("application/json");
    expect(call.json).toEqual(textTo(from, "echo: Does it come in another color?"));
    expect(await deliveriesOf(session.id)).toMatchObject([
      { platform: "whatsapp", kind: "reply", status: "sent", attempts: 1, last_status: 200, last_error: null },
    ]);
  });

  it("hands the agent the message with its wamid as event id and its timestamp", async () => {
    useConfig(whatsappConfig({ AGENT_URL, AGENT_TOKEN }));
    const { body, senders } = delivery(textMessage);
    await post(body);
    await runAlarm(keyOf(senders[0]!));
    const handOff = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    expect(handOff.message).toMatchObject({
      event_id: body.entry[0].changes[0].value.messages[0].id,
      platform: "whatsapp",
      chat_id: senders[0],
      chat_type: "dm",
      user_id: senders[0],
      thread_id: null,
      text: "Does it come in another color?",
    });
  });

  it("keeps a reply to an earlier message (context) in the sender's one conversation", async () => {
    const { body, senders } = delivery(textMessage);
    const from = senders[0]!;
    await post(body);
    const reply = delivery(replyContext, (value) => {
      value.messages[0].from = from;
    }).body;
    expect((await post(reply)).status).toBe(200);
    const session = await onlySession(keyOf(from));
    expect((await messagesOf(session.id)).map((m) => m.text)).toEqual([
      "Does it come in another color?",
      "And in blue?",
    ]);
  });

  it("falls back to WHATSAPP_PHONE_NUMBER_ID when the delivery has no metadata", async () => {
    const { body, senders } = delivery(textMessage, (value) => delete value.metadata);
    await post(body);
    await runAlarm(keyOf(senders[0]!));
    expect(sent().map((c) => c.url)).toEqual([`${API}/${PHONE_NUMBER_ID}/messages`]);
  });

  it("routes each text and media message of one delivery, in order", async () => {
    // Each message its own run (concurrent), so each gets its own echo reply.
    useConfig(whatsappConfig({ OVERLAP: JSON.stringify({ mode: "concurrent" }) }));
    const { body, senders } = delivery(batch);
    const [sheena, luis] = senders as [string, string];
    const response = await post(body);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({});
    const a = await onlySession(keyOf(sheena));
    const b = await onlySession(keyOf(luis));
    expect((await messagesOf(a.id)).map((m) => m.text)).toEqual(["first", "this one", "second"]);
    expect((await messagesOf(b.id)).map((m) => m.text)).toEqual(["hola"]);
    await runAlarm(keyOf(sheena));
    await runAlarm(keyOf(luis));
    expect(bodies()).toEqual([
      textTo(sheena, "echo: first"),
      textTo(sheena, "echo: this one [image]"),
      textTo(sheena, "echo: second"),
      textTo(luis, "echo: hola"),
    ]);
  });

  it("routes messages of several entries and changes", async () => {
    const one = delivery(textMessage);
    const two = delivery(textMessage);
    const body = { object: "whatsapp_business_account", entry: [...one.body.entry, ...two.body.entry] };
    expect((await post(body)).status).toBe(200);
    await onlySession(keyOf(one.senders[0]!));
    await onlySession(keyOf(two.senders[0]!));
  });
});

describe("deliveries that are not routed answer 200 and store nothing", () => {
  const ignored: [string, object][] = [
    ["a delivered status", statusDelivered],
    ["a failed status (131047)", statusFailed],
    ["a reaction", reactionMessage],
    ["an unsupported message", unsupportedMessage],
    ["an account_update change", accountUpdate],
    ["an empty text", delivery(textMessage, (value) => (value.messages[0].text.body = "")).body],
    // Neither text nor media (spec "what counts as a message"): answered, not failed,
    // or Meta would retry the delivery (and the messages beside it) again and again.
    ["a text message without its text", delivery(textMessage, (value) => delete value.messages[0].text).body],
    [
      "an image message without its image",
      delivery(textMessage, (value) => {
        value.messages[0].type = "image";
        delete value.messages[0].text;
      }).body,
    ],
    // Meta adds message types over time: one the gateway does not route is skipped
    // whatever fields it carries, even one it reads on a routed type (here `text`).
    [
      "a message of a type the gateway does not route, whatever its fields",
      delivery(textMessage, (value) => {
        value.messages[0].type = "poll";
        value.messages[0].text = "Lunch at noon?";
      }).body,
    ],
    // Meta adds change fields over time: one the gateway does not read is acknowledged
    // whatever its value holds, or Meta would retry it and at last drop the subscription.
    [
      "a change of a field the gateway does not read, whatever its value",
      {
        object: "whatsapp_business_account",
        entry: [{ id: "1", changes: [{ field: "some_future_field", value: ["not", "an", "object"] }] }],
      },
    ],
    ["an empty entry list", { object: "whatsapp_business_account", entry: [] }],
  ];
  for (const [what, fixture] of ignored) {
    it(`ignores ${what}`, async () => {
      const before = await tableCounts();
      const response = await post(delivery(fixture).body);
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({});
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }
});

describe("dedupe on the message id (invariant 9)", () => {
  it("stores each message of a redelivered batch once", async () => {
    const { body, senders } = delivery(batch);
    await post(body);
    await post(body);
    const a = await onlySession(keyOf(senders[0]!));
    expect((await messagesOf(a.id)).map((m) => m.text)).toEqual(["first", "this one", "second"]);
  });
});

describe("replies", () => {
  it("sends agent progress as a normal text message", async () => {
    useConfig(whatsappConfig({ AGENT_URL, AGENT_TOKEN }));
    const from = freshNumber();
    await post(textFrom(from, "plan my trip"));
    await runAlarm(keyOf(from));
    const run = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    const posted = await agentApi(`/v1/runs/${run.run_id}/progress`, run.run_token, { text: "Looking up flights…" });
    expect(posted).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(sent().map((c) => [c.url, c.headers.authorization, c.json])).toEqual([
      [SEND_URL, `Bearer ${ACCESS_TOKEN}`, textTo(from, "Looking up flights…")],
    ]);
    expect(await deliveriesOf(run.session.id)).toMatchObject([{ kind: "progress", status: "sent", last_status: 200 }]);
  });

  it("splits a reply over 4,096 characters into messages sent in order", async () => {
    useConfig(whatsappConfig({ AGENT_URL, AGENT_TOKEN }));
    agentAnswer = () => Response.json({ reply: `${"a".repeat(4000)}\n${"b".repeat(200)}` });
    const from = freshNumber();
    await post(textFrom(from, "long please"));
    await runAlarm(keyOf(from));
    expect(bodies()).toEqual([textTo(from, "a".repeat(4000)), textTo(from, "b".repeat(200))]);
  });
});

describe("send failures (visible in the operator API)", () => {
  async function firstReply() {
    const from = freshNumber();
    const key = keyOf(from);
    await post(textFrom(from, "hello"));
    await runAlarm(key);
    return { from, key, session: await onlySession(key) };
  }

  // Meta answers these rate limits with HTTP 400: their error codes make them retryable.
  const retryable: [string, () => Response][] = [
    ["error 130429 (throughput rate limit) answered 400", () => Response.json(error130429, { status: 400 })],
    ["error 131056 (pair rate limit) answered 400", () => Response.json(error131056, { status: 400 })],
  ];
  for (const [what, answer] of retryable) {
    it(`retries ${what}, then records it sent`, async () => {
      const status = answer().status; // read here for its status only
      apiAnswers.push(answer);
      const { key, session } = await firstReply();
      expect(await deliveriesOf(session.id)).toMatchObject([
        { kind: "reply", status: "pending", attempts: 1, last_status: status, last_error: expect.any(String) },
      ]);
      const [item] = (await router(key).outbox()).filter((i) => i.kind === "delivery");
      expect(item!.dueAt).toBe(T0 + 1_000);
      setNow(item!.dueAt);
      await runAlarm(key);
      expect(sent()).toHaveLength(2);
      expect(sent()[1]!.json).toEqual(sent()[0]!.json);
      expect(await deliveriesOf(session.id)).toMatchObject([
        { kind: "reply", status: "sent", attempts: 2, last_status: 200, last_error: null },
      ]);
    });
  }

  it("records error 131047 as failed even when answered with a 5xx status", async () => {
    apiAnswers.push(() => Response.json(error131047, { status: 500 }));
    const { session } = await firstReply();
    expect(await deliveriesOf(session.id)).toMatchObject([{ status: "failed", attempts: 1, last_status: 500 }]);
  });
});

describe("no silent drop (invariant 1)", () => {
  it("answers 503 when a batch cannot be stored; the redelivery stores each of its messages once", async () => {
    const { body, senders } = delivery(batch);
    const [sheena, luis] = senders as [string, string];
    await env.DB.exec("ALTER TABLE messages RENAME TO messages_away");
    let failed: Response;
    try {
      failed = await post(body);
    } finally {
      await env.DB.exec("ALTER TABLE messages_away RENAME TO messages");
    }
    expect(failed.status).toBe(503);
    expect(await sessionsOfKey(keyOf(sheena))).toEqual([]);
    expect((await post(body)).status).toBe(200);
    expect((await post(body)).status).toBe(200);
    expect((await messagesOf((await onlySession(keyOf(sheena))).id)).map((m) => m.text)).toEqual([
      "first",
      "this one",
      "second",
    ]);
    expect((await messagesOf((await onlySession(keyOf(luis))).id)).map((m) => m.text)).toEqual(["hola"]);
  });
});
