/**
 * Slack files and what counts as a message: a file share's text is the comment,
 * files alone route with text "", Slackbot's notices and other bots' shares do
 * not route, and `GET /v1/attachments/{id}` downloads `url_private_download` with
 * the bot token, only from files.slack.com or SLACK_API_BASE's origin. The Web API
 * and file host are faked with `vi.spyOn(globalThis, "fetch")`.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hmacSha256Hex } from "../../src/crypto";
import { AGENT_TOKEN, AGENT_URL } from "../agent/support";
import { bytesOf, errorOf, expectNoneOf, fetchAttachment, expectRefusedAsUnconfigured } from "../attachments/support";
import audioClip from "../fixtures/slack/message-audio-clip.json";
import botFileShare from "../fixtures/slack/message-bot-file-share.json";
import messageChanged from "../fixtures/slack/message-changed.json";
import messageDeleted from "../fixtures/slack/message-deleted.json";
import fileShare from "../fixtures/slack/message-file-share.json";
import filesOnly from "../fixtures/slack/message-files-only.json";
import slackbot from "../fixtures/slack/message-slackbot.json";
import threadBroadcast from "../fixtures/slack/message-thread-broadcast.json";
import {
  BASE,
  T0,
  captureFetch,
  restoreClock,
  runAlarm,
  setNow,
  tableCounts,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const SIGNING_SECRET = "slack-media-signing-secret";
const BOT_TOKEN = "xoxb-media-bot-token";
const SLACK_API = "https://slack-media.test/api";
const CHART = bytesOf(5000, 11);

let fileAnswer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };

const config = (extra: Record<string, string> = {}) => ({
  SLACK_SIGNING_SECRET: SIGNING_SECRET,
  SLACK_BOT_TOKEN: BOT_TOKEN,
  SLACK_API_BASE: SLACK_API,
  AGENT_URL,
  AGENT_TOKEN,
  ...extra,
});

beforeEach(() => {
  setNow(T0);
  useConfig(config());
  fileAnswer = () => new Response(CHART, { headers: { "content-type": "image/png" } });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
    if (request.url.startsWith("https://files.slack.com/")) return fileAnswer();
    if (request.url.startsWith("https://slack-media.test/")) return fileAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

type Json = Record<string, any>;

/** A fixture with a fresh event id, channel and user. */
function fixture(source: Json, edit: (event: Json) => void = () => {}): Json {
  const body = structuredClone(source);
  body.event_id = unique("Ev");
  body.event.channel = unique(body.event.channel_type === "im" ? "D" : "C");
  if (body.event.user && body.event.user !== "USLACKBOT") body.event.user = unique("U");
  edit(body.event);
  return body;
}

