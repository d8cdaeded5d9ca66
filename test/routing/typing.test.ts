/**
 * Typing while the agent works (spec "Typing"), through the real routing object,
 * its one alarm and the clock seam: Telegram `sendChatAction` at dispatch and every
 * 4 s while the current run is unfinished and owns its session, for at most 10
 * minutes; WhatsApp's read receipt with typing indicator once, at dispatch; nothing
 * for Slack, Discord and generic. It stops at once when the run's reply is recorded,
 * when the run is revoked (`/stop`, an interrupt) or loses its lease, and a restart
 * of the object cannot make it type past its 10 minutes. Every outbound call is
 * asserted on its exact URL and body.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { RoutedMessage } from "../../src/domain/inbound";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { TYPING_AT_MOST_MS, TYPING_EVERY_MS } from "../../src/domain/typing";
import { SessionRouter } from "../../src/routing/router";
import { AGENT_URL, REPLY_URL, accepted, agentApi, agentConfig, replyWith } from "../agent/support";
import telegramSendOk from "../fixtures/telegram/send-ok.json";
import whatsappSendOk from "../fixtures/whatsapp/send-ok.json";
import {
  T0,
  alarmOf,
  captureFetch,
  restoreClock,
  router,
  runAlarm,
  sessionRow,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const TG_TOKEN = "7000000001:AAtyping-token";
const TG_API = "https://telegram.test";
const TYPING_URL = `${TG_API}/bot${TG_TOKEN}/sendChatAction`;
const TG_SEND_URL = `${TG_API}/bot${TG_TOKEN}/sendMessage`;
const WA_API = "https://graph.test";
const WA_PHONE = "1000";
const WA_TOKEN = "wa-access-token";
const WA_URL = `${WA_API}/${WA_PHONE}/messages`;

const typingConfig = (extra: Record<string, string> = {}) =>
  agentConfig({
    HOOK_URLS: "",
    TELEGRAM_BOT_TOKEN: TG_TOKEN,
    TELEGRAM_WEBHOOK_SECRET: "tg-secret",
    TELEGRAM_API_BASE: TG_API,
    WHATSAPP_VERIFY_TOKEN: "wa-verify",
    WHATSAPP_APP_SECRET: "wa-app-secret",
    WHATSAPP_ACCESS_TOKEN: WA_TOKEN,
    WHATSAPP_PHONE_NUMBER_ID: WA_PHONE,
    WHATSAPP_API_BASE: WA_API,
    ...extra,
  });

/** The agent's answer to each hand-off (made in the routing object's context when asked). */
let agent: (request: Captured) => Response | Promise<Response>;
/** What Telegram answers a sendChatAction. */
let typingAnswer: () => Response | Promise<Response>;
let outbound: ReturnType<typeof captureFetch>;

