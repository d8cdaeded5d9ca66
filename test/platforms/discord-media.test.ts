/**
 * Discord attachment options: each ATTACHMENT option of a command, resolved
 * through `data.resolved.attachments`, becomes an attachment; a command with only
 * attachments routes with text ""; and `GET /v1/attachments/{id}` fetches the CDN
 * URL with no credential at all. Discord is faked with `vi.spyOn(globalThis, "fetch")`.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { toHex } from "../../src/crypto";
import { AGENT_TOKEN, AGENT_URL } from "../agent/support";
import { bytesOf, errorOf, expectNoneOf, fetchAttachment } from "../attachments/support";
import attachmentOnly from "../fixtures/discord/command-attachment-only.json";
import withAttachments from "../fixtures/discord/command-attachments.json";
import {
  BASE,
  T0,
  captureFetch,
  restoreClock,
  runAlarm,
  setNow,
  tableCounts,
  useConfig,
  type Captured,
} from "../helpers";

const DISCORD_API = "https://discord-media.test/api/v10";
const CDN = "https://cdn.discordapp.com/";
const CAT = bytesOf(6000, 5);

let keys: CryptoKeyPair;
let publicKeyHex: string;
let cdnAnswer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };

beforeAll(async () => {
  keys = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
  publicKeyHex = toHex((await crypto.subtle.exportKey("raw", keys.publicKey)) as ArrayBuffer);
});

const config = (extra: Record<string, string> = {}) => ({
  DISCORD_PUBLIC_KEY: publicKeyHex,
  DISCORD_APPLICATION_ID: withAttachments.application_id,
  DISCORD_API_BASE: DISCORD_API,
  AGENT_URL,
  AGENT_TOKEN,
  ...extra,
});

beforeEach(() => {
  setNow(T0);
  useConfig(config());
  cdnAnswer = () => new Response(CAT, { headers: { "content-type": "image/jpeg", "content-length": "6000" } });
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return new Response(null, { status: 202 });
    if (request.url.startsWith(CDN)) return cdnAnswer();
    if (request.url.startsWith(DISCORD_API)) return Response.json({ id: "1" });
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

type Json = Record<string, any>;
const EPOCH = 1_420_070_400_000n;
let sequence = BigInt(Math.floor(Math.random() * 1000)) << 12n;
const snowflake = () => String(((BigInt(Date.now()) - EPOCH) << 22n) | (++sequence & 0x3fffffn));

/** A fixture with a fresh interaction id and user (and so its own session). */
function interaction(fixture: Json, edit: (body: Json) => void = () => {}): Json {
  const body = structuredClone(fixture);
  body.id = snowflake();
  const user = snowflake();
  if (body.member) body.member.user.id = user;
  if (body.user) body.user.id = user;
  edit(body);
  return body;
}

async function post(body: Json): Promise<Response> {
  const raw = JSON.stringify(body);
  const timestamp = String(Math.floor(Date.now() / 1000));
  const signature = toHex(
    await crypto.subtle.sign({ name: "Ed25519" }, keys.privateKey, new TextEncoder().encode(`${timestamp}${raw}`)),
  );
  return exports.default.fetch(
    new Request(`${BASE}/webhooks/discord`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-signature-timestamp": timestamp,
        "x-signature-ed25519": signature,
      },
      body: raw,
    }),
  );
}

const keyOf = (body: Json) =>
  body.guild_id ? `discord:channel:${body.channel_id}:${body.member.user.id}` : `discord:dm:${body.user.id}`;

async function handedOff(fixture: Json, edit?: (body: Json) => void) {
  const body = interaction(fixture, edit);
  const response = await post(body);
  expect(response.status).toBe(200);
  expect(await response.json()).toEqual({ type: 5 });
  await runAlarm(keyOf(body));
  const call = outbound.calls.filter((c) => c.url === AGENT_URL).at(-1)!;
  return { call, request: call.json };
}

