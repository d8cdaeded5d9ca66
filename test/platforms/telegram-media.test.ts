/**
 * Telegram media: captions as text, media alone as text "", each media field as
 * an attachment, and `GET /v1/attachments/{id}` through `getFile` and the file
 * download with the bot token, which never reaches the agent. The Bot API is faked
 * with `vi.spyOn(globalThis, "fetch")`; fixtures are recorded-shape updates.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { AGENT_TOKEN, AGENT_URL } from "../agent/support";
import { bytesOf, errorOf, expectNoneOf, fetchAttachment, expectRefusedAsUnconfigured } from "../attachments/support";
import animation from "../fixtures/telegram/animation.json";
import audioEdited from "../fixtures/telegram/audio-edited.json";
import documentForwarded from "../fixtures/telegram/document-forwarded.json";
import location from "../fixtures/telegram/location.json";
import messageReaction from "../fixtures/telegram/message-reaction.json";
import newChatMembers from "../fixtures/telegram/new-chat-members.json";
import photoCaption from "../fixtures/telegram/photo-caption.json";
import sticker from "../fixtures/telegram/sticker.json";
import videoAudio from "../fixtures/telegram/video-audio-message.json";
import videoNoteReply from "../fixtures/telegram/video-note-reply.json";
import voice from "../fixtures/telegram/voice.json";
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
import { answerAfter } from "./outbound";

const TOKEN = "7000000001:AAmedia-bot-token";
const SECRET = "tg-media-secret_1";
const API = "https://telegram-media.test";
const FILE_PATH = "photos/file_17.jpg";
const PHOTO = bytesOf(4000, 3);

let getFileAnswer: () => Response;
let downloadAnswer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };

beforeEach(() => {
  setNow(T0);
  useConfig({
    TELEGRAM_BOT_TOKEN: TOKEN,
    TELEGRAM_WEBHOOK_SECRET: SECRET,
    TELEGRAM_API_BASE: API,
    AGENT_URL,
    AGENT_TOKEN,
  });
  getFileAnswer = () =>
    Response.json({
      ok: true,
      result: { file_id: "x", file_unique_id: "y", file_size: PHOTO.length, file_path: FILE_PATH },
    });
  downloadAnswer = () =>
    new Response(PHOTO, { headers: { "content-type": "image/jpeg", "content-length": String(PHOTO.length) } });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
    if (request.url === `${API}/bot${TOKEN}/getFile`) return getFileAnswer();
    if (request.url.startsWith(`${API}/file/bot${TOKEN}/`)) return downloadAnswer();
    if (request.url.startsWith(`${API}/bot${TOKEN}/`)) return Response.json({ ok: true, result: {} });
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

let counter = 0;
const fresh = () => 700_000_000 + ++counter * 1000 + Math.floor(Math.random() * 1000);

/** A fixture with a fresh update id and chat (and sender, in a private chat). */
function update(fixture: object): any {
  const copy = structuredClone(fixture) as any;
  copy.update_id = fresh();
  const message = copy.message ?? copy.edited_message ?? copy.channel_post;
  if (message) {
    message.chat.id = message.chat.type === "private" ? fresh() : -(1_000_000_000_000 + fresh());
    if (message.chat.type === "private") message.from.id = message.chat.id;
    else message.from.id = fresh();
  }
  return copy;
}

