/**
 * Slack (`POST /webhooks/slack`) end to end: v0 signatures over the raw bytes,
 * Events API messages mapped to session keys, dedupe on `event_id`, slash
 * commands answered in the response, and replies through `chat.postMessage`,
 * with retryable and permanent failures visible in the operator API.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { accepted, agentApi, AGENT_TOKEN, AGENT_URL } from "../agent/support";
import appMention from "../fixtures/slack/app-mention.json";
import messageBot from "../fixtures/slack/message-bot.json";
import messageChanged from "../fixtures/slack/message-changed.json";
import messageChannel from "../fixtures/slack/message-channel.json";
import messageChannelJoin from "../fixtures/slack/message-channel-join.json";
import messageIm from "../fixtures/slack/message-im.json";
import messageMpim from "../fixtures/slack/message-mpim.json";
import messageOwn from "../fixtures/slack/message-own.json";
import messagePrivateChannel from "../fixtures/slack/message-private-channel.json";
import messageThread from "../fixtures/slack/message-thread.json";
import retryHeaders from "../fixtures/slack/retry-headers.json";
import slashCommandNew from "../fixtures/slack/slash-command-new.json";
import urlVerification from "../fixtures/slack/url-verification.json";
import {
  BASE,
  HOUR,
  T0,
  captureFetch,
  loggedLines,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
  type Captured,
  tableCounts,
  deliveriesOf,
} from "../helpers";
import { adapterContract } from "./contract";

const SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5";
const BOT_TOKEN = "xoxb-test-bot-token";
const SLACK_API = "https://slack.test/api";
const POST_MESSAGE = `${SLACK_API}/chat.postMessage`;

const slackConfig = (extra: Record<string, string> = {}) => ({
  SLACK_SIGNING_SECRET: SIGNING_SECRET,
  SLACK_BOT_TOKEN: BOT_TOKEN,
  SLACK_API_BASE: SLACK_API,
  SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
  ...extra,
});

/** How the fake Slack Web API answers the next chat.postMessage calls (default: ok). */
let slackAnswers: (() => Response)[] = [];
let agentAnswer: (() => Response) | null = null;
let outbound: { calls: Captured[]; restore: () => void };

const okAnswer = () => Response.json({ ok: true, channel: "C0", ts: "1926244801.000100", message: {} });

