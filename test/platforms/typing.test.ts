/**
 * The platforms' typing calls, asserted on what was sent: Telegram sendChatAction
 * (with the forum topic), WhatsApp's read receipt with typing indicator, and none
 * for Slack, Discord and generic.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { parseConfigFresh } from "../../src/config";
import { senderFor } from "../../src/platforms";

const config = parseConfigFresh({});
const TELEGRAM_ENV = {
  TELEGRAM_BOT_TOKEN: "123:abc",
  TELEGRAM_WEBHOOK_SECRET: "s",
  TELEGRAM_API_BASE: "http://127.0.0.1:9/tg/",
};
const WHATSAPP_ENV = {
  WHATSAPP_VERIFY_TOKEN: "v",
  WHATSAPP_APP_SECRET: "a",
  WHATSAPP_ACCESS_TOKEN: "wa-token",
  WHATSAPP_PHONE_NUMBER_ID: "1000",
  WHATSAPP_API_BASE: "http://127.0.0.1:9/graph",
};

function spyFetch(status = 200, body: unknown = { ok: true }) {
  return vi
    .spyOn(globalThis, "fetch")
    .mockImplementation(
      async () => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } }),
    );
}

async function sent(spy: ReturnType<typeof spyFetch>, index = 0) {
  const [url, init] = spy.mock.calls[index]!;
  return {
    url: String(url),
    method: init?.method,
    authorization: new Headers(init?.headers).get("authorization"),
    body: JSON.parse(String(init?.body)) as unknown,
  };
}

afterEach(() => vi.restoreAllMocks());

describe("Telegram typing", () => {
  const typing = senderFor("telegram")!.typing!;

  it("repeats (its indicator fades in about 5 s)", () => {
    expect(typing.cadence).toBe("repeat");
  });

  it("sends sendChatAction typing to the chat", async () => {
    const spy = spyFetch();
    const outcome = await typing.send(
      { platform: "telegram", chat_id: -100, message_thread_id: null },
      "9",
      config,
      TELEGRAM_ENV,
    );
    expect(outcome.ok).toBe(true);
    expect(spy).toHaveBeenCalledTimes(1);
    expect(await sent(spy)).toEqual({
      url: "http://127.0.0.1:9/tg/bot123:abc/sendChatAction",
      method: "POST",
      authorization: null,
      body: { chat_id: -100, action: "typing" },
    });
  });

  it("to the forum topic the message came from", async () => {
    const spy = spyFetch();
    await typing.send({ platform: "telegram", chat_id: -100, message_thread_id: 77 }, "9", config, TELEGRAM_ENV);
    expect((await sent(spy)).body).toEqual({ chat_id: -100, action: "typing", message_thread_id: 77 });
  });

  it("a 429 is retryable, a 403 is not; a malformed target sends nothing", async () => {
    spyFetch(429, { ok: false, error_code: 429, parameters: { retry_after: 3 } });
    const limited = await typing.send(
      { platform: "telegram", chat_id: 1, message_thread_id: null },
      "9",
      config,
      TELEGRAM_ENV,
    );
    expect(limited).toMatchObject({ ok: false, retryable: true, retryAfterMs: 3000 });
    vi.restoreAllMocks();
    spyFetch(403, { ok: false, error_code: 403 });
    const blocked = await typing.send(
      { platform: "telegram", chat_id: 1, message_thread_id: null },
      "9",
      config,
      TELEGRAM_ENV,
    );
    expect(blocked).toMatchObject({ ok: false, retryable: false, status: 403 });
    vi.restoreAllMocks();
    const spy = spyFetch();
    const bad = await typing.send({ platform: "telegram", chat_id: "x" }, "9", config, TELEGRAM_ENV);
    expect(bad).toMatchObject({ ok: false, retryable: false });
    expect(spy).not.toHaveBeenCalled();
  });

  it("sends nothing when Telegram is not configured", async () => {
    const spy = spyFetch();
    const outcome = await typing.send({ platform: "telegram", chat_id: 1, message_thread_id: null }, "9", config, {});
    expect(outcome).toMatchObject({ ok: false, retryable: false });
    expect(spy).not.toHaveBeenCalled();
  });
});

describe("WhatsApp typing", () => {
  const typing = senderFor("whatsapp")!.typing!;

  it("is sent once (it shows until the reply or 25 s)", () => {
    expect(typing.cadence).toBe("once");
  });

  it("marks the message read with a typing indicator, from the number the user wrote to", async () => {
    const spy = spyFetch(200, { success: true });
    const target = { platform: "whatsapp", to: "15551234567", phone_number_id: "2000" };
    const outcome = await typing.send(target, "wamid.ABC=", config, WHATSAPP_ENV);
    expect(outcome.ok).toBe(true);
    expect(await sent(spy)).toEqual({
      url: "http://127.0.0.1:9/graph/2000/messages",
      method: "POST",
      authorization: "Bearer wa-token",
      body: {
        messaging_product: "whatsapp",
        status: "read",
        message_id: "wamid.ABC=",
        typing_indicator: { type: "text" },
      },
    });
  });

  it("falls back to WHATSAPP_PHONE_NUMBER_ID, and works for a user known only by BSUID", async () => {
    const spy = spyFetch(200, { success: true });
    await typing.send(
      { platform: "whatsapp", to: null, recipient: "US.123", phone_number_id: null },
      "wamid.X",
      config,
      WHATSAPP_ENV,
    );
    expect((await sent(spy)).url).toBe("http://127.0.0.1:9/graph/1000/messages");
  });

  it("a rate-limit error is retryable", async () => {
    spyFetch(400, { error: { code: 131056, message: "pair rate limit" } });
    const outcome = await typing.send(
      { platform: "whatsapp", to: "1", phone_number_id: null },
      "wamid.X",
      config,
      WHATSAPP_ENV,
    );
    expect(outcome).toMatchObject({ ok: false, retryable: true });
  });
});

describe("platforms without a typing call", () => {
  it.each(["slack", "discord", "generic"])("%s has none", (platform) => {
    expect(senderFor(platform)!.typing).toBeUndefined();
  });
});
