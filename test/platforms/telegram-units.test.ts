/**
 * Telegram's sender one piece at a time, where telegram.test.ts (end to end)
 * cannot reach every case: how a Bot API answer is classified for retries, the
 * reply targets refused before any call, the sender without its settings, and a
 * webhook without its secret header.
 */
import { HTTPException } from "hono/http-exception";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { CallOutcome } from "../../src/http/outbound";
import { telegram } from "../../src/platforms/telegram";
import { classify, sendTelegram } from "../../src/platforms/telegram/send";
import { sendTelegramTyping } from "../../src/platforms/telegram/typing";
import type { PlatformEnv } from "../../src/platforms/types";
import { captureFetch, type Captured } from "../helpers";
import { answerAfter, outboundReply } from "./outbound";

const API = "https://telegram.test";
const TOKEN = "7000000002:AAunit-test-token";
const settings = { token: TOKEN, apiBase: API };

let outbound: { calls: Captured[]; restore: () => void };
beforeEach(() => {
  outbound = captureFetch(() => Response.json({ ok: true, result: {} }));
});
afterEach(() => outbound.restore());

const failed = (json: unknown, retryAfterMs: number | null = null): CallOutcome =>
  ({ ok: false, retryable: true, status: 429, error: "429", json, retryAfterMs }) as CallOutcome;

const reply = (target: Record<string, unknown>, text?: string) => outboundReply("telegram", target, text);

describe("classify", () => {
  it("waits parameters.retry_after seconds when Telegram names it, else what Retry-After said", () => {
    expect(classify(failed({ ok: false, parameters: { retry_after: 3 } }, 9_000)).retryAfterMs).toBe(3_000);
    expect(classify(failed({ ok: false, description: "Too Many Requests" }, 9_000)).retryAfterMs).toBe(9_000);
    expect(classify(failed(null)).retryAfterMs).toBeNull();
  });
});

describe("reply targets refused before any call", () => {
  it.each<[string, Record<string, unknown>]>([
    ["no chat_id", {}],
    ["a chat_id that is not an integer", { chat_id: "12" }],
    ["a message_thread_id that is not an integer", { chat_id: 12, message_thread_id: "topic" }],
  ])("%s: a permanent failure, and nothing sent", async (_what, target) => {
    const refusal = {
      ok: false,
      retryable: false,
      retryAfterMs: null,
      status: null,
      error: "malformed telegram reply target",
    };
    expect(await sendTelegram(reply(target), settings)).toEqual(refusal);
    expect(await sendTelegramTyping({ platform: "telegram", ...target }, settings)).toEqual(refusal);
    expect(outbound.calls).toEqual([]);
  });
});

describe("the sender without its settings", () => {
  const unset = {} as PlatformEnv;
  const misconfigured = { TELEGRAM_BOT_TOKEN: TOKEN, TELEGRAM_API_BASE: "not a url" } as unknown as PlatformEnv;

  it("cannot deliver, and a send or typing call fails for good without a call", async () => {
    const sender = telegram.sender!;
    expect(sender.canDeliver({ platform: "telegram", chat_id: 1 }, {} as never, unset)).toBe(false);
    const send = await sender.send(reply({ chat_id: 1 }), {} as never, unset);
    expect(send).toMatchObject({ ok: false, retryable: false, error: "telegram is not configured" });
    const typing = await sender.typing!.send({ platform: "telegram", chat_id: 1 }, "1", {} as never, unset);
    expect(typing).toMatchObject({ ok: false, retryable: false, error: "telegram is not configured" });
    expect(outbound.calls).toEqual([]);
  });

  it("delivers only to a Telegram target once configured", () => {
    const env = {
      TELEGRAM_BOT_TOKEN: TOKEN,
      TELEGRAM_WEBHOOK_SECRET: "s",
      TELEGRAM_API_BASE: API,
    } as unknown as PlatformEnv;
    expect(telegram.sender!.canDeliver({ platform: "telegram", chat_id: 1 }, {} as never, env)).toBe(true);
    expect(telegram.sender!.canDeliver({ platform: "slack", channel: "C1" }, {} as never, env)).toBe(false);
  });

  it("logs which platform's configuration is invalid", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      await telegram.sender!.send(reply({ chat_id: 1 }), {} as never, misconfigured);
      const lines = errors.mock.calls.map(([line]) => JSON.parse(String(line)));
      expect(lines).toContainEqual(
        expect.objectContaining({ msg: "replies not sent: invalid configuration", platform: "telegram" }),
      );
    } finally {
      errors.mockRestore();
    }
  });
});

describe("a Bot API slow to answer", () => {
  it("is waited for: a reply and a typing call answered after a moment are each made once, and succeed", async () => {
    const fake = vi.mocked(globalThis.fetch).getMockImplementation()!;
    vi.mocked(globalThis.fetch).mockImplementation(async (input, init) => {
      await answerAfter(50, init?.signal);
      return fake(input, init);
    });
    // Given up on, the reply would be retried: the chat would show it twice.
    expect(await sendTelegram(reply({ chat_id: 12 }), settings)).toMatchObject({ ok: true, error: null });
    expect(await sendTelegramTyping({ platform: "telegram", chat_id: 12 }, settings)).toMatchObject({ ok: true });
    expect(outbound.calls.map((c) => c.url)).toEqual([
      `${API}/bot${TOKEN}/sendMessage`,
      `${API}/bot${TOKEN}/sendChatAction`,
    ]);
  });
});

describe("a webhook without its secret header", () => {
  it("is refused 401 whatever the secret, even one spelled null", async () => {
    const input = {
      method: "POST",
      url: new URL("https://gateway.test/webhooks/telegram"),
      headers: new Headers({ "content-type": "application/json" }),
      rawBody: new TextEncoder().encode(JSON.stringify({ update_id: 1 })).buffer as ArrayBuffer,
      config: {} as never,
    };
    for (const secret of ["null", "a-real-secret"]) {
      let refusal: unknown = null;
      try {
        await telegram.handle(input, { token: TOKEN, secret, apiBase: API });
      } catch (error) {
        refusal = error;
      }
      expect(refusal).toBeInstanceOf(HTTPException);
      const response = (refusal as HTTPException).getResponse();
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual({
        error: { code: "bad_signature", message: "missing or invalid X-Telegram-Bot-Api-Secret-Token" },
      });
    }
  });
});
