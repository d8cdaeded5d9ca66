/**
 * WhatsApp media and users without a phone number: image, video and document
 * captions as text, audio (voice notes), stickers, messages keyed and answered by
 * BSUID when they have no `from`, system messages without `from` acknowledged, and
 * `GET /v1/attachments/{id}` through the media id lookup and its URL, both with
 * the access token, which never reaches the agent. Meta is faked with
 * `vi.spyOn(globalThis, "fetch")`.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { AGENT_TOKEN, AGENT_URL } from "../agent/support";
import { bytesOf, errorOf, expectNoneOf, fetchAttachment, expectRefusedAsUnconfigured } from "../attachments/support";
import audioVoice from "../fixtures/whatsapp/audio-voice.json";
import bsuidText from "../fixtures/whatsapp/bsuid-text.json";
import documentForwarded from "../fixtures/whatsapp/document-forwarded.json";
import imageMessage from "../fixtures/whatsapp/image-message.json";
import reactionMessage from "../fixtures/whatsapp/reaction-message.json";
import stickerMessage from "../fixtures/whatsapp/sticker.json";
import systemMessage from "../fixtures/whatsapp/system-message.json";
import textMessage from "../fixtures/whatsapp/text-message.json";
import videoReply from "../fixtures/whatsapp/video-reply.json";
import {
  BASE,
  T0,
  captureFetch,
  messagesOf,
  restoreClock,
  runAlarm,
  sessionsOfKey,
  setNow,
  tableCounts,
  useConfig,
  type Captured,
} from "../helpers";

const APP_SECRET = "wa-media-app-secret";
const ACCESS_TOKEN = "EAAGmedia-access-token";
const API = "https://graph-media.test/v21.0";
const LOOKASIDE = "https://lookaside.fbsbx.test/whatsapp_business/attachments/?mid=2001&ext=1749416700&hash=ATuZ";
const PHOTO = bytesOf(7000, 13);

let lookupAnswer: (mediaId: string) => Response;
let downloadAnswer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };

const config = (extra: Record<string, string> = {}) => ({
  WHATSAPP_VERIFY_TOKEN: "verify",
  WHATSAPP_APP_SECRET: APP_SECRET,
  WHATSAPP_ACCESS_TOKEN: ACCESS_TOKEN,
  WHATSAPP_PHONE_NUMBER_ID: "106540352242922",
  WHATSAPP_API_BASE: API,
  ...extra,
});

beforeEach(() => {
  setNow(T0);
  useConfig(config());
  lookupAnswer = (mediaId) =>
    Response.json({
      messaging_product: "whatsapp",
      url: LOOKASIDE,
      mime_type: "image/jpeg",
      sha256: "eYBVR4sqHjvGGbDVoa0NtrSuDtINVeKppYmSQnubhNw=",
      file_size: PHOTO.length,
      id: mediaId,
    });
  downloadAnswer = () => new Response(PHOTO, { headers: { "content-type": "image/jpeg" } });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
    if (request.url === `${API}/106540352242922/messages`) return Response.json({ messages: [{ id: "wamid.x" }] });
    if (request.url.startsWith(`${API}/`)) return lookupAnswer(request.url.slice(API.length + 1));
    if (request.url === LOOKASIDE) return downloadAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

let counter = 0;
const freshNumber = () => `${4917700000000 + ++counter * 1000 + Math.floor(Math.random() * 1000)}`;

/** A fixture with a fresh sender number (or BSUID) and message ids. */
function delivery(fixture: object): { body: any; sender: string } {
  const body = structuredClone(fixture) as any;
  const value = body.entry[0].changes[0].value;
  const number = freshNumber();
  const bsuid = `US.${number}0000`;
  for (const message of value.messages ?? []) {
    if (message.from) message.from = number;
    if (message.from_user_id) message.from_user_id = bsuid;
    message.id = `wamid.${crypto.randomUUID()}`;
  }
  for (const contact of value.contacts ?? []) {
    if (contact.wa_id) contact.wa_id = number;
    if (contact.user_id) contact.user_id = bsuid;
  }
  const first = value.messages?.[0];
  return { body, sender: first?.from ? number : bsuid };
}