beforeEach(() => {
  setNow(T0);
  useConfig(typingConfig());
  agent = () => accepted();
  typingAnswer = () => Response.json({ ok: true, result: true });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return agent(request);
    if (request.url === TYPING_URL) return typingAnswer();
    if (request.url === TG_SEND_URL) return Response.json(telegramSendOk);
    if (request.url === WA_URL) return Response.json(whatsappSendOk);
    if (request.url === REPLY_URL) return new Response("ok");
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  // A log spy left by a failed assertion does not outlive its test.
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

const typingCalls = () => outbound.calls.filter((c) => c.url === TYPING_URL);
const agentCalls = () => outbound.calls.filter((c) => c.url === AGENT_URL);
const indexOf = (c: Captured) => outbound.calls.indexOf(c);

type Routed = Omit<RoutedMessage, "receivedAt">;

function message(key: string, platform: string, replyTo: Record<string, unknown>, text = "hello"): Routed {
  return {
    platform,
    eventId: unique(`${platform}-evt`),
    chatId: key,
    chatType: "dm",
    userId: "u1",
    threadId: null,
    text,
    sentAt: null,
    replyTo: { platform, ...replyTo },
    sessionKey: key,
  };
}

/** A Telegram message in a DM (`thread` null) or a forum topic. */
function telegram(key: string, chatId: number, thread: number | null = null, text = "hello"): Routed {
  return message(key, "telegram", { chat_id: chatId, message_thread_id: thread }, text);
}

/**
 * Routes one message to its key's object and runs what it staged (the tests drain
 * the outbox in the alarm: OUTBOX_DRAIN=alarm), with the clock where it is.
 */
async function route(msg: Routed): Promise<string> {
  const result = await router(msg.sessionKey).route(msg);
  expect(result.status).toBe(200);
  await runAlarm(msg.sessionKey);
  await router(msg.sessionKey).drained();
  return (result.body as { session_id: string }).session_id;
}

/** Moves the clock to `at`, runs the key's alarm (when set) and waits for what it started. */
async function alarmAt(key: string, at: number): Promise<void> {
  setNow(at);
  await runAlarm(key);
  await router(key).drained();
}

/**
 * What the object keeps for typing (one row per session while its run types). A run
 * that is over leaves nothing: otherwise every ended session would leave a row that
 * each re-arm of the alarm reads again.
 */
async function typingRows(key: string): Promise<string[]> {
  return runInDurableObject(router(key), (_instance, state) =>
    state.storage.sql
      .exec<{ run_id: string }>(`SELECT run_id FROM typing_runs`)
      .toArray()
      .map((row) => row.run_id),
  );
}

/** The warnings the object logged (one JSON line each). */
function warnings(spy: { mock: { calls: unknown[][] } }): Record<string, unknown>[] {
  return spy.mock.calls.flatMap(([line]) => {
    try {
      return [JSON.parse(String(line)) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
}

const newKey = () => `telegram:dm:${unique("chat")}`;
const chatIdOf = () => -Math.floor(Math.random() * 1e12) - 1;

describe("Telegram: at dispatch, then every 4 s while the run owns its session", () => {
  it("sends sendChatAction to the chat at dispatch and again when the alarm runs 4 s later; none after the reply", async () => {
    const warn = vi.spyOn(console, "warn");
    const key = newKey();
    const chatId = chatIdOf();
    await route(telegram(key, chatId));
    expect(agentCalls()).toHaveLength(1);
    expect(typingCalls().map((c) => [c.method, c.url, c.json])).toEqual([
      ["POST", TYPING_URL, { chat_id: chatId, action: "typing" }],
    ]);
    // The one alarm comes back for the next typing call.
    expect(await alarmOf(key)).toBe(T0 + TYPING_EVERY_MS);
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    // The alarm re-arms itself for the next call (its plan's typing source).
    expect(await alarmOf(key)).toBe(T0 + 2 * TYPING_EVERY_MS);
    await alarmAt(key, T0 + 2 * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(3);

    // The agent replies through the run API: the run is finished, and typing stops at once.
    const run = agentCalls()[0]!.json;
    setNow(T0 + 2 * TYPING_EVERY_MS + 1);
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "done" })).status).toBe(200);
    // The alarm delivers the reply (it is due at once).
    await runAlarm(key);
    await router(key).drained();
    const reply = outbound.calls.find((c) => c.url === TG_SEND_URL)!;
    expect(reply.json).toEqual({ chat_id: chatId, text: "done" });
    for (const at of [3, 4, 5]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    // No typing call is made after the reply.
    expect(typingCalls()).toHaveLength(3);
    expect(typingCalls().every((c) => indexOf(c) < indexOf(reply))).toBe(true);
    expect(await alarmOf(key)).not.toBe(T0 + 6 * TYPING_EVERY_MS);
    expect(await typingRows(key)).toEqual([]);
    // Calls that succeeded are not logged as failures.
    expect(warnings(warn).filter((line) => line.msg === "typing call failed (not retried)")).toEqual([]);
    warn.mockRestore();
  });

  it("none for a hand-off whose session ended before it went out", async () => {
    const key = newKey();
    const routed = await router(key).route(telegram(key, chatIdOf()));
    const sessionId = (routed.body as { session_id: string }).session_id;
    expect((await router(key).endSession(sessionId, "admin")).status).toBe(200);
    await runAlarm(key);
    await router(key).drained();
    expect(agentCalls()).toEqual([]);
    expect(typingCalls()).toEqual([]);
  });

  it("in a forum topic, with its message_thread_id", async () => {
    const key = newKey();
    const chatId = chatIdOf();
    await route(telegram(key, chatId, 5512));
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls().map((c) => c.json)).toEqual([
      { chat_id: chatId, action: "typing", message_thread_id: 5512 },
      { chat_id: chatId, action: "typing", message_thread_id: 5512 },
    ]);
  });

  it.each(["alarm", "inline"])(
    "keeps typing while a 200 is on its way (OUTBOX_DRAIN=%s: the alarm does not wait for the slow hand-off); none after its reply",
    async (drain) => {
      useConfig(typingConfig({ OUTBOX_DRAIN: drain }));
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      let reached!: () => void;
      const called = new Promise<void>((resolve) => (reached = resolve));
      agent = async () => {
        reached();
        await released;
        return replyWith("thought it through");
      };
      const key = newKey();
      const chatId = chatIdOf();
      const routed = await router(key).route(telegram(key, chatId));
      expect(routed.status).toBe(200);
      // alarm: the alarm hands the run over; inline: the request did, in its background.
      if (drain === "alarm") await runAlarm(key);
      await called;
      // The alarm is set for the next call while the hand-off still waits. Inline, only
      // the dispatch itself can do that: the request re-armed before the hand-off began,
      // and the drain re-arms only when it ends, which may be long after.
      expect(await alarmOf(key)).toBe(T0 + TYPING_EVERY_MS);
      for (const at of [1, 2, 3]) {
        setNow(T0 + at * TYPING_EVERY_MS);
        // Returns while the hand-off is still waiting for the agent.
        await runAlarm(key);
      }
      expect(typingCalls()).toHaveLength(4);
      release();
      await router(key).drained();
      const reply = outbound.calls.find((c) => c.url === TG_SEND_URL)!;
      expect(reply.json).toEqual({ chat_id: chatId, text: "thought it through" });
      await alarmAt(key, T0 + 4 * TYPING_EVERY_MS);
      await alarmAt(key, T0 + 5 * TYPING_EVERY_MS);
      expect(typingCalls()).toHaveLength(4);
      expect(typingCalls().every((c) => indexOf(c) < indexOf(reply))).toBe(true);
    },
  );

  it("a failed typing call is logged and not retried, and never holds up nor fails the hand-off", async () => {
    typingAnswer = () => Response.json({ ok: false, error_code: 500, description: "down" }, { status: 500 });
    const key = newKey();
    await route(telegram(key, chatIdOf()));
    expect(agentCalls()).toHaveLength(1);
    expect(typingCalls()).toHaveLength(1);
    // Not retried before its next turn in the schedule, and never outbox work.
    await alarmAt(key, T0 + 1_000);
    expect(typingCalls()).toHaveLength(1);
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual([]);
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
  });

  it("the operator's log says which run's typing failed, and why (an error answer or a call that threw)", async () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    try {
      typingAnswer = () => Response.json({ ok: false, error_code: 403, description: "blocked" }, { status: 403 });
      const key = newKey();
      const sessionId = await route(telegram(key, chatIdOf()));
      const runId = agentCalls()[0]!.json.run_id as string;
      expect(warnings(warn)).toContainEqual(
        expect.objectContaining({
          level: "warn",
          msg: "typing call failed (not retried)",
          session_id: sessionId,
          run_id: runId,
          platform: "telegram",
          status: 403,
        }),
      );
      warn.mockClear();
      typingAnswer = () => {
        throw new Error("connection reset");
      };
      await alarmAt(key, T0 + TYPING_EVERY_MS);
      expect(typingCalls()).toHaveLength(2);
      expect(warnings(warn)).toContainEqual(
        expect.objectContaining({
          msg: "typing call failed (not retried)",
          run_id: runId,
          platform: "telegram",
          error: expect.stringContaining("connection reset"),
        }),
      );
    } finally {
      warn.mockRestore();
    }
  });

  it("an invalid configuration deployed while a run types: the alarm logs that it could not look at typing, and why, and typing goes on once it is mended", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      const key = newKey();
      await route(telegram(key, chatIdOf()));
      expect(typingCalls()).toHaveLength(1);
      useConfig(typingConfig({ GROUP_SESSIONS_PER_USER: "sometimes" }));
      setNow(T0 + TYPING_EVERY_MS);
      await runAlarm(key);
      // No call is made with a configuration that does not parse.
      expect(typingCalls()).toHaveLength(1);
      expect(warnings(errors)).toContainEqual(
        expect.objectContaining({
          level: "error",
          msg: "alarm: could not look at typing",
          error: expect.stringContaining("GROUP_SESSIONS_PER_USER"),
        }),
      );
      // Once the configuration is mended, the alarm comes back and typing goes on.
      useConfig(typingConfig());
      await alarmAt(key, (await alarmOf(key))!);
      expect(typingCalls()).toHaveLength(2);
    } finally {
      errors.mockRestore();
    }
  });

  it("a hand-off retried after the agent was down keeps typing from its first dispatch: the 10 minutes count from there", async () => {
    let attempts = 0;
    agent = () =>
      ++attempts === 1 ? new Response("busy", { status: 503, headers: { "retry-after": "120" } }) : accepted();
    const key = newKey();
    await route(telegram(key, chatIdOf()));
    expect(typingCalls()).toHaveLength(1);
    // Typing goes on while the hand-off waits for its retry.
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    // The retry, two minutes on, is accepted: no new dispatch time, no extra call.
    await alarmAt(key, T0 + 120_000);
    expect(agentCalls()).toHaveLength(2);
    expect(typingCalls()).toHaveLength(3);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS);
    expect(typingCalls()).toHaveLength(4);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS + TYPING_EVERY_MS);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS + 2 * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(4);
  });

  it("a rotation while the run types: typing goes on in the continuation", async () => {
    const key = newKey();
    const parent = await route(telegram(key, chatIdOf()));
    const run = agentCalls()[0]!.json;
    setNow(T0 + 1_000);
    const rotated = await agentApi(`/v1/sessions/${parent}/rotate`, run.run_token, { reason: "compression" });
    expect(rotated.status).toBe(200);
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    await alarmAt(key, T0 + 2 * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(3);
  });
});

