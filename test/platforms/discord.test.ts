/**
 * Discord (`POST /webhooks/discord`, the interactions endpoint) end to end:
 * Ed25519 signatures made in the test with a fresh key pair, PING, application
 * commands mapped to session keys, dedupe on the interaction id, /new /reset
 * /stop answered in the response, and replies by editing the deferred response
 * (long ones split into followups), with failures visible in the operator API.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeAll, beforeEach, describe, expect, it, vi } from "vitest";
import { toHex } from "../../src/crypto";
import { accepted, agentApi, AGENT_TOKEN, AGENT_URL } from "../agent/support";
import commandDm from "../fixtures/discord/command-dm.json";
import commandGroupDm from "../fixtures/discord/command-group-dm.json";
import commandGuild from "../fixtures/discord/command-guild.json";
import commandNew from "../fixtures/discord/command-new.json";
import commandNoText from "../fixtures/discord/command-no-text.json";
import commandSubcommand from "../fixtures/discord/command-subcommand.json";
import commandThread from "../fixtures/discord/command-thread.json";
import component from "../fixtures/discord/component.json";
import ping from "../fixtures/discord/ping.json";
import {
  BASE,
  MINUTE,
  T0,
  captureFetch,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  sessionsOfKey,
  setNow,
  useConfig,
  type Captured,
  tableCounts,
  deliveriesOf,
} from "../helpers";
import { adapterContract } from "./contract";

const APP_ID = commandGuild.application_id;
const TOKEN = commandGuild.token;
const DISCORD_API = "https://discord.test/api/v10";
const WEBHOOK = `${DISCORD_API}/webhooks/${APP_ID}/${TOKEN}`;
const ORIGINAL = `${WEBHOOK}/messages/@original`;
const NO_MENTIONS = { parse: [] };

let keys: CryptoKeyPair;
let otherKeys: CryptoKeyPair;
let publicKeyHex: string;

beforeAll(async () => {
  const generate = () =>
    crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]) as Promise<CryptoKeyPair>;
  keys = await generate();
  otherKeys = await generate();
  publicKeyHex = toHex((await crypto.subtle.exportKey("raw", keys.publicKey)) as ArrayBuffer);
});

const discordConfig = (extra: Record<string, string> = {}) => ({
  DISCORD_PUBLIC_KEY: publicKeyHex,
  DISCORD_APPLICATION_ID: APP_ID,
  DISCORD_API_BASE: DISCORD_API,
  SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
  ...extra,
});

/** How the fake Discord API answers the next webhook calls (default: 200 with a message). */
let discordAnswers: (() => Response)[] = [];
let agentAnswer: (() => Response) | null = null;
let outbound: { calls: Captured[]; restore: () => void };

const okAnswer = () => Response.json({ id: "1190000000000000999", type: 20, content: "…", channel_id: "1" });

