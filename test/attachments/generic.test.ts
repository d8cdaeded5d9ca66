/**
 * Attachments end to end on the generic platform: validation of `attachments`,
 * storage with the message, the operator view, the `session.finalized`
 * transcript, the agent hand-off (ids and paths, never the URL), and
 * `GET /v1/attachments/{id}`: who may read, the bytes streamed, 413 and 502.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  T0,
  adminFetch,
  captureFetch,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  setNow,
  tableCounts,
  unique,
  useConfig,
  type Captured,
} from "../helpers";
import { AGENT_URL, REPLY_URL, agentConfig } from "../agent/support";
import { bytesOf, chunkedBody, errorOf, expectNoneOf, fetchAttachment } from "./support";

const FILE_URL = "https://files.client.test/u/photo.png?sig=s3cr3t-signature";
const PHOTO = bytesOf(3000);

/** The file server's next answer (made when asked, in the caller's I/O context). */
let fileAnswer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig());
  fileAnswer = () => new Response(PHOTO, { headers: { "content-type": "image/png", "content-length": "3000" } });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
    if (request.url === REPLY_URL) return new Response("ok");
    if (request.url.startsWith("https://files.client.test/")) return fileAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

const photo = { url: FILE_URL, kind: "image", mime_type: "image/png", name: "photo.png", size: 3000 };
const handoffs = () => outbound.calls.filter((c) => c.url === AGENT_URL);

/** Sends a message with attachments and hands it to the agent; returns what the agent got. */
async function dispatched(chat: string, body: Record<string, unknown>) {
  const sent = await send({ chat_id: chat, ...body } as any);
  expect(sent.status).toBe(200);
  await runAlarm(genericKey(chat));
  const call = handoffs().at(-1)!;
  return { sessionId: sent.body.session_id as string, call, request: call.json };
}

describe("what a generic client may send", () => {
  it("routes media without text with text '' and its attachments", async () => {
    const chat = unique("chat");
    const { request } = await dispatched(chat, { text: undefined, attachments: [photo] });
    expect(request.message.text).toBe("");
    expect(request.message.attachments).toEqual([
      {
        id: expect.stringMatching(/^att_/),
        kind: "image",
        mime_type: "image/png",
        name: "photo.png",
        size: 3000,
        path: `/v1/attachments/${request.message.attachments[0].id}`,
      },
    ]);
  });

  it("gives unknown fields as null", async () => {
    const chat = unique("chat");
    const { request } = await dispatched(chat, { text: "see", attachments: [{ url: FILE_URL, kind: "file" }] });
    expect(request.message.attachments).toEqual([
      expect.objectContaining({ kind: "file", mime_type: null, name: null, size: null }),
    ]);
  });

  const bad: [string, unknown][] = [
    ["a URL that is not http(s)", [{ ...photo, url: "ftp://files.client.test/a.png" }]],
    ["a file: URL", [{ ...photo, url: "file:///etc/passwd" }]],
    ["no URL", [{ kind: "image" }]],
    ["an unknown kind", [{ ...photo, kind: "hologram" }]],
    ["a negative size", [{ ...photo, size: -1 }]],
    ["attachments that are not a list", { ...photo }],
    ["more than 20 attachments", Array.from({ length: 21 }, () => photo)],
  ];
  for (const [what, attachments] of bad) {
    it(`answers 400 to ${what} and stores nothing`, async () => {
      const before = await tableCounts();
      const sent = await send({ chat_id: unique("chat"), text: "x", attachments } as any);
      expect(sent.status).toBe(400);
      expect(sent.body.error.code).toBe("invalid_body");
      expect(await tableCounts()).toEqual(before);
    });
  }

  it("still answers 400 to a message with neither text nor attachments", async () => {
    const before = await tableCounts();
    const sent = await send({ chat_id: unique("chat"), text: "", attachments: [] } as any);
    expect(sent.status).toBe(400);
    expect(await tableCounts()).toEqual(before);
  });
});

