/**
 * Which file of a Telegram message the agent gets, and where its session lives:
 * the largest photo size whatever order the Bot API lists them in, an audio file as
 * `audio`, a text message with an empty photo list routed by its text (never a 500
 * that Telegram would retry forever), and a topic flag without a thread id keeping
 * the message outside any thread. Through the worker's own fetch, real D1 and DOs.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AGENT_TOKEN, AGENT_URL } from "../agent/support";
import photoCaption from "../fixtures/telegram/photo-caption.json";
import voice from "../fixtures/telegram/voice.json";
import {
  BASE,
  T0,
  captureFetch,
  restoreClock,
  runAlarm,
  sessionsOfKey,
  setNow,
  useConfig,
  type Captured,
} from "../helpers";

const TOKEN = "7000000001:AAattach-bot-token";
const SECRET = "tg-attach-secret_1";
const API = "https://telegram-attachments.test";

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
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
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
const fresh = () => 710_000_000 + ++counter * 1000 + Math.floor(Math.random() * 1000);

/** A private-chat fixture with a fresh update id and chat, changed by `edit`. */
function update(fixture: object, edit: (message: any) => void): any {
  const copy = structuredClone(fixture) as any;
  copy.update_id = fresh();
  copy.message.chat.id = fresh();
  copy.message.from.id = copy.message.chat.id;
  edit(copy.message);
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

/** Posts the update, runs its key's alarm, and returns the agent's hand-off body. */
async function handOff(u: any, key = `telegram:dm:${u.message.chat.id}`) {
  expect((await post(u)).status).toBe(200);
  await runAlarm(key);
  const call = outbound.calls.filter((c) => c.url === AGENT_URL).at(-1);
  expect(call, "the message reached the agent").toBeDefined();
  return call!.json;
}

const size = (id: string, width: number, height: number, fileSize: number) => ({
  file_id: id,
  file_unique_id: `u-${id}`,
  file_size: fileSize,
  width,
  height,
});

describe("the largest photo size", () => {
  it.each([
    ["largest first", [size("big", 1280, 960, 90_000), size("small", 90, 67, 1_301), size("mid", 320, 240, 9_000)]],
    [
      "largest in the middle",
      [size("small", 90, 67, 1_301), size("big", 1280, 960, 90_000), size("mid", 320, 240, 9_000)],
    ],
    ["largest last", [size("small", 90, 67, 1_301), size("mid", 320, 240, 9_000), size("big", 1280, 960, 90_000)]],
  ])("is the one handed to the agent, listed %s", async (_order, photo) => {
    const body = await handOff(update(photoCaption, (m) => (m.photo = photo)));
    expect(body.message.attachments).toEqual([
      expect.objectContaining({ kind: "image", mime_type: null, name: null, size: 90_000 }),
    ]);
  });

  it("is picked by area, not by width", async () => {
    const photo = [size("tall", 300, 2000, 60_000), size("wide", 400, 300, 12_000)];
    const body = await handOff(update(photoCaption, (m) => (m.photo = photo)));
    expect(body.message.attachments).toEqual([expect.objectContaining({ size: 60_000 })]);
  });
});

describe("other files and shapes", () => {
  it("routes an audio file as audio, with its type, name and size", async () => {
    const u = update(voice, (m) => {
      delete m.voice;
      m.audio = {
        file_id: "CQACAgQAAxkBaudio",
        file_unique_id: "AgADaudio01",
        duration: 201,
        mime_type: "audio/mpeg",
        file_name: "song.mp3",
        file_size: 4_812_345,
      };
      m.caption = "listen";
    });
    const body = await handOff(u);
    expect(body.message.text).toBe("listen");
    expect(body.message.attachments).toEqual([
      expect.objectContaining({ kind: "audio", mime_type: "audio/mpeg", name: "song.mp3", size: 4_812_345 }),
    ]);
  });

  it("routes a text message whose photo list is empty by its text, with no attachment", async () => {
    const u = update(photoCaption, (m) => {
      m.photo = [];
      delete m.caption;
      m.text = "no picture after all";
    });
    const body = await handOff(u);
    expect(body.message.text).toBe("no picture after all");
    expect(body.message.attachments).toEqual([]);
  });

  it("keeps a message flagged as a topic message but without a thread id outside any thread", async () => {
    const u = update(voice, (m) => {
      m.chat = { id: -(1_000_000_000_000 + fresh()), title: "Forum", type: "supergroup", is_forum: true };
      m.from.id = fresh();
      m.is_topic_message = true;
      delete m.message_thread_id;
    });
    const key = `telegram:group:${u.message.chat.id}:${u.message.from.id}`;
    const body = await handOff(u, key);
    expect(body.message.thread_id).toBeNull();
    expect(body.session.key).toBe(key);
    expect(await sessionsOfKey(key)).toHaveLength(1);
  });
});