beforeEach(() => {
  setNow(T0);
  useConfig(slackConfig());
  slackAnswers = [];
  agentAnswer = null;
  outbound = captureFetch((request) => {
    if (request.url === POST_MESSAGE) return (slackAnswers.shift() ?? okAnswer)();
    if (request.url === AGENT_URL && agentAnswer) return agentAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

const posts = () => outbound.calls.filter((c) => c.url === POST_MESSAGE);

// ------------------------------------------------------------------ requests

type Json = Record<string, any>;

/** A fixture with its conversation ids made unique for this test (storage is shared by the file). */
function eventFixture(fixture: Json, ids: { channel?: string; user?: string; eventId?: string; text?: string } = {}) {
  const body = structuredClone(fixture);
  body.event_id = ids.eventId ?? unique("Ev");
  if (ids.channel) body.event.channel = ids.channel;
  if (ids.user) body.event.user = ids.user;
  if (ids.text !== undefined) body.event.text = ids.text;
  return body;
}

interface SignOptions {
  secret?: string;
  timestamp?: number | string;
  contentType?: string;
  headers?: Record<string, string>;
  signature?: string | null;
}

async function slackRequest(body: string, options: SignOptions = {}): Promise<Request> {
  const timestamp = String(options.timestamp ?? Math.floor(Date.now() / 1000));
  const signature =
    options.signature === undefined
      ? `v0=${await hmacSha256Hex(options.secret ?? SIGNING_SECRET, `v0:${timestamp}:${body}`)}`
      : options.signature;
  const headers: Record<string, string> = {
    "content-type": options.contentType ?? "application/json",
    "x-slack-request-timestamp": timestamp,
    ...options.headers,
  };
  if (signature !== null) headers["x-slack-signature"] = signature;
  return new Request(`${BASE}/webhooks/slack`, { method: "POST", headers, body });
}

async function post(body: Json | string, options: SignOptions = {}) {
  const raw = typeof body === "string" ? body : JSON.stringify(body);
  const response = await exports.default.fetch(await slackRequest(raw, options));
  const text = await response.text();
  return { status: response.status, body: text === "" ? null : (JSON.parse(text) as any) };
}

async function slash(fields: Record<string, string>, options: SignOptions = {}) {
  const raw = new URLSearchParams(fields).toString();
  return post(raw, { contentType: "application/x-www-form-urlencoded", ...options });
}

function slashFields(ids: { channel: string; user: string; command?: string; channelName?: string; trigger?: string }) {
  return {
    ...slashCommandNew,
    channel_id: ids.channel,
    channel_name: ids.channelName ?? slashCommandNew.channel_name,
    user_id: ids.user,
    command: ids.command ?? "/new",
    trigger_id: ids.trigger ?? unique("trigger"),
  };
}

const dmKey = (channel: string) => `slack:dm:${channel}`;
const channelKey = (channel: string, user: string) => `slack:channel:${channel}:${user}`;

// What every adapter must do (dedupe, commands, notices, delivery retries, no silent
// drop), run with this file's requests and fake Web API.
adapterContract({
  platform: "slack",
  chat: () => {
    const channel = unique("D");
    return { key: dmKey(channel), channel, user: unique("U") };
  },
  message: (chat, text) => eventFixture(messageIm, { channel: chat.channel, user: chat.user, text }),
  eventId: (body) => body.event_id,
  // Slack marks its own retries with X-Slack-Retry-Num; dedupe must not depend on it.
  post: (body, redelivery = 0) =>
    post(body, redelivery ? { headers: { ...retryHeaders, "x-slack-retry-num": String(redelivery) } } : {}),
  accepted: {},
  // Typed as a message, a command is answered in the chat (slash commands are below).
  commandAnswer: { in: "chat" },
  sends: () => posts().map(({ method, url, json }) => ({ method, url, json })),
  sendTo: (chat, text) => ({ method: "POST", url: POST_MESSAGE, json: { channel: chat.channel, text } }),
  answerNext: (...answers) => slackAnswers.push(...answers),
  failures: {
    serverErrors: [() => new Response("upstream down", { status: 503 })],
    rateLimit: {
      answer: () => new Response("", { status: 429, headers: { "retry-after": "7" } }),
      retryAfterMs: 7_000,
    },
    permanent: [{ what: "an HTTP 400", answer: () => new Response("bad", { status: 400 }) }],
  },
});

// ------------------------------------------------------------------ tests

describe("configuration", () => {
  it("answers 404 while no Slack secret is set, and stores nothing", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) });
    const before = await tableCounts();
    const response = await post(eventFixture(messageIm, { channel: unique("D") }));
    expect(response.status).toBe(404);
    expect(response.body.error.code).toBe("not_configured");
    expect(await tableCounts()).toEqual(before);
  });

  for (const [set, missing] of [
    ["SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN"],
    ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"],
  ] as const) {
    it(`answers 500 naming ${missing} when only ${set} is set`, async () => {
      useConfig({ [set]: "something" });
      const before = await tableCounts();
      const response = await post(eventFixture(messageIm, { channel: unique("D") }));
      expect(response.status).toBe(500);
      expect(response.body.error.code).toBe("invalid_config");
      expect(response.body.error.message).toContain(missing);
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("answers 500 naming SLACK_API_BASE when it is not a URL", async () => {
    useConfig(slackConfig({ SLACK_API_BASE: "not a url" }));
    const response = await post(eventFixture(messageIm, { channel: unique("D") }));
    expect(response.status).toBe(500);
    expect(response.body.error.message).toContain("SLACK_API_BASE");
  });
});

describe("url_verification", () => {
  it("answers the challenge once the request is verified", async () => {
    const response = await post(urlVerification);
    expect(response).toEqual({ status: 200, body: { challenge: urlVerification.challenge } });
  });

  it("refuses an unsigned challenge with 401", async () => {
    const response = await post(urlVerification, { signature: null });
    expect(response.status).toBe(401);
  });
});

describe("verification: refused with 401, nothing stored", () => {
  const now = () => Math.floor(T0 / 1000);
  const cases: [string, (body: string) => Promise<Request>][] = [
    ["a missing X-Slack-Signature", (body) => slackRequest(body, { signature: null })],
    [
      "a missing X-Slack-Request-Timestamp",
      async (body) => {
        const request = await slackRequest(body);
        const headers = new Headers(request.headers);
        headers.delete("x-slack-request-timestamp");
        return new Request(request, { headers });
      },
    ],
    ["a signature made with another secret", (body) => slackRequest(body, { secret: "not-the-secret" })],
    [
      "a signature of other bytes",
      async (body) => new Request(await slackRequest(body), { body: body.replace("hi bot", "hi bob") }),
    ],
    [
      "a signature over a re-serialised body",
      async (body) => {
        const signed = await slackRequest(JSON.stringify(JSON.parse(body)));
        return new Request(signed, { body: body.replace("{", "{ ") });
      },
    ],
    ["a malformed signature", (body) => slackRequest(body, { signature: "v0=zz" })],
    [
      "a signature of another version",
      async (body) => {
        const good = (await slackRequest(body)).headers.get("x-slack-signature")!;
        return slackRequest(body, { signature: good.replace("v0=", "v1=") });
      },
    ],
    ["a timestamp 301 s old", (body) => slackRequest(body, { timestamp: now() - 301 })],
    ["a timestamp 301 s ahead", (body) => slackRequest(body, { timestamp: now() + 301 })],
    ["a timestamp that is not a number", (body) => slackRequest(body, { timestamp: "soon" })],
  ];

  for (const [name, build] of cases) {
    it(`refuses ${name}`, async () => {
      const before = await tableCounts();
      const body = JSON.stringify(eventFixture(messageIm, { channel: unique("D") }));
      const response = await exports.default.fetch(await build(body));
      expect(response.status).toBe(401);
      // The message names both headers, so whoever set the app up knows what to check.
      expect(await response.json()).toEqual({
        error: {
          code: "bad_signature",
          message: "missing or invalid X-Slack-Signature or X-Slack-Request-Timestamp",
        },
      });
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("accepts a timestamp 299 s old", async () => {
    const channel = unique("D");
    const response = await post(eventFixture(messageIm, { channel }), { timestamp: now() - 299 });
    expect(response.status).toBe(200);
    expect(await sessionsOfKey(dmKey(channel))).toHaveLength(1);
  });

  // The window is inclusive: exactly five minutes either way is still accepted.
  for (const [name, offset] of [
    ["exactly 300 s old", -300],
    ["exactly 300 s ahead", 300],
  ] as const) {
    it(`accepts a timestamp ${name}, one second inside the refusal`, async () => {
      const channel = unique("D");
      const response = await post(eventFixture(messageIm, { channel }), { timestamp: now() + offset });
      expect(response).toEqual({ status: 200, body: {} });
      expect(await sessionsOfKey(dmKey(channel))).toHaveLength(1);

      const before = await tableCounts();
      const late = unique("D");
      const refused = await post(eventFixture(messageIm, { channel: late }), {
        timestamp: now() + offset + Math.sign(offset),
      });
      expect(refused).toEqual({ status: 401, body: { error: { code: "bad_signature", message: expect.any(String) } } });
      expect(await tableCounts()).toEqual(before);
      expect(await sessionsOfKey(dmKey(late))).toHaveLength(0);
    });
  }

  it("refuses a signed slash command whose signature is wrong", async () => {
    const before = await tableCounts();
    const response = await slash(slashFields({ channel: unique("D"), user: unique("U") }), { secret: "nope" });
    expect(response.status).toBe(401);
    expect(await tableCounts()).toEqual(before);
  });
});

describe("malformed bodies after a valid signature: 400, nothing stored", () => {
  const cases: [string, () => Promise<{ status: number; body: any }>][] = [
    ["invalid JSON", () => post(`{"type": "event_callback", "event": `)],
    ["an envelope without a type", () => post({ event_id: "Ev1" })],
    [
      "an event_callback without event_id",
      () => {
        const body = eventFixture(messageIm, { channel: unique("D") });
        delete body.event_id;
        return post(body);
      },
    ],
    [
      "a user message without a channel",
      () => {
        const body = eventFixture(messageIm);
        delete body.event.channel;
        return post(body);
      },
    ],
    [
      "a message event whose user is not a string",
      () => {
        const body = eventFixture(messageIm, { channel: unique("D") });
        body.event.user = 42;
        return post(body);
      },
    ],
    ["a url_verification without a challenge", () => post({ type: "url_verification", token: "t" })],
    [
      "a slash command without trigger_id",
      () => {
        const fields: Record<string, string> = slashFields({ channel: unique("D"), user: unique("U") });
        delete fields.trigger_id;
        return slash(fields);
      },
    ],
  ];
  for (const [name, run] of cases) {
    it(`refuses ${name}`, async () => {
      const before = await tableCounts();
      const response = await run();
      expect(response.status).toBe(400);
      expect(response.body.error.code).toMatch(/^invalid_(json|body)$/);
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("messages: chat types, threads and replies", () => {
  it("a DM (channel_type im) is keyed by its channel and answered with chat.postMessage", async () => {
    const channel = unique("D");
    const user = unique("U");
    const response = await post(eventFixture(messageIm, { channel, user }));
    // Acknowledged at once with {} and nothing sent yet: the reply comes from the alarm.
    expect(response).toEqual({ status: 200, body: {} });
    expect(outbound.calls).toHaveLength(0);
    const [session] = await sessionsOfKey(dmKey(channel));
    expect(session).toMatchObject({ end_reason: null, platform: "slack", chat_type: "dm" });
    expect((await messagesOf(session!.id)).map((m) => [m.role, m.text])).toEqual([["user", "hi bot"]]);

    await runAlarm(dmKey(channel));
    expect(posts()).toHaveLength(1);
    const [call] = posts();
    expect(call!.method).toBe("POST");
    expect(call!.headers.authorization).toBe(`Bearer ${BOT_TOKEN}`);
    expect(call!.headers["content-type"]).toBe("application/json; charset=utf-8");
    expect(call!.json).toEqual({ channel, text: "echo: hi bot" });
    expect((await deliveriesOf(session!.id)).map((d) => [d.kind, d.status, d.attempts, d.last_status])).toEqual([
      ["reply", "sent", 1, 200],
    ]);
  });

  const keyed: [string, Json, (channel: string, user: string) => string, string][] = [
    ["a public channel (channel)", messageChannel, (c, u) => `slack:channel:${c}:${u}`, "channel"],
    ["a private channel (group)", messagePrivateChannel, (c, u) => `slack:channel:${c}:${u}`, "channel"],
    ["a multi-person DM (mpim)", messageMpim, (c, u) => `slack:group:${c}:${u}`, "group"],
  ];
  for (const [name, fixture, key, chatType] of keyed) {
    it(`${name} is keyed per channel and user`, async () => {
      const channel = unique("C");
      const user = unique("U");
      await post(eventFixture(fixture, { channel, user }));
      const [session] = await sessionsOfKey(key(channel, user));
      expect(session).toMatchObject({ chat_type: chatType, end_reason: null });
      // Another user in the same channel has a session of their own.
      const other = unique("U");
      await post(eventFixture(fixture, { channel, user: other }));
      expect(await sessionsOfKey(key(channel, other))).toHaveLength(1);
      await runAlarm(key(channel, user));
      expect(posts().map((c) => c.json)).toEqual([{ channel, text: `echo: ${fixture.event.text}` }]);
    });
  }

  it("keys by channel only when GROUP_SESSIONS_PER_USER is off", async () => {
    useConfig(slackConfig({ GROUP_SESSIONS_PER_USER: "false" }));
    const channel = unique("C");
    await post(eventFixture(messageChannel, { channel, user: unique("U") }));
    await post(eventFixture(messageChannel, { channel, user: unique("U") }));
    expect(await sessionsOfKey(`slack:channel:${channel}`)).toHaveLength(1);
  });

  it("a reply in a thread is its own session, keyed by thread_ts, and answered in the thread", async () => {
    const channel = unique("C");
    const user = unique("U");
    await post(eventFixture(messageChannel, { channel, user }));
    await post(eventFixture(messageThread, { channel, user }));
    const threadKey = `slack:channel:${channel}:${messageThread.event.thread_ts}:${user}`;
    const [threadSession] = await sessionsOfKey(threadKey);
    const [channelSession] = await sessionsOfKey(channelKey(channel, user));
    expect(threadSession!.id).not.toBe(channelSession!.id);
    expect((await messagesOf(threadSession!.id)).map((m) => m.text)).toEqual(["a reply in the thread"]);
    await runAlarm(threadKey);
    expect(posts().map((c) => c.json)).toEqual([
      { channel, text: "echo: a reply in the thread", thread_ts: messageThread.event.thread_ts },
    ]);
  });
});

describe("events that are not a user's new text: 200, nothing stored", () => {
  const ignored: [string, () => Json][] = [
    ["an edit (message_changed)", () => eventFixture(messageChanged, { channel: unique("C") })],
    ["a bot's message (bot_message)", () => eventFixture(messageBot, { channel: unique("C") })],
    ["the app's own message", () => eventFixture(messageOwn, { channel: unique("D") })],
    [
      "a message from the app's bot user without bot_id",
      () => {
        const body = eventFixture(messageOwn, { channel: unique("D") });
        delete body.event.bot_id;
        delete body.event.bot_profile;
        return body;
      },
    ],
    ["a join (channel_join)", () => eventFixture(messageChannelJoin, { channel: unique("C") })],
    ["whitespace only", () => eventFixture(messageIm, { channel: unique("D"), text: "  \n " })],
    ["an app_mention (the same text also arrives as a message)", () => eventFixture(appMention)],
    ["an app_rate_limited notice", () => ({ token: "t", type: "app_rate_limited", minute_rate_limited: 1926244800 })],
    [
      "a message in an unknown kind of channel",
      () => {
        const body = eventFixture(messageIm, { channel: unique("D") });
        body.event.channel_type = "huddle";
        return body;
      },
    ],
  ];
  for (const [name, build] of ignored) {
    it(`ignores ${name}`, async () => {
      const before = await tableCounts();
      const response = await post(build());
      expect(response).toEqual({ status: 200, body: {} });
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("logs the channel_type of a message it ignores for being in an unknown kind of channel", async () => {
    const warnings = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    try {
      const body = eventFixture(messageIm, { channel: unique("D") });
      body.event.channel_type = "huddle";
      expect(await post(body)).toEqual({ status: 200, body: {} });
      expect(loggedLines(warnings, "slack: ignoring a message with an unknown channel_type")).toEqual([
        expect.objectContaining({ level: "warn", channel_type: "huddle" }),
      ]);
    } finally {
      warnings.mockRestore();
    }
  });

  it("still answers a human whose id is not the bot's, even when authorizations include a user grant", async () => {
    const channel = unique("D");
    const user = unique("U");
    const body = eventFixture(messageIm, { channel, user });
    body.authorizations.push({ enterprise_id: null, team_id: "T0GATEWAY", user_id: user, is_bot: false });
    expect((await post(body)).status).toBe(200);
    expect(await sessionsOfKey(dmKey(channel))).toHaveLength(1);
  });
});

describe("slash commands", () => {
  it("/new in a DM ends that DM's session and is answered in the response only", async () => {
    const channel = unique("D");
    const user = unique("U");
    await post(eventFixture(messageIm, { channel, user }));
    await runAlarm(dmKey(channel));
    const [first] = await sessionsOfKey(dmKey(channel));
    const response = await slash(slashFields({ channel, user, command: "/new" }));
    expect(response).toEqual({ status: 200, body: { response_type: "ephemeral", text: "Started a new session." } });
    const sessions = await sessionsOfKey(dmKey(channel));
    expect(sessions.map((s) => s.end_reason)).toEqual(["new_command", null]);
    expect(sessions[0]!.id).toBe(first!.id);
    expect(await messagesOf(sessions[1]!.id)).toEqual([]);
    await runAlarm(dmKey(channel));
    // Only the echo of the message before /new was posted; the command's answer is not posted again.
    expect(posts().map((c) => c.json.text)).toEqual(["echo: hi bot"]);
    expect(await deliveriesOf(sessions[1]!.id)).toEqual([]);
  });

  it("/stop in a channel suspends that user's channel session", async () => {
    const channel = unique("C");
    const user = unique("U");
    await post(eventFixture(messageChannel, { channel, user }));
    const response = await slash(slashFields({ channel, user, command: "/stop", channelName: "general" }));
    expect(response.body).toEqual({
      response_type: "ephemeral",
      text: "Stopped. Your next message starts a new session.",
    });
    const [session] = await sessionsOfKey(channelKey(channel, user));
    expect(session).toMatchObject({ end_reason: "suspended" });
  });

  it("/reset in a multi-person DM (mpdm-…) resets the same group session its messages use", async () => {
    const channel = unique("G");
    const user = unique("U");
    await post(eventFixture(messageMpim, { channel, user }));
    const response = await slash(
      slashFields({ channel, user, command: "/reset", channelName: "mpdm-alice--bob--carol-1" }),
    );
    expect(response.body.text).toBe("Started a new session.");
    const sessions = await sessionsOfKey(`slack:group:${channel}:${user}`);
    expect(sessions.map((s) => s.end_reason)).toEqual(["new_command", null]);
  });

  it("/stop with nothing to stop says so", async () => {
    const response = await slash(slashFields({ channel: unique("D"), user: unique("U"), command: "/stop" }));
    expect(response.body).toEqual({ response_type: "ephemeral", text: "There is no session to stop." });
  });

  it("a repeated trigger_id is handled once and still answered", async () => {
    const channel = unique("D");
    const user = unique("U");
    const fields = slashFields({ channel, user, command: "/new" });
    expect((await slash(fields)).body.text).toBe("Started a new session.");
    const again = await slash(fields);
    expect(again).toEqual({
      status: 200,
      body: { response_type: "ephemeral", text: "This command was already handled." },
    });
    expect(await sessionsOfKey(dmKey(channel))).toHaveLength(1);
  });

  for (const [name, fields] of [
    ["an interactivity payload", { payload: JSON.stringify({ type: "block_actions", actions: [] }) }],
    ["Slack's certificate check", { ssl_check: "1", token: "Jhj5dZrVaK7ZwHHjRyZWjbDl" }],
  ] as const) {
    it(`acknowledges ${name} with an empty 200 and stores nothing`, async () => {
      const before = await tableCounts();
      expect(await slash(fields)).toEqual({ status: 200, body: null });
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("refuses a form body that is neither a command, an interactivity payload nor a certificate check", async () => {
    const before = await tableCounts();
    const response = await slash({ token: "Jhj5dZrVaK7ZwHHjRyZWjbDl", team_id: "T0GATEWAY", user_id: unique("U") });
    expect(response.status).toBe(400);
    expect(response.body.error.code).toBe("invalid_body");
    expect(await tableCounts()).toEqual(before);
  });

  // The command decides: a slash command carrying a field named like the others is
  // still run and answered, never taken for a check and dropped.
  for (const extra of [{ ssl_check: "1" }, { payload: "{}" }] as Record<string, string>[]) {
    it(`runs a slash command that also carries ${Object.keys(extra)[0]}`, async () => {
      const channel = unique("D");
      const response = await slash({ ...slashFields({ channel, user: unique("U"), command: "/new" }), ...extra });
      expect(response).toEqual({ status: 200, body: { response_type: "ephemeral", text: "Started a new session." } });
      expect(await sessionsOfKey(dmKey(channel))).toHaveLength(1);
    });
  }

  it("any other slash command is an ephemeral 'Unknown command' and stores nothing", async () => {
    const before = await tableCounts();
    const response = await slash(slashFields({ channel: unique("D"), user: unique("U"), command: "/weather" }));
    expect(response).toEqual({ status: 200, body: { response_type: "ephemeral", text: "Unknown command" } });
    expect(await tableCounts()).toEqual(before);
  });
});

describe("progress", () => {
  it("sends progress as a normal message in the conversation's thread", async () => {
    useConfig(slackConfig({ AGENT_URL, AGENT_TOKEN }));
    agentAnswer = accepted;
    const channel = unique("C");
    const user = unique("U");
    await post(eventFixture(messageThread, { channel, user }));
    const key = `slack:channel:${channel}:${messageThread.event.thread_ts}:${user}`;
    await runAlarm(key);
    const run = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    expect(run.message).toMatchObject({ platform: "slack", chat_type: "channel", chat_id: channel, user_id: user });
    const progress = await agentApi(`/v1/runs/${run.run_id}/progress`, run.run_token, { text: "thinking…" });
    expect(progress).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(posts().map((c) => c.json)).toEqual([
      { channel, text: "thinking…", thread_ts: messageThread.event.thread_ts },
    ]);
    const reply = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "done" });
    expect(reply.status).toBe(200);
    await runAlarm(key);
    expect(posts().map((c) => c.json.text)).toEqual(["thinking…", "done"]);
    const [session] = await sessionsOfKey(key);
    expect((await deliveriesOf(session!.id)).map((d) => [d.kind, d.status])).toEqual([
      ["progress", "sent"],
      ["reply", "sent"],
    ]);
  });
});

describe("send failures", () => {
  async function firstReply(): Promise<{ key: string; sessionId: string }> {
    const channel = unique("D");
    await post(eventFixture(messageIm, { channel }));
    const key = dmKey(channel);
    await runAlarm(key);
    const [session] = await sessionsOfKey(key);
    return { key, sessionId: session!.id };
  }

  it("retries ok:false ratelimited (HTTP 200) and records the attempts", async () => {
    slackAnswers = [() => Response.json({ ok: false, error: "ratelimited" })];
    const { key, sessionId } = await firstReply();
    expect(await deliveriesOf(sessionId)).toMatchObject([
      { kind: "reply", status: "pending", attempts: 1, last_status: 200, last_error: "slack: ratelimited" },
    ]);
    setNow(T0 + 5_000);
    await runAlarm(key);
    expect(await deliveriesOf(sessionId)).toMatchObject([{ status: "sent", attempts: 2, last_status: 200 }]);
    expect(posts()).toHaveLength(2);
  });

  it("records any other ok:false as failed, without retrying", async () => {
    slackAnswers = [() => Response.json({ ok: false, error: "channel_not_found" })];
    const { key, sessionId } = await firstReply();
    expect(await deliveriesOf(sessionId)).toMatchObject([
      { status: "failed", attempts: 1, last_status: 200, last_error: "slack: channel_not_found" },
    ]);
    expect((await router(key).outbox()).filter((i) => i.kind === "delivery")).toEqual([]);
    setNow(T0 + HOUR);
    await runAlarm(key);
    expect(posts()).toHaveLength(1);
  });
});