describe("stored with the message, shown to the operator and in the transcript", () => {
  it("stores the attachments with the message and the URL only server-side", async () => {
    const chat = unique("chat");
    const { sessionId, request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const id = request.message.attachments[0].id;
    const [message] = await messagesOf(sessionId);
    expect(JSON.parse((message as any).attachments)).toEqual([
      { id, kind: "image", mime_type: "image/png", name: "photo.png", size: 3000 },
    ]);
    const row = await env.DB.prepare(`SELECT * FROM attachments WHERE id = ?`).bind(id).first<any>();
    expect(row).toMatchObject({ session_id: sessionId, platform: "generic", ref: FILE_URL, kind: "image" });
  });

  it("shows {role, text, at, attachments} in GET /admin/sessions/{id}, [] for text-only messages", async () => {
    const chat = unique("chat");
    const { sessionId, request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const view = (await (await adminFetch(`/admin/sessions/${sessionId}`)).json()) as any;
    expect(view.messages[0]).toEqual({
      role: "user",
      text: "look",
      at: T0,
      attachments: [
        { id: request.message.attachments[0].id, kind: "image", mime_type: "image/png", name: "photo.png", size: 3000 },
      ],
      run_id: request.run_id,
      not_dispatched: null,
    });
    expect(JSON.stringify(view)).not.toContain("files.client.test");
  });

  it("carries the attachments in the session.finalized transcript, without the URL", async () => {
    const chat = unique("chat");
    useConfig(agentConfig({ HOOK_URLS: "https://hooks.test/h", HOOK_SECRET: "hook-secret" }));
    const hooks: Captured[] = [];
    outbound.restore();
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return new Response(JSON.stringify({ reply: "nice" }));
      if (request.url === REPLY_URL) return new Response("ok");
      if (request.url === "https://hooks.test/h") {
        hooks.push(request);
        return new Response("ok");
      }
      throw new Error(`unexpected outbound request to ${request.url}`);
    });
    const sent = await send({ chat_id: chat, text: "look", attachments: [photo] } as any);
    await runAlarm(genericKey(chat));
    await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, { method: "POST" });
    await runAlarm(genericKey(chat));
    const finalized = hooks.map((h) => h.json).find((b) => b.type === "session.finalized");
    expect(finalized.transcript).toEqual([
      {
        role: "user",
        text: "look",
        at: T0,
        attachments: [
          expect.objectContaining({ kind: "image", name: "photo.png", id: expect.stringMatching(/^att_/) }),
        ],
      },
      { role: "assistant", text: "nice", at: T0, attachments: [] },
    ]);
    expectNoneOf(JSON.stringify(finalized), ["files.client.test", "s3cr3t-signature"]);
  });
});

