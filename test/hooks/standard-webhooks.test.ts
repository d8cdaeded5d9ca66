/**
 * Standard Webhooks (spec "Lifecycle events"): every event POSTed to HOOK_URLS and
 * every reply POSTed to GENERIC_REPLY_URL verifies with the `standardwebhooks`
 * library's own `Webhook.verify`, on exactly what the gateway sent, for a plain
 * secret (its UTF-8 bytes are the key) and for a `whsec_<base64>` one. A retry keeps
 * its webhook-id and gets a fresh timestamp. The X-Sessiongate-* headers stay.
 */
import { env, exports } from "cloudflare:workers";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it } from "vitest";
import {
  MINUTE,
  T0,
  captureFetch,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  setNow,
  signedRequest,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const HOOK = "https://hooks.test/standard";
const REPLY_URL = "https://client.test/standard-replies";
const IDLE_60 = JSON.stringify({ mode: "idle", idle_minutes: 60 });
// A plain secret with a non-ASCII character: the key is its UTF-8 bytes.
const PLAIN = "hook-secret-é-plain";
// 24 random-looking bytes, base64: the key is the decoded bytes.
const WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

let outbound: { calls: Captured[]; restore: () => void } | null = null;
afterEach(() => {
  outbound?.restore();
  outbound = null;
  restoreClock();
  useConfig(null);
});

/** The verifier a receiver writes: a whsec_ secret as is, a plain one as its UTF-8 bytes. */
function receiver(secret: string): Webhook {
  return secret.startsWith("whsec_")
    ? new Webhook(secret)
    : new Webhook(new TextEncoder().encode(secret), { format: "raw" });
}

function verify(secret: string, call: Captured): unknown {
  return receiver(secret).verify(call.body, call.headers);
}

describe.each([
  ["a plain secret", PLAIN],
  ["a whsec_ secret", WHSEC],
])("events signed with %s", (_label, secret) => {
  it("verify with Webhook.verify, keep X-Sessiongate-*, and a retry keeps its id with a fresh timestamp", async () => {
    setNow(T0);
    useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK, HOOK_SECRET: secret });
    let fail = true;
    outbound = captureFetch((request) => {
      if (request.url !== HOOK) throw new Error(`unexpected outbound request to ${request.url}`);
      return fail ? new Response("down", { status: 503 }) : new Response("ok");
    });
    const chat = unique("chat");
    await send({ chat_id: chat, text: "hi" });
    await runAlarm(genericKey(chat));
    const first = outbound.calls.find((c) => c.json?.type === "session.started")!;
    expect(first).toBeDefined();
    expect(first.headers["webhook-id"]).toBe(first.json.id);
    expect(first.headers["x-sessiongate-event"]).toBe(first.json.id);
    expect(first.headers["x-sessiongate-signature"]).toMatch(/^sha256=[0-9a-f]{64}$/);
    expect(first.headers["webhook-timestamp"]).toBe(String(Math.floor(T0 / 1000)));
    expect(verify(secret, first)).toEqual(first.json);
    // A receiver with another key, or a body changed on the way, refuses it.
    expect(() => verify("whsec_" + btoa("another key"), first)).toThrow();
    expect(() => receiver(secret).verify(first.body.replace('"hi"', '"ho"') + " ", first.headers)).toThrow();

    // The retry, two minutes later: same id, fresh timestamp, still verifies.
    fail = false;
    setNow(T0 + 2 * MINUTE);
    await runAlarm(genericKey(chat));
    const retries = outbound.calls.filter((c) => c.json?.id === first.json.id);
    expect(retries.length).toBeGreaterThanOrEqual(2);
    const retry = retries.at(-1)!;
    expect(retry.headers["webhook-id"]).toBe(first.json.id);
    expect(retry.headers["webhook-timestamp"]).toBe(String(Math.floor((T0 + 2 * MINUTE) / 1000)));
    expect(verify(secret, retry)).toEqual(first.json);
    // The first attempt's timestamp is now more than 5 minutes old: refused as a replay.
    setNow(T0 + 10 * MINUTE);
    expect(() => verify(secret, first)).toThrow();
  });
});

describe.each([
  ["a plain secret", "generic-secret-plain"],
  ["a whsec_ secret", "whsec_c2Vzc2lvbmdhdGUgZ2VuZXJpYyBrZXk="],
])("generic replies signed with %s", (_label, secret) => {
  it("verify with Webhook.verify, the delivery id as webhook-id, kept by a retry", async () => {
    setNow(T0);
    useConfig({ SESSION_RESET: IDLE_60, GENERIC_REPLY_URL: REPLY_URL, GENERIC_WEBHOOK_SECRET: secret });
    let fail = true;
    outbound = captureFetch((request) => {
      if (request.url !== REPLY_URL) throw new Error(`unexpected outbound request to ${request.url}`);
      return fail ? new Response("down", { status: 503 }) : new Response("ok");
    });
    const chat = unique("chat");
    const body = JSON.stringify({
      event_id: unique("evt"),
      chat_id: chat,
      chat_type: "dm",
      user_id: "u1",
      text: "ping",
    });
    const response = await exports.default.fetch(await signedRequest(body, secret));
    expect(response.status).toBe(200);
    const { session_id } = (await response.json()) as { session_id: string };
    await runAlarm(genericKey(chat));
    expect(outbound.calls).toHaveLength(1);
    const reply = outbound.calls[0]!;
    expect(reply.json).toMatchObject({ kind: "reply", text: "echo: ping" });
    expect(verify(secret, reply)).toEqual(reply.json);
    const delivery = await env.DB.prepare(`SELECT id FROM deliveries WHERE session_id = ?`)
      .bind(session_id)
      .first<{ id: string }>();
    expect(reply.headers["webhook-id"]).toBe(delivery!.id);

    fail = false;
    setNow(T0 + 2 * MINUTE);
    await runAlarm(genericKey(chat));
    expect(outbound.calls).toHaveLength(2);
    const retry = outbound.calls[1]!;
    expect(retry.headers["webhook-id"]).toBe(delivery!.id);
    expect(retry.headers["webhook-timestamp"]).toBe(String(Math.floor((T0 + 2 * MINUTE) / 1000)));
    expect(verify(secret, retry)).toEqual(reply.json);
  });
});