beforeEach(() => {
  setNow(T0);
  useConfig(discordConfig());
  discordAnswers = [];
  agentAnswer = null;
  outbound = captureFetch((request) => {
    if (request.url.startsWith(`${DISCORD_API}/webhooks/`)) return (discordAnswers.shift() ?? okAnswer)();
    if (request.url === AGENT_URL && agentAnswer) return agentAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

const discordCalls = () =>
  outbound.calls
    .filter((c) => c.url.startsWith(`${DISCORD_API}/`))
    .map((c) => ({ method: c.method, url: c.url, json: c.json }));

// ------------------------------------------------------------------ requests

type Json = Record<string, any>;

const EPOCH = 1_420_070_400_000n;
let sequence = BigInt(Math.floor(Math.random() * 1000)) << 12n;
/** A fresh snowflake near the fake clock (storage is shared by the tests of this file). */
function snowflake(): string {
  sequence += 1n;
  return String(((BigInt(Date.now()) - EPOCH) << 22n) | (sequence & 0x3fffffn));
}

interface Ids {
  user?: string;
  channel?: string;
  text?: string;
}

/** A fixture with a fresh interaction id and this test's own user and channel ids. */
function interaction(fixture: Json, ids: Ids = {}): Json {
  const body = structuredClone(fixture);
  body.id = snowflake();
  if (ids.user) {
    if (body.member) body.member.user.id = ids.user;
    if (body.user) body.user.id = ids.user;
  }
  if (ids.channel) {
    if (body.channel?.type === 11) body.channel.parent_id = ids.channel;
    else {
      body.channel.id = ids.channel;
      body.channel_id = ids.channel;
    }
  }
  if (ids.text !== undefined) body.data.options[0].value = ids.text;
  return body;
}

function command(fixture: Json, name: string, ids: Ids = {}): Json {
  const body = interaction(fixture, ids);
  body.data = { id: "1190000000000000901", name, type: 1 };
  return body;
}

interface SignOptions {
  key?: CryptoKey;
  timestamp?: number | string;
  signedTimestamp?: number | string;
  signature?: string | null;
  omitTimestamp?: boolean;
}

const encoder = new TextEncoder();

async function discordRequest(body: string, options: SignOptions = {}): Promise<Request> {
  const timestamp = String(options.timestamp ?? Math.floor(Date.now() / 1000));
  const signedTimestamp = String(options.signedTimestamp ?? timestamp);
  const signature =
    options.signature === undefined
      ? toHex(
          await crypto.subtle.sign(
            { name: "Ed25519" },
            options.key ?? keys.privateKey,
            encoder.encode(`${signedTimestamp}${body}`),
          ),
        )
      : options.signature;
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (!options.omitTimestamp) headers["x-signature-timestamp"] = timestamp;
  if (signature !== null) headers["x-signature-ed25519"] = signature;
  return new Request(`${BASE}/webhooks/discord`, { method: "POST", headers, body });
}

async function post(body: Json | string, options: SignOptions = {}) {
  const raw = typeof body === "string" ? body : JSON.stringify(body);
  const response = await exports.default.fetch(await discordRequest(raw, options));
  return { status: response.status, body: (await response.json()) as any };
}

const DEFERRED = { type: 5 };
const dmKey = (user: string) => `discord:dm:${user}`;
const channelKey = (channel: string, user: string) => `discord:channel:${channel}:${user}`;
const id = () => snowflake();

// What every adapter must do (dedupe, commands, notices, delivery retries, no silent
// drop), run with this file's requests and fake Discord API. A reply edits the
// interaction's deferred response (@original); commands are answered in the response.
adapterContract({
  platform: "discord",
  chat: () => {
    const user = id();
    return { key: dmKey(user), user };
  },
  message: (chat, text) => interaction(commandDm, { user: chat.user, text }),
  eventId: (body) => body.id,
  post: (body) => post(body),
  accepted: DEFERRED,
  commandAnswer: { in: "response", body: (content) => ({ type: 4, data: { content } }) },
  sends: () => discordCalls(),
  sendTo: (_chat, content) => ({ method: "PATCH", url: ORIGINAL, json: { content, allowed_mentions: NO_MENTIONS } }),
  answerNext: (...answers) => discordAnswers.push(...answers),
  failures: {
    serverErrors: [() => new Response("bad gateway", { status: 502 })],
    // The body's retry_after (seconds, a float) wins over the rounded-up Retry-After header.
    rateLimit: {
      answer: () =>
        Response.json(
          { message: "You are being rate limited.", retry_after: 1.5, global: false },
          { status: 429, headers: { "retry-after": "2" } },
        ),
      retryAfterMs: 1_500,
    },
    permanent: [
      ...[401, 404].map((status) => ({
        what: `Discord's ${status} (token expired or unknown)`,
        answer: () => Response.json({ message: "Unknown Webhook", code: 10015 }, { status }),
        error: "interaction token expired or unknown",
      })),
      {
        what: "another 4xx",
        answer: () => Response.json({ message: "Invalid Form Body", code: 50035 }, { status: 400 }),
      },
    ],
  },
});

// ------------------------------------------------------------------ tests

describe("configuration", () => {
  it("answers 404 while no Discord secret is set, and stores nothing", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) });
    const before = await tableCounts();
    const response = await post(interaction(commandDm, { user: id() }));
    expect(response.status).toBe(404);
    expect(await tableCounts()).toEqual(before);
  });

  it("answers 500 naming DISCORD_APPLICATION_ID when only the public key is set", async () => {
    useConfig({ DISCORD_PUBLIC_KEY: publicKeyHex });
    const response = await post(ping);
    expect(response.status).toBe(500);
    expect(response.body.error).toEqual({
      code: "invalid_config",
      message: expect.stringContaining("DISCORD_APPLICATION_ID"),
    });
  });

  it("answers 500 naming DISCORD_PUBLIC_KEY when only the application id is set", async () => {
    useConfig({ DISCORD_APPLICATION_ID: APP_ID });
    const response = await post(ping);
    expect(response.status).toBe(500);
    expect(response.body.error.message).toContain("DISCORD_PUBLIC_KEY");
  });

  for (const [what, value] of [
    ["not hex", "z".repeat(64)],
    ["too short", "ab".repeat(31)],
  ]) {
    it(`answers 500 naming DISCORD_PUBLIC_KEY when the key is ${what}`, async () => {
      useConfig(discordConfig({ DISCORD_PUBLIC_KEY: value! }));
      const response = await post(ping);
      expect(response.status).toBe(500);
      expect(response.body.error.message).toContain("DISCORD_PUBLIC_KEY");
    });
  }
});