describe("attachment options", () => {
  it("routes the text option with each attachment option, in order, without the CDN URLs", async () => {
    const { request, call } = await handedOff(withAttachments);
    expect(request.message.text).toBe("what is in this picture?");
    expect(request.message.attachments).toEqual([
      {
        id: expect.stringMatching(/^att_/),
        kind: "image",
        mime_type: "image/jpeg",
        name: "cat.jpg",
        size: 82311,
        path: expect.stringMatching(/^\/v1\/attachments\/att_/),
      },
      expect.objectContaining({ kind: "file", mime_type: "text/plain; charset=utf-8", name: "notes.txt", size: 312 }),
    ]);
    expectNoneOf(call.body, ["cdn.discordapp.com", "media.discordapp.net", withAttachments.token]);
  });

  it("routes a command with only an attachment option with text ''", async () => {
    const { request } = await handedOff(attachmentOnly);
    expect(request.message.text).toBe("");
    expect(request.message.attachments).toEqual([expect.objectContaining({ kind: "audio", name: "memo.ogg" })]);
  });

  it("finds attachment options inside a subcommand, and inside a subcommand group", async () => {
    const { request } = await handedOff(attachmentOnly, (body) => {
      body.data.options = [{ name: "file", type: 1, options: body.data.options }];
    });
    expect(request.message.attachments).toHaveLength(1);
    const grouped = await handedOff(attachmentOnly, (body) => {
      body.data.options = [
        { name: "files", type: 2, options: [{ name: "file", type: 1, options: body.data.options }] },
      ];
    });
    expect(grouped.request.message.attachments).toHaveLength(1);
  });

  it("answers 400 to an attachment option missing from resolved.attachments, storing nothing", async () => {
    const before = await tableCounts();
    const body = interaction(attachmentOnly, (b) => (b.data.resolved.attachments = {}));
    const response = await post(body);
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      error: {
        code: "invalid_body",
        message: expect.stringMatching(/^data\.resolved\.attachments\.\d+ is required for this option$/),
      },
    });
    expect(await tableCounts()).toEqual(before);
  });

  it("answers 400 to a resolved attachment whose URL is not http(s)", async () => {
    const body = interaction(attachmentOnly, (b) => {
      Object.values(b.data.resolved.attachments as Json).forEach((a: Json) => (a.url = "javascript:alert(1)"));
    });
    expect((await post(body)).status).toBe(400);
  });
});

describe("GET /v1/attachments/{id} from Discord", () => {
  it("fetches the attachment URL with no credential and streams the bytes", async () => {
    const { request } = await handedOff(withAttachments);
    const response = await fetchAttachment(request.message.attachments[0].path, request.run_token);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("image/jpeg");
    expect(new Uint8Array(await response.arrayBuffer())).toEqual(CAT);
    const download = outbound.calls.filter((c) => c.url.startsWith(CDN));
    expect(download.map((c) => [c.method, c.url])).toEqual([
      ["GET", withAttachments.data.resolved.attachments["1190000000000007001"].url],
    ]);
    expect(download[0]!.headers.authorization).toBeUndefined();
  });

  it("answers 502 when the CDN refuses (an expired signed URL is a 404)", async () => {
    const { request } = await handedOff(withAttachments);
    cdnAnswer = () => new Response("This content is no longer available.", { status: 404 });
    const error = await errorOf(await fetchAttachment(request.message.attachments[0].path, request.run_token));
    expect(error.status).toBe(502);
    expect(error.message).toContain("discord attachment download answered HTTP 404");
    expectNoneOf(error.message, ["hm=", "cdn.discordapp.com"]);
  });

  it("answers 413 over ATTACHMENT_MAX_BYTES", async () => {
    useConfig(config({ ATTACHMENT_MAX_BYTES: "5999" }));
    const { request } = await handedOff(withAttachments);
    expect((await fetchAttachment(request.message.attachments[0].path, request.run_token)).status).toBe(413);
  });
});