async function post(body: unknown): Promise<Response> {
  const raw = JSON.stringify(body);
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/whatsapp`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-hub-signature-256": `sha256=${await hmacSha256Hex(APP_SECRET, raw)}`,
      },
      body: raw,
    }),
  );
}

async function handedOff(fixture: object) {
  useConfig(config({ AGENT_URL, AGENT_TOKEN }));
  const { body, sender } = delivery(fixture);
  expect((await post(body)).status).toBe(200);
  await runAlarm(`whatsapp:dm:${sender}`);
  const call = outbound.calls.filter((c) => c.url === AGENT_URL).at(-1)!;
  return { sender, call, request: call.json };
}

describe("what counts as a message", () => {
  it("routes an image with its caption as the text", async () => {
    const { request, call } = await handedOff(imageMessage);
    expect(request.message.text).toBe("Is this the right model?");
    expect(request.message.attachments).toEqual([
      {
        id: expect.stringMatching(/^att_/),
        kind: "image",
        mime_type: "image/jpeg",
        name: null,
        size: null,
        path: expect.stringMatching(/^\/v1\/attachments\/att_/),
      },
    ]);
    expectNoneOf(call.body, [ACCESS_TOKEN, "1003383421387256", API]);
  });

  const kinds: [string, object, string, object][] = [
    [
      "a forwarded document with a caption and file name",
      documentForwarded,
      "Can you summarise this contract?",
      { kind: "file", mime_type: "application/pdf", name: "contract-2031.pdf" },
    ],
    ["a voice note (audio with voice: true)", audioVoice, "", { kind: "voice", mime_type: "audio/ogg; codecs=opus" }],
    [
      "a video replying to the business",
      videoReply,
      "is this the noise you meant?",
      { kind: "video", mime_type: "video/mp4" },
    ],
    ["a sticker", stickerMessage, "", { kind: "sticker", mime_type: "image/webp" }],
  ];
  for (const [what, fixture, text, attachment] of kinds) {
    it(`routes ${what}`, async () => {
      const { request } = await handedOff(fixture);
      expect(request.message.text).toBe(text);
      expect(request.message.attachments).toEqual([expect.objectContaining(attachment)]);
    });
  }

  it("routes plain audio (no voice flag) as audio", async () => {
    const plain = structuredClone(audioVoice) as any;
    delete plain.entry[0].changes[0].value.messages[0].audio.voice;
    expect((await handedOff(plain)).request.message.attachments[0].kind).toBe("audio");
  });

  it("only audio is a voice note: a voice flag on a document leaves it a file", async () => {
    const flagged = structuredClone(documentForwarded) as any;
    flagged.entry[0].changes[0].value.messages[0].document.voice = true;
    expect((await handedOff(flagged)).request.message.attachments[0].kind).toBe("file");
  });

  it("keeps keying a user with a phone number by it, even when a BSUID comes along", async () => {
    const { sender, request } = await handedOff(documentForwarded);
    expect(request.session.key).toBe(`whatsapp:dm:${sender}`);
    expect(sender).toMatch(/^\d+$/);
  });
});

describe("users without a phone number (BSUID)", () => {
  it("keys a message without from by its from_user_id and answers it as recipient", async () => {
    const { body, sender } = delivery(bsuidText);
    expect(sender).toMatch(/^US\./);
    const response = await post(body);
    expect(response.status).toBe(200);
    const [session] = await sessionsOfKey(`whatsapp:dm:${sender}`);
    expect((await messagesOf(session!.id)).map((m) => m.text)).toEqual(["hi, no phone number here"]);
    await runAlarm(`whatsapp:dm:${sender}`);
    const reply = outbound.calls.find((c) => c.url === `${API}/106540352242922/messages`)!;
    expect(reply.json).toEqual({
      messaging_product: "whatsapp",
      recipient: sender,
      type: "text",
      text: { body: "echo: hi, no phone number here" },
    });
  });

  it("keys each message by its own from_user_id when a delivery carries two users without phone numbers", async () => {
    const one = delivery(bsuidText);
    const two = delivery(bsuidText);
    const value = one.body.entry[0].changes[0].value;
    value.contacts.push(...two.body.entry[0].changes[0].value.contacts);
    value.messages.push(...two.body.entry[0].changes[0].value.messages);
    expect((await post(one.body)).status).toBe(200);
    expect(await sessionsOfKey(`whatsapp:dm:${one.sender}`)).toHaveLength(1);
    expect(await sessionsOfKey(`whatsapp:dm:${two.sender}`)).toHaveLength(1);
  });

  it("falls back to the delivery's one contact user_id when the message carries no BSUID", async () => {
    const { body, sender } = delivery(bsuidText);
    delete body.entry[0].changes[0].value.messages[0].from_user_id;
    expect((await post(body)).status).toBe(200);
    expect(await sessionsOfKey(`whatsapp:dm:${sender}`)).toHaveLength(1);
  });

  it("answers 400 to a text message with neither from nor any BSUID, storing nothing", async () => {
    const { body } = delivery(bsuidText);
    const value = body.entry[0].changes[0].value;
    delete value.messages[0].from_user_id;
    delete value.contacts;
    const before = await tableCounts();
    const response = await post(body);
    expect(response.status).toBe(400);
    expect(((await response.json()) as any).error).toEqual({
      code: "invalid_body",
      message: "entry.0.changes.0.value.messages.0.from: a message needs from or from_user_id",
    });
    expect(await tableCounts()).toEqual(before);
  });

  it("answers 400 to a message without any BSUID of its own when the delivery names two users: it does not guess", async () => {
    const one = delivery(bsuidText);
    const two = delivery(bsuidText);
    const value = one.body.entry[0].changes[0].value;
    value.contacts.push(...two.body.entry[0].changes[0].value.contacts);
    delete value.messages[0].from_user_id;
    const before = await tableCounts();
    const response = await post(one.body);
    expect(response.status).toBe(400);
    expect(((await response.json()) as any).error.message).toBe(
      "entry.0.changes.0.value.messages.0.from: a message needs from or from_user_id",
    );
    expect(await tableCounts()).toEqual(before);
  });

  it("acknowledges a system message without from, and still routes the text next to it", async () => {
    const system = delivery(systemMessage).body;
    const text = delivery(textMessage);
    system.entry[0].changes[0].value.messages.push(text.body.entry[0].changes[0].value.messages[0]);
    const response = await post(system);
    expect(response.status).toBe(200);
    expect(await sessionsOfKey(`whatsapp:dm:${text.sender}`)).toHaveLength(1);
  });

  const ignored: [string, object][] = [
    ["a system message without from", systemMessage],
    ["a reaction", reactionMessage],
  ];
  for (const [what, fixture] of ignored) {
    it(`answers 200 to ${what} and routes nothing`, async () => {
      const before = await tableCounts();
      expect((await post(delivery(fixture).body)).status).toBe(200);
      expect(await tableCounts()).toEqual(before);
    });
  }
});

describe("GET /v1/attachments/{id} from WhatsApp", () => {
  it("looks the media id up, then downloads its URL, both with the access token", async () => {
    const { request } = await handedOff(imageMessage);
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("image/jpeg");
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(PHOTO);
    // The media calls (the read receipt with typing indicator at dispatch is not one).
    const meta = outbound.calls.filter(
      (c) => (c.url.startsWith(API) && c.json?.status !== "read") || c.url === LOOKASIDE,
    );
    expect(meta.map((c) => [c.method, c.url, c.headers.authorization, c.redirect])).toEqual([
      ["GET", `${API}/1003383421387256`, `Bearer ${ACCESS_TOKEN}`, "manual"],
      ["GET", LOOKASIDE, `Bearer ${ACCESS_TOKEN}`, "manual"],
    ]);
  });

  it("answers 413 when the lookup reports a file over ATTACHMENT_MAX_BYTES, without downloading it", async () => {
    const { request } = await handedOff(imageMessage);
    useConfig(config({ AGENT_URL, AGENT_TOKEN, ATTACHMENT_MAX_BYTES: String(PHOTO.length - 1) }));
    const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
    expect(error.status).toBe(413);
    expect(outbound.calls.filter((c) => c.url === LOOKASIDE)).toHaveLength(0);
  });

  const failures: [string, () => void, string][] = [
    [
      "the lookup answers 400 (media id expired)",
      () =>
        (lookupAnswer = () =>
          Response.json(
            { error: { message: "Unsupported get request", type: "GraphMethodException", code: 100 } },
            { status: 400 },
          )),
      "whatsapp media lookup answered HTTP 400",
    ],
    [
      "the lookup fails with an error repeating the token",
      () =>
        (lookupAnswer = () => {
          throw new TypeError(`connection reset (Bearer ${ACCESS_TOKEN})`);
        }),
      "whatsapp media lookup failed: TypeError: connection reset (Bearer [redacted])",
    ],
    [
      "the lookup gives no url",
      () => (lookupAnswer = () => Response.json({ id: "x" })),
      "whatsapp media lookup gave no url",
    ],
    [
      "the lookup answers with a body that is not JSON",
      () =>
        (lookupAnswer = () => new Response("<html>maintenance</html>", { headers: { "content-type": "text/html" } })),
      "whatsapp media lookup gave no url",
    ],
    [
      "the download answers 401",
      () => (downloadAnswer = () => new Response("", { status: 401 })),
      "whatsapp media download answered HTTP 401",
    ],
    [
      "the download fails",
      () =>
        (downloadAnswer = () => {
          throw new TypeError(`connect failed (token ${ACCESS_TOKEN})`);
        }),
      "whatsapp media download failed: TypeError: connect failed (token [redacted])",
    ],
  ];
  for (const [what, arrange, why] of failures) {
    it(`answers 502 when ${what}, saying why and never echoing the token`, async () => {
      const { request } = await handedOff(imageMessage);
      arrange();
      const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
      const text = await response.text();
      expect(response.status).toBe(502);
      expect(JSON.parse(text).error.message).toBe(why);
      expectNoneOf(text, [ACCESS_TOKEN]);
    });
  }

  // [what, the variables since, the invalid-configuration log lines: platform and error]
  const unconfigured: [string, Record<string, string>, [string, unknown][]][] = [
    ["WhatsApp was turned off since (its secrets removed)", { AGENT_URL, AGENT_TOKEN }, []],
    [
      "WhatsApp's settings broke since (the access token removed)",
      config({ AGENT_URL, AGENT_TOKEN, WHATSAPP_ACCESS_TOKEN: "" }),
      [["whatsapp", expect.stringContaining("WHATSAPP_ACCESS_TOKEN")]],
    ],
  ];
  for (const [what, vars, invalidLines] of unconfigured) {
    it(`answers 502 'whatsapp is not configured' when ${what}, calling no Meta API`, async () => {
      const { request } = await handedOff(imageMessage);
      useConfig(vars);
      const download = () => fetchAttachment(request.message.attachments[0].path, request.run_token);
      await expectRefusedAsUnconfigured("whatsapp", download, outbound, invalidLines);
    });
  }

  it("refuses another conversation's run (403) before calling Meta", async () => {
    const first = await handedOff(imageMessage);
    const second = await handedOff(textMessage);
    const before = outbound.calls.length;
    expect((await fetchAttachment(first.request.message.attachments[0].path, second.request.run_token)).status).toBe(
      403,
    );
    expect(outbound.calls.length).toBe(before);
  });
});
