/**
 * Logs (spec "Configuration"): every line the gateway writes in a full scenario is
 * one JSON object with `level` and `msg`; each routed message has its line naming
 * the decision; every failed hand-off, reply delivery and event attempt has a line;
 * and no line carries a secret, a token, a message's text, or a URL with a
 * credential, even when the services called answer with an echo of what they got.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import {
  ADMIN_TOKEN,
  BASE,
  GENERIC_SECRET,
  MINUTE,
  T0,
  captureFetch,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const HOOK_SECRET = "hook-secret-Kilo-5512";
const AGENT_TOKEN = "agent-token-Lima-8830";
const TG_TOKEN = "7000000002:AAlog-test-bot-token-xyz";
const TG_SECRET = "tg-webhook-secret-Mike-2291";
// Credentials carried in configured URLs: userinfo, and a query parameter.
const HOOK_WITH_USERINFO = "https://hookuser:hook-password-Oscar@hooks.test/a";
const HOOK_WITH_QUERY = "https://hooks.test/b?token=hook-query-token-Papa";
const AGENT_URL = "https://agent.test/runs?key=agent-query-key-Quebec";
const REPLY_URL = "https://client.test/replies?sig=reply-query-sig-Romeo";
const TG_API = "https://telegram.test";

const TEXTS = ["first words Bravo-7731", "second words Charlie-1184", "after the break Delta-3307"];
const AGENT_REPLY = "the agent says Echo-6620";
const TG_TEXT = "telegram words Foxtrot-4419";

let lines: string[] = [];
let spies: { mockRestore: () => void }[] = [];
let outbound: { calls: Captured[]; restore: () => void };
let agentDown = true;

beforeEach(() => {
  setNow(T0);
  useConfig({
    SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
    HOOK_URLS: `${HOOK_WITH_USERINFO},${HOOK_WITH_QUERY}`,
    HOOK_SECRET,
    AGENT_URL,
    AGENT_TOKEN,
    GENERIC_REPLY_URL: REPLY_URL,
    TELEGRAM_BOT_TOKEN: TG_TOKEN,
    TELEGRAM_WEBHOOK_SECRET: TG_SECRET,
    TELEGRAM_API_BASE: TG_API,
  });
  lines = [];
  spies = (["log", "info", "warn", "error", "debug"] as const).map((method) =>
    vi.spyOn(console, method).mockImplementation((...args: unknown[]) => {
      lines.push(args.map(String).join(" "));
    }),
  );
  // Every service fails at first and answers with an echo of what it received.
  outbound = captureFetch((request) => {
    const echo = (status: number) => new Response(`echo of ${request.body}`, { status });
    if (request.url.startsWith("https://agent.test/"))
      return agentDown ? echo(503) : Response.json({ reply: AGENT_REPLY });
    if (new URL(request.url).host === "hooks.test") return echo(500);
    if (request.url.startsWith("https://client.test/")) return echo(502);
    if (request.url.startsWith(`${TG_API}/`)) return echo(500);
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  for (const spy of spies) spy.mockRestore();
  outbound.restore();
  restoreClock();
  useConfig(null);
});

async function telegram(text: string): Promise<Response> {
  const update = {
    update_id: 815_000_000 + Math.floor(Math.random() * 100_000),
    message: {
      message_id: 7,
      from: { id: 90_001, is_bot: false, first_name: "Ada" },
      chat: { id: 90_001, type: "private", first_name: "Ada" },
      date: 1_700_000_000,
      text,
    },
  };
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/telegram`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": TG_SECRET },
      body: JSON.stringify(update),
    }),
  );
}

it("a full scenario logs JSON lines with decisions and failures, and never a secret, token or text", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text: TEXTS[0] });
  expect(first.status).toBe(200);
  expect((await send({ chat_id: chat, text: TEXTS[0], event_id: first.eventId })).body.duplicate).toBe(true);
  await runAlarm(key); // hand-off fails (503), events fail
  agentDown = false;
  setNow(T0 + 10_000);
  await runAlarm(key); // hand-off succeeds, the reply delivery fails
  expect((await send({ chat_id: chat, text: TEXTS[1] })).status).toBe(200);
  await runAlarm(key);
  // Past the idle deadline before the alarm ran: this message ends the old session.
  setNow(T0 + 2 * 60 * MINUTE);
  expect((await send({ chat_id: chat, text: TEXTS[2] })).status).toBe(200);
  expect((await send({ chat_id: chat, text: "/new" })).status).toBe(200);
  await runAlarm(key);
  expect((await telegram(TG_TEXT)).status).toBe(200);
  await runAlarm("telegram:dm:90001");
  // An operator call with a wrong token, and one with the right one.
  await exports.default.fetch(
    new Request(`${BASE}/admin/sessions?key=${key}`, { headers: { authorization: "Bearer nope" } }),
  );
  const listed = await exports.default.fetch(
    new Request(`${BASE}/admin/sessions?key=${encodeURIComponent(key)}`, {
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    }),
  );
  expect(listed.status).toBe(200);

  // Every line is one JSON object with a level and a message.
  expect(lines.length).toBeGreaterThan(5);
  const entries = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
  for (const entry of entries) {
    expect(["debug", "info", "warn", "error"]).toContain(entry.level);
    expect(typeof entry.msg).toBe("string");
  }
  const routed = entries.filter((e) => e.msg === "message routed" && e.session_key === key);
  expect(routed.map((e) => e.decision)).toEqual(["fresh", "duplicate", "append", "promoted", "command"]);
  for (const entry of routed) {
    expect(entry.request_id).toMatch(/^req_/);
    expect(typeof entry.ms).toBe("number");
  }
  const msgs = new Set(entries.map((e) => e.msg));
  expect(msgs).toContain("agent hand-off failed");
  expect(msgs).toContain("reply delivery failed");
  expect(msgs).toContain("event delivery failed");
  const hookLines = entries.filter((e) => e.msg === "event delivery failed");
  // A hook URL is logged as its scheme and host only: it may carry a credential.
  expect(hookLines.map((e) => e.hook)).toContain("https://hooks.test");

  // Nothing that must stay out of the logs is in them.
  const runTokens = outbound.calls
    .filter((c) => c.url.startsWith("https://agent.test/"))
    .map((c) => c.json?.run_token as string);
  expect(runTokens.length).toBeGreaterThan(0);
  const forbidden = [
    GENERIC_SECRET,
    ADMIN_TOKEN,
    HOOK_SECRET,
    AGENT_TOKEN,
    TG_TOKEN,
    TG_TOKEN.split(":")[1]!,
    TG_SECRET,
    "hook-password-Oscar",
    "hook-query-token-Papa",
    "agent-query-key-Quebec",
    "reply-query-sig-Romeo",
    ...TEXTS,
    AGENT_REPLY,
    TG_TEXT,
    ...runTokens,
  ];
  const all = lines.join("\n");
  for (const value of forbidden) expect(all, `logs carry ${value}`).not.toContain(value);
});