describe("Telegram: it stops when the run loses its session", () => {
  it("none after /stop revokes the run", async () => {
    const key = newKey();
    const chatId = chatIdOf();
    await route(telegram(key, chatId));
    expect(typingCalls()).toHaveLength(1);
    setNow(T0 + 1_000);
    await route(telegram(key, chatId, null, "/stop"));
    for (const at of [1, 2]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(1);
    expect(await typingRows(key)).toEqual([]);
  });

  it("none for a run an interrupt revoked: only its replacement types", async () => {
    useConfig(typingConfig({ OVERLAP: JSON.stringify({ mode: "interrupt" }) }));
    const key = newKey();
    const chatId = chatIdOf();
    await route(telegram(key, chatId, null, "book Paris"));
    expect(typingCalls()).toHaveLength(1);
    // The correction arrives just when the first run's next typing call is due: the
    // alarm revokes that run, and only the run that replaces it types.
    setNow(T0 + TYPING_EVERY_MS);
    await route(telegram(key, chatId, null, "no, Rome"));
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(agentCalls().map((c) => c.json.messages.map((m: { text: string }) => m.text))).toEqual([
      ["book Paris"],
      ["book Paris", "no, Rome"],
    ]);
    expect(typingCalls()).toHaveLength(2);
    await alarmAt(key, T0 + 2 * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(3);
  });

  it("none once the run's lease is lost (its owner silent: the session is reaped)", async () => {
    const key = newKey();
    const sessionId = await route(telegram(key, chatIdOf()));
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    // The agent's last sign of life is now a lease ago (as D1, which holds leases, sees it).
    const run = agentCalls()[0]!.json;
    const silentSince = T0 + TYPING_EVERY_MS - 10 * 60_000;
    await env.DB.prepare(`UPDATE runs SET accepted_at = ?, last_heartbeat_at = ?, dispatched_at = ? WHERE id = ?`)
      .bind(silentSince, silentSince, silentSince, run.run_id)
      .run();
    await router(key).checkSession(sessionId);
    expect((await sessionRow(sessionId))?.end_reason).toBe("orphan_reap");
    for (const at of [2, 3]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    expect(await typingRows(key)).toEqual([]);
  });

  it("none once the operator forgets the route, and the alarm does not spin on the run left behind", async () => {
    const key = newKey();
    await route(telegram(key, chatIdOf()));
    expect(typingCalls()).toHaveLength(1);
    setNow(T0 + 1_000);
    await router(key).forget();
    // Nothing is due now: the alarm is not set for a typing call that will never be made.
    const alarm = await alarmOf(key);
    expect(alarm === null || alarm > T0 + TYPING_EVERY_MS).toBe(true);
    for (const at of [1, 2]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(1);
  });

  /** A 202 run whose agent keeps its lease with a heartbeat at 5 minutes (so only the cap stops typing). */
  async function acceptedRunKeptAlive(key: string): Promise<void> {
    await route(telegram(key, chatIdOf()));
    const run = agentCalls()[0]!.json;
    setNow(T0 + 5 * 60_000);
    expect(await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).toEqual({
      status: 200,
      body: { owns: true },
    });
  }

  it("none after 10 minutes from dispatch, the run still open and owning", async () => {
    const key = newKey();
    await acceptedRunKeptAlive(key);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS - TYPING_EVERY_MS);
    // The last call is the one due at exactly 10 minutes.
    await alarmAt(key, T0 + TYPING_AT_MOST_MS);
    expect(typingCalls()).toHaveLength(3);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS + TYPING_EVERY_MS);
    await alarmAt(key, T0 + TYPING_AT_MOST_MS + 2 * TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(3);
    expect((await sessionRow(agentCalls()[0]!.json.session.id))?.end_reason).toBeNull();
  });

  it("none after 10 minutes even when a restarted object wakes long after its last call", async () => {
    const key = newKey();
    await acceptedRunKeptAlive(key);
    await alarmAt(key, T0 + TYPING_EVERY_MS);
    expect(typingCalls()).toHaveLength(2);
    // A fresh instance over the same storage (nothing kept in memory), woken at 11
    // minutes: its last call was long ago, but the cap counts from the stored dispatch.
    setNow(T0 + 11 * 60_000);
    await runInDurableObject(router(key), async (_instance, state) => {
      const fresh = new SessionRouter(state, env);
      await fresh.alarm();
      await fresh.drained();
    });
    expect(typingCalls()).toHaveLength(2);
    expect((await sessionRow(agentCalls()[0]!.json.session.id))?.end_reason).toBeNull();
  });
});

describe("WhatsApp: the read receipt with typing indicator, once", () => {
  it("marks the message read with typing_indicator at dispatch, and never again", async () => {
    const key = `whatsapp:dm:${unique("wa")}`;
    const msg = message(key, "whatsapp", { to: "4915100079946", phone_number_id: WA_PHONE });
    await route(msg);
    // Its one call made, nothing is kept for it while the run goes on, and the alarm
    // is not brought forward for a call that will never come
    expect(await typingRows(key)).toEqual([]);
    // (the accepted run's lease end is the next thing due).
    expect(await alarmOf(key)).toBe(T0 + RUN_LEASE_MS);
    for (const at of [1, 2, 3]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    const sent = outbound.calls.filter((c) => c.url.startsWith(WA_API));
    expect(sent.map((c) => [c.method, c.url, c.headers.authorization, c.json])).toEqual([
      [
        "POST",
        WA_URL,
        `Bearer ${WA_TOKEN}`,
        { messaging_product: "whatsapp", status: "read", message_id: msg.eventId, typing_indicator: { type: "text" } },
      ],
    ]);
  });
});

describe("Slack, Discord and generic: no typing call", () => {
  it.each([
    ["slack", { channel: "C123" }],
    ["discord", { application_id: "app", token: "tok", interaction_at: T0, answersCommandsInline: true }],
    ["generic", {}],
  ])("%s: only the hand-off leaves the gateway while the run works", async (platform, replyTo) => {
    const key = `${platform}:dm:${unique("chat")}`;
    await route(message(key, platform, replyTo));
    for (const at of [1, 2]) await alarmAt(key, T0 + at * TYPING_EVERY_MS);
    expect(outbound.calls.map((c) => c.url)).toEqual([AGENT_URL]);
  });
});