describe("PING", () => {
  it("answers a signed PING with PONG", async () => {
    expect(await post(ping)).toEqual({ status: 200, body: { type: 1 } });
  });

  it("refuses a PING with a bad signature (Discord's own endpoint check)", async () => {
    const response = await post(ping, { key: otherKeys.privateKey });
    expect(response.status).toBe(401);
  });
});

describe("verification: refused with 401, nothing stored", () => {
  const now = () => Math.floor(T0 / 1000);
  const cases: [string, (body: string) => Promise<Request>][] = [
    ["a missing X-Signature-Ed25519", (body) => discordRequest(body, { signature: null })],
    ["a missing X-Signature-Timestamp", (body) => discordRequest(body, { omitTimestamp: true })],
    ["a signature by another key", (body) => discordRequest(body, { key: otherKeys.privateKey })],
    [
      "a signature of other bytes",
      async (body) => new Request(await discordRequest(body), { body: body.replace("hello", "jello") }),
    ],
    ["a signature over another timestamp", (body) => discordRequest(body, { signedTimestamp: now() - 1 })],
    ["a signature that is too short", (body) => discordRequest(body, { signature: "ab".repeat(63) })],
    ["a signature that is too long", (body) => discordRequest(body, { signature: "ab".repeat(65) })],
    ["a signature that is not hex", (body) => discordRequest(body, { signature: "zz".repeat(64) })],
    ["an empty signature", (body) => discordRequest(body, { signature: "" })],
    ["a well-formed signature of zeros", (body) => discordRequest(body, { signature: "00".repeat(64) })],
    ["a timestamp 301 s old", (body) => discordRequest(body, { timestamp: now() - 301 })],
    ["a timestamp that is not a number", (body) => discordRequest(body, { timestamp: "now" })],
  ];
  for (const [name, build] of cases) {
    it(`refuses ${name}`, async () => {
      const before = await tableCounts();
      const body = JSON.stringify(interaction(commandDm, { user: id() }));
      const response = await exports.default.fetch(await build(body));
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual({
        error: { code: "bad_signature", message: "missing or invalid X-Signature-Ed25519 or X-Signature-Timestamp" },
      });
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("the signing window's edge", () => {
  const now = () => Math.floor(T0 / 1000);
  // The window is inclusive: exactly five minutes either way is still accepted.
  for (const [name, offset] of [
    ["exactly 300 s old", -300],
    ["exactly 300 s ahead", 300],
  ] as const) {
    it(`accepts a timestamp ${name}, and refuses one a second further with 401, storing nothing`, async () => {
      const user = id();
      expect(await post(interaction(commandDm, { user }), { timestamp: now() + offset })).toEqual({
        status: 200,
        body: DEFERRED,
      });
      expect(await sessionsOfKey(dmKey(user))).toHaveLength(1);

      const before = await tableCounts();
      const late = id();
      const refused = await post(interaction(commandDm, { user: late }), {
        timestamp: now() + offset + Math.sign(offset),
      });
      expect(refused).toEqual({ status: 401, body: { error: { code: "bad_signature", message: expect.any(String) } } });
      expect(await tableCounts()).toEqual(before);
      expect(await sessionsOfKey(dmKey(late))).toHaveLength(0);
    });
  }
});

// workerd's Web Crypto imports any 32 bytes as an Ed25519 key and never throws in
// verify once the lengths are right, so these paths are reached by making
// crypto.subtle refuse, as another runtime or a future one may.
describe("when Web Crypto refuses the key or the signature", () => {
  let warnings: string[];
  beforeEach(() => {
    warnings = [];
    vi.spyOn(console, "warn").mockImplementation((...args: unknown[]) => void warnings.push(args.join(" ")));
  });
  afterEach(() => vi.restoreAllMocks());

  it("answers 500 invalid_config naming DISCORD_PUBLIC_KEY when the key cannot be imported, stores nothing, and imports again next time", async () => {
    // A key of its own, so no import cached by an earlier test answers for it.
    const own = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
    useConfig(
      discordConfig({
        DISCORD_PUBLIC_KEY: toHex((await crypto.subtle.exportKey("raw", own.publicKey)) as ArrayBuffer),
      }),
    );
    vi.spyOn(crypto.subtle, "importKey").mockRejectedValueOnce(new DOMException("unusable key", "DataError"));

    const before = await tableCounts();
    const user = id();
    const refused = await post(interaction(commandDm, { user }), { key: own.privateKey });
    expect(refused.status).toBe(500);
    expect(refused.body.error).toEqual({
      code: "invalid_config",
      message: expect.stringMatching(/DISCORD_PUBLIC_KEY.*not a usable Ed25519 public key.*unusable key/),
    });
    expect(await tableCounts()).toEqual(before);

    // The failed import is not cached: once the runtime accepts the key, so does the gateway.
    expect(await post(interaction(commandDm, { user }), { key: own.privateKey })).toEqual({
      status: 200,
      body: DEFERRED,
    });
    expect(await sessionsOfKey(dmKey(user))).toHaveLength(1);
  });

  it("refuses with 401 and logs a warning when verify throws on a well-formed signature, storing nothing", async () => {
    vi.spyOn(crypto.subtle, "verify").mockRejectedValueOnce(new DOMException("verify refused", "OperationError"));
    const before = await tableCounts();
    const user = id();
    const refused = await post(interaction(commandDm, { user }));
    expect(refused).toEqual({ status: 401, body: { error: { code: "bad_signature", message: expect.any(String) } } });
    expect(await tableCounts()).toEqual(before);
    expect(await sessionsOfKey(dmKey(user))).toHaveLength(0);
    const lines = warnings.map((line) => JSON.parse(line));
    expect(lines).toContainEqual(
      expect.objectContaining({
        level: "warn",
        msg: "discord: signature check threw",
        error: expect.stringContaining("verify refused"),
      }),
    );
  });
});

describe("malformed bodies after a valid signature: 400, nothing stored", () => {
  const cases: [string, () => Json | string][] = [
    ["invalid JSON", () => `{"type": 2, "data": `],
    ["an interaction without a type", () => ({ id: id(), token: TOKEN })],
    [
      "a command without a token",
      () => {
        const body = interaction(commandDm, { user: id() });
        delete body.token;
        return body;
      },
    ],
    [
      "a guild command without its member",
      () => {
        const body = interaction(commandGuild, { channel: id() });
        delete body.member;
        return body;
      },
    ],
  ];
  for (const [name, build] of cases) {
    it(`refuses ${name}`, async () => {
      const before = await tableCounts();
      const response = await post(build());
      expect(response.status).toBe(400);
      expect(response.body.error.code).toMatch(/^invalid_(json|body)$/);
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("application commands: chat types, threads and replies", () => {
  it("a command in the app's DM is keyed by the user, deferred, and answered by editing @original", async () => {
    const user = id();
    const response = await post(interaction(commandDm, { user }));
    expect(response).toEqual({ status: 200, body: DEFERRED });
    expect(outbound.calls).toHaveLength(0);
    const [session] = await sessionsOfKey(dmKey(user));
    expect(session).toMatchObject({ platform: "discord", chat_type: "dm", end_reason: null });
    expect((await messagesOf(session!.id)).map((m) => [m.role, m.text])).toEqual([["user", "hello in private"]]);

    await runAlarm(dmKey(user));
    expect(discordCalls()).toEqual([
      { method: "PATCH", url: ORIGINAL, json: { content: "echo: hello in private", allowed_mentions: NO_MENTIONS } },
    ]);
    expect(outbound.calls[0]!.headers["content-type"]).toBe("application/json");
    expect(outbound.calls[0]!.headers.authorization).toBeUndefined();
    expect((await deliveriesOf(session!.id)).map((d) => [d.kind, d.status, d.attempts, d.last_status])).toEqual([
      ["reply", "sent", 1, 200],
    ]);
  });

  it("a command in a guild channel is keyed by channel and user", async () => {
    const channel = id();
    const user = id();
    expect(await post(interaction(commandGuild, { channel, user }))).toEqual({ status: 200, body: DEFERRED });
    // The channel's parent_id is its category, not a thread parent: no thread part.
    const [session] = await sessionsOfKey(channelKey(channel, user));
    expect(session).toMatchObject({ chat_type: "channel" });
    const other = id();
    await post(interaction(commandGuild, { channel, user: other }));
    expect(await sessionsOfKey(channelKey(channel, other))).toHaveLength(1);
    await runAlarm(channelKey(channel, user));
    expect(discordCalls()).toEqual([
      {
        method: "PATCH",
        url: ORIGINAL,
        json: { content: "echo: hello from the guild", allowed_mentions: NO_MENTIONS },
      },
    ]);
  });

  it("a command in a thread is keyed by the parent channel, the thread and the user", async () => {
    const parent = id();
    const user = id();
    await post(interaction(commandThread, { channel: parent, user }));
    const key = `discord:channel:${parent}:${commandThread.channel.id}:${user}`;
    const [session] = await sessionsOfKey(key);
    expect((await messagesOf(session!.id)).map((m) => m.text)).toEqual(["hello from the thread"]);
    expect(await sessionsOfKey(channelKey(parent, user))).toEqual([]);
    await runAlarm(key);
    expect(discordCalls().map((c) => c.json.content)).toEqual(["echo: hello from the thread"]);
  });

  it("a command in a group DM (user-installed app) is a group keyed by that channel and user", async () => {
    const channel = id();
    const user = id();
    await post(interaction(commandGroupDm, { channel, user }));
    expect(await sessionsOfKey(`discord:group:${channel}:${user}`)).toHaveLength(1);
    expect(await sessionsOfKey(dmKey(user))).toEqual([]);
  });

  it("takes the first STRING option whatever its name", async () => {
    const user = id();
    const body = interaction(commandDm, { user });
    body.data.options = [
      { name: "count", type: 4, value: 3 },
      { name: "message", type: 3, value: "named message" },
      { name: "later", type: 3, value: "not this one" },
    ];
    await post(body);
    const [session] = await sessionsOfKey(dmKey(user));
    expect((await messagesOf(session!.id)).map((m) => m.text)).toEqual(["named message"]);
  });

  it("finds the STRING option inside a subcommand", async () => {
    const channel = id();
    const user = id();
    await post(interaction(commandSubcommand, { channel, user }));
    const [session] = await sessionsOfKey(channelKey(channel, user));
    expect((await messagesOf(session!.id)).map((m) => m.text)).toEqual(["nested question"]);
  });
});

describe("interactions that carry no text: answered, nothing stored", () => {
  it("a command without a string option gets a short ephemeral explanation", async () => {
    const before = await tableCounts();
    const response = await post(interaction(commandNoText, { channel: id(), user: id() }));
    expect(response).toEqual({
      status: 200,
      body: { type: 4, data: { content: "This command needs some text to send to the agent.", flags: 64 } },
    });
    expect(await tableCounts()).toEqual(before);
  });

  it("a component interaction is not supported", async () => {
    const before = await tableCounts();
    const response = await post(interaction(component, { channel: id(), user: id() }));
    expect(response).toEqual({
      status: 200,
      body: { type: 4, data: { content: "This interaction is not supported.", flags: 64 } },
    });
    expect(await tableCounts()).toEqual(before);
  });

  it("autocomplete gets no choices", async () => {
    const body = interaction(commandGuild, { channel: id(), user: id() });
    body.type = 4;
    expect(await post(body)).toEqual({ status: 200, body: { type: 8, data: { choices: [] } } });
  });
});

describe("commands /new, /reset, /stop", () => {
  it("/new ends the channel session and is answered with type 4 only", async () => {
    const channel = id();
    const user = id();
    await post(interaction(commandGuild, { channel, user }));
    await runAlarm(channelKey(channel, user));
    const response = await post(command(commandNew, "new", { channel, user }));
    expect(response).toEqual({ status: 200, body: { type: 4, data: { content: "Started a new session." } } });
    const sessions = await sessionsOfKey(channelKey(channel, user));
    expect(sessions.map((s) => s.end_reason)).toEqual(["new_command", null]);
    expect(await messagesOf(sessions[1]!.id)).toEqual([]);
    await runAlarm(channelKey(channel, user));
    expect(discordCalls().map((c) => c.json.content)).toEqual(["echo: hello from the guild"]);
    expect(await deliveriesOf(sessions[1]!.id)).toEqual([]);
  });

  it("/reset in a DM starts a new session", async () => {
    const user = id();
    await post(interaction(commandDm, { user }));
    const response = await post(command(commandDm, "reset", { user }));
    expect(response.body).toEqual({ type: 4, data: { content: "Started a new session." } });
    expect((await sessionsOfKey(dmKey(user))).map((s) => s.end_reason)).toEqual(["new_command", null]);
  });

  it("/stop suspends the session; with nothing to stop it says so", async () => {
    const user = id();
    expect((await post(command(commandDm, "stop", { user }))).body).toEqual({
      type: 4,
      data: { content: "There is no session to stop." },
    });
    await post(interaction(commandDm, { user }));
    expect((await post(command(commandDm, "stop", { user }))).body).toEqual({
      type: 4,
      data: { content: "Stopped. Your next message starts a new session." },
    });
    expect((await sessionsOfKey(dmKey(user))).map((s) => s.end_reason)).toEqual(["suspended"]);
  });

  it("a repeated command interaction is handled once and still answered", async () => {
    const user = id();
    const body = command(commandDm, "new", { user });
    expect((await post(body)).body.data.content).toBe("Started a new session.");
    expect(await post(body)).toEqual({
      status: 200,
      body: { type: 4, data: { content: "This command was already handled." } },
    });
    expect(await sessionsOfKey(dmKey(user))).toHaveLength(1);
  });
});

describe("long replies and progress", () => {
  it("edits @original with the first 2,000 characters and sends the rest as followups", async () => {
    const user = id();
    const text = "x".repeat(4500);
    await post(interaction(commandDm, { user, text }));
    await runAlarm(dmKey(user));
    const reply = `echo: ${text}`;
    expect(discordCalls()).toEqual([
      { method: "PATCH", url: ORIGINAL, json: { content: reply.slice(0, 2000), allowed_mentions: NO_MENTIONS } },
      { method: "POST", url: WEBHOOK, json: { content: reply.slice(2000, 4000), allowed_mentions: NO_MENTIONS } },
      { method: "POST", url: WEBHOOK, json: { content: reply.slice(4000), allowed_mentions: NO_MENTIONS } },
    ]);
  });

  it("retries a long reply whose first followup failed: the edit repeats, nothing is posted twice", async () => {
    discordAnswers = [okAnswer, () => new Response("unavailable", { status: 503 })];
    const user = id();
    const text = "y".repeat(4500);
    await post(interaction(commandDm, { user, text }));
    await runAlarm(dmKey(user));
    const [session] = await sessionsOfKey(dmKey(user));
    expect(await deliveriesOf(session!.id)).toMatchObject([{ status: "pending", attempts: 1, last_status: 503 }]);
    setNow(T0 + 1_000);
    await runAlarm(dmKey(user));
    expect(discordCalls().map((c) => c.method)).toEqual(["PATCH", "POST", "PATCH", "POST", "POST"]);
    expect(await deliveriesOf(session!.id)).toMatchObject([{ status: "sent", attempts: 2 }]);
  });

  it("does not retry a long reply once a followup is out, so no part is shown twice", async () => {
    discordAnswers = [okAnswer, okAnswer, () => new Response("unavailable", { status: 503 })];
    const user = id();
    await post(interaction(commandDm, { user, text: "z".repeat(4500) }));
    await runAlarm(dmKey(user));
    const [session] = await sessionsOfKey(dmKey(user));
    const [delivery] = await deliveriesOf(session!.id);
    expect(delivery).toMatchObject({ status: "failed", attempts: 1, last_status: 503 });
    expect(delivery.last_error).toContain("part 3 of 3");
    expect((await router(dmKey(user)).outbox()).filter((i) => i.kind === "delivery")).toEqual([]);
  });

  it("splits at a line break in the second half of a chunk when there is one", async () => {
    const user = id();
    const text = `${"a".repeat(1500)}\n${"b".repeat(1000)}`;
    await post(interaction(commandDm, { user, text }));
    await runAlarm(dmKey(user));
    expect(discordCalls().map((c) => [c.method, c.json.content])).toEqual([
      ["PATCH", `echo: ${"a".repeat(1500)}`],
      ["POST", "b".repeat(1000)],
    ]);
  });

  it("sends progress as a followup, never as an edit of @original", async () => {
    useConfig(discordConfig({ AGENT_URL, AGENT_TOKEN }));
    agentAnswer = accepted;
    const channel = id();
    const user = id();
    expect(await post(interaction(commandGuild, { channel, user }))).toEqual({ status: 200, body: DEFERRED });
    await runAlarm(channelKey(channel, user));
    const run = outbound.calls.find((c) => c.url === AGENT_URL)!.json;
    expect(run.message).toMatchObject({ platform: "discord", chat_type: "channel", chat_id: channel, user_id: user });
    const progress = await agentApi(`/v1/runs/${run.run_id}/progress`, run.run_token, { text: "looking it up…" });
    expect(progress).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "found it" })).status).toBe(200);
    await runAlarm(channelKey(channel, user));
    expect(discordCalls()).toEqual([
      { method: "POST", url: WEBHOOK, json: { content: "looking it up…", allowed_mentions: NO_MENTIONS } },
      { method: "PATCH", url: ORIGINAL, json: { content: "found it", allowed_mentions: NO_MENTIONS } },
    ]);
    const [session] = await sessionsOfKey(channelKey(channel, user));
    expect((await deliveriesOf(session!.id)).map((d) => [d.kind, d.status])).toEqual([
      ["progress", "sent"],
      ["reply", "sent"],
    ]);
  });
});

describe("send failures", () => {
  async function firstReply(): Promise<{ key: string; sessionId: string }> {
    const user = id();
    await post(interaction(commandDm, { user }));
    const key = dmKey(user);
    await runAlarm(key);
    const [session] = await sessionsOfKey(key);
    return { key, sessionId: session!.id };
  }

  it("does not call Discord once the token is past its 15 minutes, and records the reply as failed", async () => {
    const user = id();
    await post(interaction(commandDm, { user }));
    setNow(T0 + 15 * MINUTE);
    await runAlarm(dmKey(user));
    expect(discordCalls()).toEqual([]);
    const [session] = await sessionsOfKey(dmKey(user));
    const [delivery] = await deliveriesOf(session!.id);
    expect(delivery).toMatchObject({ status: "failed", attempts: 1, last_status: null });
    expect(delivery.last_error).toContain("expired");
  });

  it("gives up a retry that would fall past the token's 15 minutes", async () => {
    discordAnswers = [() => new Response("unavailable", { status: 503 })];
    const { key, sessionId } = await firstReply();
    expect(await deliveriesOf(sessionId)).toMatchObject([{ status: "pending", attempts: 1 }]);
    setNow(T0 + 16 * MINUTE);
    await runAlarm(key);
    expect(await deliveriesOf(sessionId)).toMatchObject([{ status: "failed", attempts: 2, last_status: null }]);
    expect(discordCalls()).toHaveLength(1);
  });
});