describe("GET /v1/attachments/{id}", () => {
  it("streams the bytes from the URL with its content-type, sending no credential", async () => {
    const chat = unique("chat");
    const { request, call } = await dispatched(chat, { text: "look", attachments: [photo] });
    expectNoneOf(call.body, [FILE_URL, "files.client.test", "s3cr3t-signature"]);
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("image/png");
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(PHOTO);
    const download = outbound.calls.find((c) => c.url === FILE_URL)!;
    expect(download.method).toBe("GET");
    expect(download.headers.authorization).toBeUndefined();
  });

  it("refuses without a token (401), with a bad one (401) and with the admin token (403)", async () => {
    const chat = unique("chat");
    const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const path = request.message.attachments[0].path;
    expect((await fetchAttachment(path, null)).status).toBe(401);
    expect((await fetchAttachment(path, "run_nope.nope")).status).toBe(401);
    expect((await fetchAttachment(path, "test-admin-token")).status).toBe(403);
    expect(outbound.calls.filter((c) => c.url === FILE_URL)).toHaveLength(0);
  });

  it("answers 404 for an unknown id", async () => {
    const chat = unique("chat");
    const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
    expect((await errorOf(await fetchAttachment("/v1/attachments/att_nope", request.run_token))).status).toBe(404);
  });

  it("answers 403 to a run of another session, even of the same key after /new", async () => {
    const chat = unique("chat");
    const first = await dispatched(chat, { text: "look", attachments: [photo] });
    const other = await dispatched(unique("chat"), { text: "other" });
    expect((await fetchAttachment(first.request.message.attachments[0].path, other.request.run_token)).status).toBe(
      403,
    );
    await send({ chat_id: chat, text: "/new" });
    const after = await dispatched(chat, { text: "again" });
    expect(after.sessionId).not.toBe(first.sessionId);
    expect((await fetchAttachment(first.request.message.attachments[0].path, after.request.run_token)).status).toBe(
      403,
    );
    expect(outbound.calls.filter((c) => c.url === FILE_URL)).toHaveLength(0);
  });

  it("lets any run of the holding session read it, and the run moved into its continuation by a rotation", async () => {
    const chat = unique("chat");
    const first = await dispatched(chat, { text: "look", attachments: [photo] });
    const second = await dispatched(chat, { text: "and?" });
    const path = first.request.message.attachments[0].path;
    expect((await fetchAttachment(path, second.request.run_token)).status).toBe(200);
    const { agentApi } = await import("../agent/support");
    const rotated = await agentApi(`/v1/sessions/${first.sessionId}/rotate`, second.request.run_token, {});
    expect(rotated.status).toBe(200);
    const response = await fetchAttachment(path, second.request.run_token);
    expect(response.status).toBe(200);
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(PHOTO);
  });

  it("answers 413 by content-length over ATTACHMENT_MAX_BYTES, before reading the body", async () => {
    const chat = unique("chat");
    useConfig(agentConfig({ ATTACHMENT_MAX_BYTES: "2999" }));
    const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
    expect(error).toMatchObject({ status: 413, code: "payload_too_large" });
  });

  it("serves a file of exactly ATTACHMENT_MAX_BYTES", async () => {
    const chat = unique("chat");
    useConfig(agentConfig({ ATTACHMENT_MAX_BYTES: "3000" }));
    const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect((await response.arrayBuffer()).byteLength).toBe(3000);
  });

  it("streams a body without content-length, and breaks it off once it passes the limit", async () => {
    const chat = unique("chat");
    useConfig(agentConfig({ ATTACHMENT_MAX_BYTES: "5000" }));
    const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
    const path = request.message.attachments[0].path;
    fileAnswer = () => new Response(chunkedBody(bytesOf(4096)), { headers: { "content-type": "image/png" } });
    const small = await fetchAttachment(path, request.run_token);
    expect(small.status).toBe(200);
    expect(new Uint8Array(await small.arrayBuffer())).toEqual(bytesOf(4096));
    fileAnswer = () => new Response(chunkedBody(bytesOf(20_000)), { headers: { "content-type": "image/png" } });
    const big = await fetchAttachment(path, request.run_token);
    expect(big.status).toBe(200);
    await expect(big.arrayBuffer()).rejects.toThrow();
  });

  const failures: [string, () => Response][] = [
    ["a 404", () => new Response("gone", { status: 404 })],
    ["a 500", () => new Response("oops", { status: 500 })],
    [
      "a network error",
      () => {
        throw new TypeError("Network connection lost.");
      },
    ],
  ];
  for (const [what, answer] of failures) {
    it(`answers 502 when the file server gives ${what}`, async () => {
      const chat = unique("chat");
      const { request } = await dispatched(chat, { text: "look", attachments: [photo] });
      fileAnswer = answer;
      const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
      expect(error).toMatchObject({ status: 502, code: "bad_gateway" });
      expectNoneOf(error.message, ["s3cr3t-signature"]);
    });
  }

  it("answers 500 naming ATTACHMENT_MAX_BYTES when it is not a positive integer", async () => {
    useConfig(agentConfig({ ATTACHMENT_MAX_BYTES: "25MB" }));
    const error = await errorOf(await fetchAttachment("/v1/attachments/att_x", "run_x.y"));
    expect(error.status).toBe(500);
    expect(error.message).toContain("ATTACHMENT_MAX_BYTES");
  });
});

describe("storage", () => {
  it("stores a redelivered message's attachments once (the dedupe chain guards them too)", async () => {
    const chat = unique("chat");
    const event = unique("evt");
    const first = await send({ chat_id: chat, event_id: event, text: "look", attachments: [photo, photo] } as any);
    const again = await send({ chat_id: chat, event_id: event, text: "look", attachments: [photo, photo] } as any);
    expect(again.body.duplicate).toBe(true);
    const { results } = await env.DB.prepare(`SELECT id FROM attachments WHERE session_id = ?`)
      .bind(first.body.session_id)
      .all();
    expect(results).toHaveLength(2);
  });

  it("stores them on the first message of a new key and on a message appended to a live session", async () => {
    const chat = unique("chat");
    const a = await send({ chat_id: chat, text: "one", attachments: [photo] } as any);
    await runAlarm(genericKey(chat));
    const b = await send({ chat_id: chat, text: "two", attachments: [photo] } as any);
    expect(b.body.session_id).toBe(a.body.session_id);
    const messages = await messagesOf(a.body.session_id);
    const withMedia = messages.filter((m: any) => m.attachments !== null);
    expect(withMedia.map((m) => m.text)).toEqual(["one", "two"]);
  });

  it("echoes the kinds of the attachments when no agent is configured", async () => {
    useConfig({ GENERIC_REPLY_URL: REPLY_URL });
    const chat = unique("chat");
    const sent = await send({
      chat_id: chat,
      text: undefined,
      attachments: [photo, { ...photo, kind: "voice" }],
    } as any);
    await runAlarm(genericKey(chat));
    const texts = (await messagesOf(sent.body.session_id)).map((m) => m.text);
    expect(texts).toEqual(["", "echo: [image] [voice]"]);
  });
});