async function post(body: Json): Promise<Response> {
  const raw = JSON.stringify(body);
  const timestamp = String(Math.floor(Date.now() / 1000));
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/slack`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": `v0=${await hmacSha256Hex(SIGNING_SECRET, `v0:${timestamp}:${raw}`)}`,
      },
      body: raw,
    }),
  );
}

function keyOf(event: Json): string {
  const type = event.channel_type === "im" ? "dm" : "channel";
  const thread = event.thread_ts ? `:${event.thread_ts}` : "";
  return type === "dm" ? `slack:dm:${event.channel}` : `slack:channel:${event.channel}${thread}:${event.user}`;
}

async function handedOff(source: Json, edit?: (event: Json) => void) {
  const body = fixture(source, edit);
  expect((await post(body)).status).toBe(200);
  await runAlarm(keyOf(body.event));
  const call = outbound.calls.filter((c) => c.url === AGENT_URL).at(-1);
  expect(call).toBeDefined();
  return { body, call: call!, request: call!.json };
}

describe("what counts as a message", () => {
  it("routes a file share in a thread: the comment is the text, each file an attachment", async () => {
    const { request, call, body } = await handedOff(fileShare);
    expect(request.session.key).toBe(`slack:channel:${body.event.channel}:1926244800.000100:${body.event.user}`);
    expect(request.message.text).toBe("can you read this chart?");
    expect(request.message.attachments).toEqual([
      {
        id: expect.stringMatching(/^att_/),
        kind: "image",
        mime_type: "image/png",
        name: "q3-chart.png",
        size: 48213,
        path: expect.stringMatching(/^\/v1\/attachments\/att_/),
      },
      expect.objectContaining({ kind: "file", mime_type: "text/csv", name: "q3.csv", size: 912 }),
    ]);
    expectNoneOf(call.body, [BOT_TOKEN, "files.slack.com", "F0CHART001", "slack-files.com"]);
  });

  it("routes files without any text (no subtype) with text ''", async () => {
    const { request } = await handedOff(filesOnly);
    expect(request.message.text).toBe("");
    expect(request.message.attachments).toEqual([expect.objectContaining({ kind: "image", name: "diagram.png" })]);
  });

  it("routes files whose event has no text field at all with text ''", async () => {
    const { request } = await handedOff(filesOnly, (event) => delete event.text);
    expect(request.message.text).toBe("");
    expect(request.message.attachments).toEqual([expect.objectContaining({ kind: "image", name: "diagram.png" })]);
  });

  it("routes an audio clip as a voice note", async () => {
    const { request } = await handedOff(audioClip);
    expect(request.message.attachments).toEqual([
      expect.objectContaining({ kind: "voice", mime_type: "audio/webm", size: 30211 }),
    ]);
  });

  it("routes a thread reply also sent to the channel (thread_broadcast) in its thread", async () => {
    const { request, body } = await handedOff(threadBroadcast);
    expect(request.message.text).toBe("also sending this to the channel");
    expect(request.message.thread_id).toBe("1926244800.000100");
    expect(request.session.key).toBe(`slack:channel:${body.event.channel}:1926244800.000100:${body.event.user}`);
  });

  // Slack's `title` is what the uploader typed over the file, often not a file name;
  // `name` is the file's own name. A file without a name (a post, some external
  // files) is still named, by its title.
  it("names each file by its file name, or by its title when Slack gives no name", async () => {
    const { request } = await handedOff(fileShare, (event) => {
      event.files[0].title = "Q3 revenue by region";
      delete event.files[1].name;
      event.files[1].title = "Q3 figures";
    });
    expect(request.message.attachments.map((a: Json) => a.name)).toEqual(["q3-chart.png", "Q3 figures"]);
  });

  it("leaves a deleted (tombstone) file out", async () => {
    const { request } = await handedOff(fileShare, (event) => (event.files[1].mode = "tombstone"));
    expect(request.message.attachments.map((a: Json) => a.name)).toEqual(["q3-chart.png"]);
  });

  const ignored: [string, Json][] = [
    ["a Slackbot notice in a DM (USLACKBOT, no bot_id)", slackbot],
    ["another bot's file share", botFileShare],
    ["an edit", messageChanged],
    ["a deletion of a file share", messageDeleted],
  ];
  for (const [what, source] of ignored) {
    it(`answers 200 to ${what} and routes nothing`, async () => {
      const before = await tableCounts();
      const body = fixture(source);
      const response = await post(body);
      expect(response.status).toBe(200);
      expect(await tableCounts()).toEqual(before);
      expect(outbound.calls).toHaveLength(0);
    });
  }

  it("answers 200 to a file share whose only file was deleted, and routes nothing", async () => {
    const before = await tableCounts();
    const body = fixture(filesOnly, (event) => (event.files[0].mode = "tombstone"));
    expect((await post(body)).status).toBe(200);
    expect(await tableCounts()).toEqual(before);
  });

  it("answers 400 to a file without an id", async () => {
    const before = await tableCounts();
    const response = await post(fixture(fileShare, (event) => delete event.files[0].id));
    expect(response.status).toBe(400);
    expect(await tableCounts()).toEqual(before);
  });
});

describe("GET /v1/attachments/{id} from Slack", () => {
  it("downloads url_private_download with the bot token and streams the bytes", async () => {
    const { request } = await handedOff(fileShare);
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("image/png");
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(CHART);
    const downloads = outbound.calls.filter((c) => c.url.startsWith("https://files.slack.com/"));
    expect(downloads.map((c) => [c.method, c.url, c.headers.authorization, c.redirect])).toEqual([
      [
        "GET",
        "https://files.slack.com/files-pri/T0GATEWAY-F0CHART001/download/q3-chart.png",
        `Bearer ${BOT_TOKEN}`,
        "manual",
      ],
    ]);
  });

  it("uses url_private when there is no download URL", async () => {
    const { request } = await handedOff(fileShare, (event) => delete event.files[0].url_private_download);
    expect((await fetchAttachment(request.message.attachments[0].path, request.run_token)).status).toBe(200);
    expect(outbound.calls.at(-1)!.url).toBe("https://files.slack.com/files-pri/T0GATEWAY-F0CHART001/q3-chart.png");
  });

  it("sends the token to SLACK_API_BASE's origin (a fake Slack)", async () => {
    const url = "https://slack-media.test/files-pri/T0-F1/download/a.png";
    const { request } = await handedOff(fileShare, (event) => (event.files[0].url_private_download = url));
    expect((await fetchAttachment(request.message.attachments[0].path, request.run_token)).status).toBe(200);
    expect(outbound.calls.at(-1)).toMatchObject({ url, headers: { authorization: `Bearer ${BOT_TOKEN}` } });
  });

  const foreign = [
    "https://evil.test/files-pri/T0-F1/download/a.png",
    "http://files.slack.com/files-pri/T0-F1/download/a.png",
    "https://files.slack.com.evil.test/a.png",
  ];
  for (const url of foreign) {
    it(`never sends the bot token to ${url}: 502 and no request`, async () => {
      const { request } = await handedOff(fileShare, (event) => (event.files[0].url_private_download = url));
      const before = outbound.calls.length;
      const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
      expect(error.status).toBe(502);
      // The agent is told why, without the token.
      expect(error.message).toContain("not on files.slack.com");
      expect(outbound.calls.length).toBe(before);
    });
  }

  it("answers 502 for a file Slack gave no URL for", async () => {
    const { request } = await handedOff(fileShare, (event) => {
      delete event.files[0].url_private_download;
      delete event.files[0].url_private;
    });
    const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
    expect(error.status).toBe(502);
    expect(error.message).toContain("not on files.slack.com");
  });

  const SIGN_IN = "slack answered with a sign-in page (does the bot token have the files:read scope?)";
  const failures: [string, () => Response, string][] = [
    [
      "a sign-in page (200 text/html: the token lacks files:read)",
      () => new Response("<html>", { headers: { "content-type": "text/html; charset=utf-8" } }),
      SIGN_IN,
    ],
    [
      "an empty sign-in answer (200 text/html without a body)",
      () => new Response(null, { headers: { "content-type": "TEXT/HTML" } }),
      SIGN_IN,
    ],
    ["a 403", () => new Response("forbidden", { status: 403 }), "slack file download answered HTTP 403"],
    [
      "a redirect (not followed with the token)",
      () => new Response(null, { status: 302, headers: { location: "https://evil.test/" } }),
      "slack file download answered HTTP 302",
    ],
    ["a 503", () => new Response("down", { status: 503 }), "slack file download answered HTTP 503"],
    [
      "a network error that repeats the request's authorization header",
      () => {
        throw new TypeError(`connection reset (authorization: Bearer ${BOT_TOKEN})`);
      },
      "slack file download failed: TypeError: connection reset (authorization: Bearer [redacted])",
    ],
  ];
  for (const [what, answer, why] of failures) {
    it(`answers 502 to ${what}, saying why`, async () => {
      const { request } = await handedOff(fileShare);
      fileAnswer = answer;
      const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
      expect(response.status).toBe(502);
      const text = await response.text();
      expect(JSON.parse(text).error.message).toBe(why);
      expectNoneOf(text, [BOT_TOKEN]);
      expect(outbound.calls.filter((c) => c.url.startsWith("https://evil.test"))).toHaveLength(0);
    });
  }

  // Only an answer whose type is text/html is taken for the sign-in page; a file
  // the user shared as HTML, or one whose type merely names text/html, is the file.
  const served: [string, string, string][] = [
    ["an HTML file the user shared (listed as text/html)", "text/html", "text/html; charset=utf-8"],
    [
      "a saved web page (served as multipart/related of text/html)",
      "message/rfc822",
      'multipart/related; type="text/html"',
    ],
  ];
  for (const [what, listed, answered] of served) {
    it(`serves ${what} as the file`, async () => {
      const { request } = await handedOff(fileShare, (event) => (event.files[0].mimetype = listed));
      fileAnswer = () => new Response("<html><body>the page</body></html>", { headers: { "content-type": answered } });
      const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
      expect(response.status).toBe(200);
      expect(response.headers.get("content-type")).toBe(answered);
      expect(await response.text()).toBe("<html><body>the page</body></html>");
    });
  }

  // [what, the variables since, the invalid-configuration log lines: platform and error]
  const unconfigured: [string, Record<string, string>, [string, unknown][]][] = [
    [
      "Slack was turned off since (both secrets removed)",
      config({ SLACK_SIGNING_SECRET: "", SLACK_BOT_TOKEN: "" }),
      [],
    ],
    [
      "Slack's settings broke since (the bot token removed)",
      config({ SLACK_BOT_TOKEN: "" }),
      [["slack", expect.stringContaining("SLACK_BOT_TOKEN")]],
    ],
  ];
  for (const [what, vars, invalidLines] of unconfigured) {
    it(`answers 502 'slack is not configured' when ${what}, downloading nothing`, async () => {
      const { request } = await handedOff(fileShare);
      useConfig(vars);
      const download = () => fetchAttachment(request.message.attachments[0].path, request.run_token);
      await expectRefusedAsUnconfigured("slack", download, outbound, invalidLines);
    });
  }

  it("answers 413 when the download's content-length is over ATTACHMENT_MAX_BYTES", async () => {
    useConfig(config({ ATTACHMENT_MAX_BYTES: "4999" }));
    const { request } = await handedOff(fileShare);
    fileAnswer = () => new Response(CHART, { headers: { "content-type": "image/png", "content-length": "5000" } });
    expect((await fetchAttachment(request.message.attachments[0].path, request.run_token)).status).toBe(413);
  });
});
