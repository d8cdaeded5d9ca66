/**
 * Bytes are what they claim (spec invariant 13): a body that is not valid UTF-8 is
 * a 400 and changes nothing, wherever a body is parsed: the generic and every
 * platform webhook, the agent API and the operator API. Two ids that differ only
 * in invalid bytes are both refused, never merged into one U+FFFD string.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { parseJsonBytes } from "../../src/platforms/parse";
import { formFields } from "../../src/platforms/slack/events";
import {
  BASE,
  GENERIC_SECRET,
  T0,
  adminFetch,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  tableCounts,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentConfig, fakeServices } from "../agent/support";

const encoder = new TextEncoder();

/** The UTF-8 bytes of `text` with each `\u0000` replaced by the raw (invalid) bytes given. */
function withBytes(text: string, ...raw: number[][]): Uint8Array {
  const parts = text.split("\u0000");
  const chunks: number[] = [];
  parts.forEach((part, i) => {
    chunks.push(...encoder.encode(part));
    if (i < parts.length - 1) chunks.push(...raw[i]!);
  });
  return new Uint8Array(chunks);
}

async function postGeneric(bytes: Uint8Array): Promise<Response> {
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/generic`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-signature-256": `sha256=${await hmacSha256Hex(GENERIC_SECRET, bytes)}`,
      },
      body: bytes,
    }),
  );
}

const errorCode = async (response: Response) => ((await response.json()) as any).error.code;

beforeEach(() => setNow(T0));
afterEach(() => {
  restoreClock();
  useConfig(null);
});

describe("the generic webhook", () => {
  it("refuses two event ids that differ only in invalid bytes, both, and stores nothing", async () => {
    const chat = unique("chat");
    const body = `{"event_id":"evt-\u0000","chat_id":"${chat}","chat_type":"dm","user_id":"u1","text":"hi"}`;
    const before = await tableCounts();
    for (const raw of [[0xff], [0xfe], [0xc3, 0x28]]) {
      const response = await postGeneric(withBytes(body, raw));
      expect(response.status).toBe(400);
      expect(await errorCode(response)).toBe("invalid_utf8");
    }
    expect(await tableCounts()).toEqual(before);
  });

  it("refuses chat ids that differ only in invalid bytes: no session is shared, none is made", async () => {
    const before = await tableCounts();
    for (const raw of [[0xff], [0x80], [0xed, 0xa0, 0x80]]) {
      const body = `{"event_id":"${unique("evt")}","chat_id":"c-\u0000","chat_type":"dm","user_id":"u1","text":"hi"}`;
      expect((await postGeneric(withBytes(body, raw))).status).toBe(400);
    }
    expect(await tableCounts()).toEqual(before);
  });

  it("still accepts valid multi-byte UTF-8 as the exact string sent", async () => {
    const chat = `chat-é-漢-😀-${unique("c")}`;
    const body = `{"event_id":"${unique("evt")}","chat_id":"${chat}","chat_type":"dm","user_id":"u1","text":"ça va"}`;
    const response = await postGeneric(encoder.encode(body));
    expect(response.status).toBe(200);
    const { session_id } = (await response.json()) as any;
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: null });
    expect((await messagesOf(session_id)).map((m) => m.text)).toEqual(["ça va"]);
  });
});

describe("platform webhooks", () => {
  it("Telegram: an update with invalid bytes is a 400 and stores nothing", async () => {
    useConfig({
      TELEGRAM_BOT_TOKEN: "1:tok",
      TELEGRAM_WEBHOOK_SECRET: "tg-secret",
      TELEGRAM_API_BASE: "https://telegram.test",
    });
    const before = await tableCounts();
    const body = withBytes(
      `{"update_id":7001,"message":{"message_id":1,"date":1,"chat":{"id":5,"type":"private"},"from":{"id":5},"text":"a\u0000"}}`,
      [0xff],
    );
    const response = await exports.default.fetch(
      new Request(`${BASE}/webhooks/telegram`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": "tg-secret" },
        body,
      }),
    );
    expect(response.status).toBe(400);
    expect(await errorCode(response)).toBe("invalid_utf8");
    expect(await tableCounts()).toEqual(before);
  });

  it("WhatsApp: a signed delivery with invalid bytes is a 400 and stores nothing", async () => {
    useConfig({
      WHATSAPP_VERIFY_TOKEN: "verify",
      WHATSAPP_APP_SECRET: "wa-secret",
      WHATSAPP_ACCESS_TOKEN: "wa-token",
      WHATSAPP_PHONE_NUMBER_ID: "1000",
      WHATSAPP_API_BASE: "https://graph.test",
    });
    const before = await tableCounts();
    const body = withBytes(`{"object":"whatsapp_business_account","entry":[{"id":"\u0000","changes":[]}]}`, [0xff]);
    const response = await exports.default.fetch(
      new Request(`${BASE}/webhooks/whatsapp`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "x-hub-signature-256": `sha256=${await hmacSha256Hex("wa-secret", body)}`,
        },
        body,
      }),
    );
    expect(response.status).toBe(400);
    expect(await tableCounts()).toEqual(before);
  });

  it("Slack and Discord bodies go through the same strict decoding (JSON and forms)", () => {
    const status = (f: () => unknown) => {
      try {
        f();
        return 200;
      } catch (error) {
        return (error as { status?: number }).status;
      }
    };
    expect(status(() => parseJsonBytes(withBytes(`{"a":"\u0000"}`, [0xff]).buffer as ArrayBuffer))).toBe(400);
    // A form value that is invalid raw, or invalid once percent-decoded.
    expect(status(() => formFields(withBytes(`user_id=U\u0000`, [0xff]).buffer as ArrayBuffer))).toBe(400);
    expect(status(() => formFields(encoder.encode("user_id=U%FF").buffer as ArrayBuffer))).toBe(400);
    expect(status(() => formFields(encoder.encode("user_id=U%FE").buffer as ArrayBuffer))).toBe(400);
    expect(formFields(encoder.encode("user_id=U%C3%A9&text=a+b").buffer as ArrayBuffer)).toEqual({
      user_id: "Ué",
      text: "a b",
    });
  });
});

describe("the agent and operator APIs", () => {
  it("a run reply or a session end with invalid bytes is a 400 and changes nothing", async () => {
    useConfig(agentConfig());
    const services = fakeServices(() => accepted());
    try {
      const chat = unique("chat");
      const sent = await send({ chat_id: chat, text: "hello" });
      await runAlarm(genericKey(chat));
      const { run_id, run_token } = services.agentCalls()[0]!.json;
      const reply = await exports.default.fetch(
        new Request(`${BASE}/v1/runs/${run_id}/reply`, {
          method: "POST",
          headers: { authorization: `Bearer ${run_token}`, "content-type": "application/json" },
          body: withBytes(`{"text":"done \u0000"}`, [0xff]),
        }),
      );
      expect(reply.status).toBe(400);
      expect(await errorCode(reply)).toBe("invalid_utf8");
      const end = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: withBytes(`{"reason":"admin\u0000"}`, [0xc0, 0xaf]),
      });
      expect(end.status).toBe(400);
      expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
      expect((await messagesOf(sent.body.session_id)).map((m) => m.role)).toEqual(["user"]);
    } finally {
      services.restore();
    }
  });
});