async function post(body: unknown): Promise<Response> {
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/telegram`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": SECRET },
      body: JSON.stringify(body),
    }),
  );
}

function keyOf(u: any): string {
  const m = u.message;
  if (m.chat.type === "private") return `telegram:dm:${m.chat.id}`;
  const thread = m.is_topic_message ? `:${m.message_thread_id}` : "";
  return `telegram:group:${m.chat.id}${thread}:${m.from.id}`;
}

/** Posts an update and hands its message to the agent; returns the hand-off as sent. */
async function handedOff(fixture: object) {
  const u = update(fixture);
  expect((await post(u)).status).toBe(200);
  await runAlarm(keyOf(u));
  const call = outbound.calls.filter((c) => c.url === AGENT_URL).at(-1)!;
  return { u, call, request: call.json, key: keyOf(u) };
}

describe("what counts as a message", () => {
  it("routes a photo with its caption as the text and the largest size as one image", async () => {
    const { request, call } = await handedOff(photoCaption);
    expect(request.message.text).toBe("what is this?");
    expect(request.message.attachments).toEqual([
      {
        id: expect.stringMatching(/^att_/),
        kind: "image",
        mime_type: null,
        name: null,
        size: 48213,
        path: `/v1/attachments/${request.message.attachments[0].id}`,
      },
    ]);
    // No file id (of either size) and no bot token in what the agent receives.
    expectNoneOf(call.body, [TOKEN, "AgACAgQAAxkBAAIBn2Vby", "AgACAgQAAxkBAAIBn2Vbx", API]);
  });

  const kinds: [string, object, string, object][] = [
    ["a voice note", voice, "", { kind: "voice", mime_type: "audio/ogg", name: null, size: 15873 }],
    [
      "a forwarded document with a caption and entities",
      documentForwarded,
      "What changed in v1.2? See https://example.com/v1.2",
      { kind: "file", mime_type: "application/pdf", name: "changelog-v1.2.pdf", size: 734003 },
    ],
    [
      "an animation in a forum topic, replying (its mirror `document` not listed twice)",
      animation,
      "",
      { kind: "video", mime_type: "video/mp4", name: "shipit.mp4", size: 120034 },
    ],
    [
      "a round video note replying to the bot in a group",
      videoNoteReply,
      "",
      { kind: "video", mime_type: null, name: null, size: 401233 },
    ],
    [
      "a video with a caption",
      videoAudio,
      "does this look right?",
      { kind: "video", mime_type: "video/quicktime", name: "demo.mov", size: 5123000 },
    ],
    [
      "an animated sticker",
      sticker,
      "",
      { kind: "sticker", mime_type: "application/x-tgsticker", name: null, size: 38421 },
    ],
  ];
  for (const [what, fixture, text, attachment] of kinds) {
    it(`routes ${what}`, async () => {
      const { request, key } = await handedOff(fixture);
      expect(request.message.text).toBe(text);
      expect(request.message.attachments).toEqual([expect.objectContaining(attachment)]);
      expect(request.message.attachments[0]).not.toHaveProperty("source");
      expect(await sessionsOfKey(key)).toHaveLength(1);
    });
  }

  it("keeps an animation's topic as the session's thread", async () => {
    const { key, u } = await handedOff(animation);
    expect(key).toBe(`telegram:group:${u.message.chat.id}:5512:${u.message.from.id}`);
  });

  it("routes a video sticker and a static sticker with their formats", async () => {
    const video = structuredClone(sticker) as any;
    video.message.sticker.is_animated = false;
    video.message.sticker.is_video = true;
    expect((await handedOff(video)).request.message.attachments[0].mime_type).toBe("video/webm");
    const still = structuredClone(video);
    still.message.sticker.is_video = false;
    expect((await handedOff(still)).request.message.attachments[0].mime_type).toBe("image/webp");
  });

  const ignored: [string, object][] = [
    ["an edited audio message (an edit is not a new turn)", audioEdited],
    ["a location (neither text nor media)", location],
    ["a reaction", messageReaction],
    ["a service message", newChatMembers],
  ];
  for (const [what, fixture] of ignored) {
    it(`answers 200 to ${what} and routes nothing`, async () => {
      const before = await tableCounts();
      const response = await post(update(fixture));
      expect(response.status).toBe(200);
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }

  it("answers 400 to a photo without file_id and stores nothing", async () => {
    const broken = update(photoCaption);
    delete broken.message.photo[1].file_id;
    const before = await tableCounts();
    const response = await post(broken);
    expect(response.status).toBe(400);
    expect(((await response.json()) as any).error.message).toContain("message.photo.1.file_id");
    expect(await tableCounts()).toEqual(before);
  });

  it("stores the caption as the message text", async () => {
    const u = update(photoCaption);
    const response = await post(u);
    expect(response.status).toBe(200);
    const [session] = await sessionsOfKey(keyOf(u));
    const [message] = await messagesOf(session!.id);
    expect(message!.text).toBe("what is this?");
  });
});

describe("GET /v1/attachments/{id} from Telegram", () => {
  it("calls getFile then downloads {base}/file/bot{token}/{file_path}, and streams the bytes", async () => {
    const { request } = await handedOff(photoCaption);
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("image/jpeg");
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(PHOTO);
    // The file calls (the typing indicator at dispatch is not one).
    const platform = outbound.calls.filter((c) => c.url.startsWith(API) && !c.url.endsWith("/sendChatAction"));
    expect(platform.map((c) => [c.method, c.url, c.json])).toEqual([
      ["POST", `${API}/bot${TOKEN}/getFile`, { file_id: "AgACAgQAAxkBAAIBn2Vby" }],
      ["GET", `${API}/file/bot${TOKEN}/${FILE_PATH}`, null],
    ]);
    // The download URL carries the token: a redirect is never followed with it.
    expect(platform[1]!.redirect).toBe("manual");
  });

  it("answers 413 when getFile reports a file over ATTACHMENT_MAX_BYTES, without downloading it", async () => {
    useConfig({
      TELEGRAM_BOT_TOKEN: TOKEN,
      TELEGRAM_WEBHOOK_SECRET: SECRET,
      TELEGRAM_API_BASE: API,
      AGENT_URL,
      AGENT_TOKEN,
      ATTACHMENT_MAX_BYTES: String(PHOTO.length - 1),
    });
    const { request } = await handedOff(photoCaption);
    const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
    expect(error.status).toBe(413);
    expect(outbound.calls.filter((c) => c.url.includes("/file/bot"))).toHaveLength(0);
  });

  const failures: [string, () => void, string][] = [
    [
      "getFile answers 400 (file too big for the Bot API)",
      () =>
        (getFileAnswer = () =>
          Response.json({ ok: false, error_code: 400, description: "Bad Request: file is too big" }, { status: 400 })),
      'telegram getFile: HTTP 400: {"ok":false,"error_code":400,"description":"Bad Request: file is too big"}',
    ],
    [
      "getFile fails with an error repeating the token",
      () =>
        (getFileAnswer = () => {
          throw new TypeError(`connection reset (bot ${TOKEN})`);
        }),
      "telegram getFile: TypeError: connection reset (bot [redacted])",
    ],
    [
      "getFile answers without a file_path",
      () => (getFileAnswer = () => Response.json({ ok: true, result: {} })),
      "telegram getFile gave no file_path",
    ],
    [
      "the download answers 404",
      () => (downloadAnswer = () => new Response("Not Found", { status: 404 })),
      "telegram file download answered HTTP 404",
    ],
    [
      "the download fails with an error naming its URL",
      () =>
        (downloadAnswer = () => {
          throw new TypeError(`fetch failed: ${API}/file/bot${TOKEN}/${FILE_PATH}`);
        }),
      `telegram file download failed: TypeError: fetch failed: ${API}/file/bot[redacted]/${FILE_PATH}`,
    ],
  ];
  for (const [what, arrange, why] of failures) {
    it(`answers 502 when ${what}, saying why and never echoing the token`, async () => {
      const { request } = await handedOff(photoCaption);
      arrange();
      const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
      const text = await response.text();
      expect(response.status).toBe(502);
      expect(JSON.parse(text).error.message).toBe(why);
      expectNoneOf(text, [TOKEN]);
    });
  }

  it("waits for a Bot API slow to answer getFile, then downloads", async () => {
    const { request } = await handedOff(photoCaption);
    const fake = vi.mocked(globalThis.fetch).getMockImplementation()!;
    vi.mocked(globalThis.fetch).mockImplementation(async (input, init) => {
      if (String(input).endsWith("/getFile")) await answerAfter(50, init?.signal);
      return fake(input, init);
    });
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(PHOTO);
  });

  // [what, the variables since, the invalid-configuration log lines: platform and error]
  const unconfigured: [string, Record<string, string>, [string, unknown][]][] = [
    ["Telegram was turned off since (its secrets removed)", { AGENT_URL, AGENT_TOKEN }, []],
    [
      "Telegram's settings broke since (the webhook secret removed)",
      { TELEGRAM_BOT_TOKEN: TOKEN, TELEGRAM_API_BASE: API, AGENT_URL, AGENT_TOKEN },
      [["telegram", expect.stringContaining("TELEGRAM_WEBHOOK_SECRET")]],
    ],
  ];
  for (const [what, vars, invalidLines] of unconfigured) {
    it(`answers 502 'telegram is not configured' when ${what}, calling no Bot API`, async () => {
      const { request } = await handedOff(photoCaption);
      useConfig(vars);
      const download = () => fetchAttachment(request.message.attachments[0].path, request.run_token);
      await expectRefusedAsUnconfigured("telegram", download, outbound, invalidLines);
    });
  }
});
