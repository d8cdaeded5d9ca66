/**
 * Slack's pieces one by one, where the end-to-end tests in slack.test.ts cannot
 * reach every case: what `chat.postMessage` is sent and how its answers are read,
 * the reply targets refused before any call, form bodies of slash commands, `ts`
 * times, the app's own bot users, and the chat type of a slash command.
 */
import { HTTPException } from "hono/http-exception";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { slack } from "../../src/platforms/slack";
import type { PlatformEnv } from "../../src/platforms/types";
import { formFields, ownBotUsers, slashChatType, slashToInbound, tsToMs } from "../../src/platforms/slack/events";
import { sendSlack } from "../../src/platforms/slack/send";
import { captureFetch, loggedLines, type Captured } from "../helpers";
import { outboundReply } from "./outbound";

const SLACK_API = "https://slack.test/api";
const env = {
  SLACK_SIGNING_SECRET: "signing-secret",
  SLACK_BOT_TOKEN: "xoxb-unit-token",
  SLACK_API_BASE: SLACK_API,
} as unknown as PlatformEnv;

let answer: () => Response;
let outbound: { calls: Captured[]; restore: () => void };
beforeEach(() => {
  answer = () => Response.json({ ok: true });
  outbound = captureFetch(() => answer());
});
afterEach(() => outbound.restore());

const reply = (target: Record<string, unknown>, text?: string) => outboundReply("slack", target, text);

describe("sendSlack", () => {
  it("posts {channel, text} with the bot token, and thread_ts only for a thread", async () => {
    expect(await sendSlack(reply({ channel: "D1" }), env)).toMatchObject({ ok: true, status: 200 });
    expect(await sendSlack(reply({ channel: "C1", thread_ts: "1700000000.000100" }), env)).toMatchObject({ ok: true });
    expect(outbound.calls.map((c) => [c.url, c.headers.authorization, c.json])).toEqual([
      [`${SLACK_API}/chat.postMessage`, "Bearer xoxb-unit-token", { channel: "D1", text: "hi" }],
      [
        `${SLACK_API}/chat.postMessage`,
        "Bearer xoxb-unit-token",
        { channel: "C1", text: "hi", thread_ts: "1700000000.000100" },
      ],
    ]);
  });

  it.each<[string, Record<string, unknown>]>([
    ["no channel", {}],
    ["an empty channel", { channel: "" }],
    ["a channel that is not a string", { channel: 42 }],
    ["a thread_ts that is not a string", { channel: "C1", thread_ts: 1700000000 }],
  ])("refuses a reply target with %s, for good and without a call", async (_what, target) => {
    expect(await sendSlack(reply(target), env)).toEqual({
      ok: false,
      retryable: false,
      retryAfterMs: null,
      status: null,
      error: "reply target has no Slack channel",
    });
    expect(outbound.calls).toEqual([]);
  });

  it("refuses for good, without a call, when Slack is not configured", async () => {
    const outcome = await sendSlack(reply({ channel: "D1" }), {} as PlatformEnv);
    expect(outcome).toMatchObject({ ok: false, retryable: false, error: "slack is not configured or misconfigured" });
    expect(outbound.calls).toEqual([]);
  });

  // Only one of the two secrets set: the webhook answers 500 naming the other, and a
  // reply already staged fails for good, logged with the platform and the missing key.
  it("refuses for good, without a call, when Slack is misconfigured, and logs which platform and key", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      const misconfigured = { SLACK_SIGNING_SECRET: "signing-secret" } as unknown as PlatformEnv;
      const outcome = await sendSlack(reply({ channel: "D1" }), misconfigured);
      expect(outcome).toMatchObject({ ok: false, retryable: false, error: "slack is not configured or misconfigured" });
      expect(loggedLines(errors, "replies not sent: invalid configuration")).toEqual([
        expect.objectContaining({
          level: "error",
          platform: "slack",
          error: expect.stringContaining("SLACK_BOT_TOKEN"),
        }),
      ]);
      expect(outbound.calls).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });

  it.each<[string, () => Response, { retryable: boolean; error: string }]>([
    [
      "ok:false with a retryable error",
      () => Response.json({ ok: false, error: "ratelimited" }),
      { retryable: true, error: "slack: ratelimited" },
    ],
    [
      "ok:false with another error",
      () => Response.json({ ok: false, error: "not_in_channel" }),
      { retryable: false, error: "slack: not_in_channel" },
    ],
    [
      "an error that is not a string",
      () => Response.json({ ok: false, error: 7 }),
      { retryable: false, error: "slack: unexpected response (no ok: true)" },
    ],
    [
      "a 200 that is not JSON",
      () => new Response("fine"),
      { retryable: false, error: "slack: unexpected response (no ok: true)" },
    ],
  ])("reads the answer's body, not only its status: %s", async (_what, body, expected) => {
    answer = body;
    expect(await sendSlack(reply({ channel: "D1" }), env)).toMatchObject({ ok: false, status: 200, ...expected });
  });
});

describe("the sender's canDeliver (whether a reply gets a delivery at all)", () => {
  const canDeliver = (target: Record<string, unknown>, to: PlatformEnv = env) =>
    slack.sender!.canDeliver({ platform: "slack", ...target }, {} as never, to);

  it("delivers to a Slack channel once both secrets are set", () => {
    expect(canDeliver({ channel: "D1" })).toBe(true);
    expect(canDeliver({ channel: "C1", thread_ts: "1700000000.000100" })).toBe(true);
  });

  it("does not deliver to a target without a channel, or while Slack is off", () => {
    expect(canDeliver({})).toBe(false);
    expect(canDeliver({ channel: 42 })).toBe(false);
    expect(canDeliver({ channel: "D1" }, {} as PlatformEnv)).toBe(false);
    expect(outbound.calls).toEqual([]);
  });

  it("does not deliver while Slack is misconfigured, and logs which platform and key", () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      const misconfigured = { SLACK_BOT_TOKEN: "xoxb-unit-token" } as unknown as PlatformEnv;
      expect(canDeliver({ channel: "D1" }, misconfigured)).toBe(false);
      expect(loggedLines(errors, "replies not sent: invalid configuration")).toEqual([
        expect.objectContaining({ platform: "slack", error: expect.stringContaining("SLACK_SIGNING_SECRET") }),
      ]);
    } finally {
      errors.mockRestore();
    }
  });
});

describe("formFields (slash command bodies)", () => {
  it("reads each field, a field without '=' as empty, and skips empty pairs", () => {
    const body = new TextEncoder().encode("command=%2Fnew&text=hello+world&flag&&channel_id=C1").buffer;
    expect(formFields(body as ArrayBuffer)).toEqual({
      command: "/new",
      text: "hello world",
      flag: "",
      channel_id: "C1",
    });
  });

  it("refuses invalid percent-encoded UTF-8 with a 400 naming it", async () => {
    const body = new TextEncoder().encode("text=%C3%28").buffer as ArrayBuffer;
    let refusal: HTTPException | null = null;
    try {
      formFields(body);
    } catch (error) {
      refusal = error as HTTPException;
    }
    expect(refusal).toBeInstanceOf(HTTPException);
    const response = refusal!.getResponse();
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      error: { code: "invalid_utf8", message: "form body is not valid UTF-8" },
    });
  });
});

describe("tsToMs", () => {
  it("reads Slack's seconds as milliseconds, and refuses what is not a number", () => {
    expect(tsToMs("1700000000.000100")).toBe(1_700_000_000_000);
    expect(tsToMs("1700000000.1234")).toBe(1_700_000_000_123);
    expect(tsToMs("soon")).toBeNull();
  });
});

describe("ownBotUsers", () => {
  it("takes the bot grants' user ids, leaving out user-token grants and grants with no id", () => {
    const envelope = {
      authorizations: [
        { user_id: "UBOT", is_bot: true },
        { user_id: "UHUMAN", is_bot: false },
        { user_id: "", is_bot: true },
        { is_bot: true },
        { user_id: "UOLD" },
      ],
    } as unknown as Parameters<typeof ownBotUsers>[0];
    expect([...ownBotUsers(envelope)].sort()).toEqual(["UBOT", "UOLD"]);
    expect(ownBotUsers({} as Parameters<typeof ownBotUsers>[0]).size).toBe(0);
  });
});

describe("slash commands", () => {
  const command = (fields: Record<string, string>) =>
    ({ command: "/new", trigger_id: "t1", user_id: "U1", channel_id: "C1", ...fields }) as Parameters<
      typeof slashChatType
    >[0];

  it("takes the chat type of the conversation it was typed in, also without a channel name", () => {
    expect(slashChatType(command({ channel_id: "D1" }))).toBe("dm");
    expect(slashChatType(command({ channel_id: "G1", channel_name: "mpdm-a--b-1" }))).toBe("group");
    expect(slashChatType(command({ channel_name: "general" }))).toBe("channel");
    expect(slashChatType(command({}))).toBe("channel");
  });

  it("is answered inline, in the channel it came from, as the lower-case command", () => {
    const inbound = slashToInbound(command({ command: "/NEW", channel_id: "D9" }));
    expect(inbound).toMatchObject({
      eventId: "cmd:t1",
      chatId: "D9",
      chatType: "dm",
      text: "/new",
      replyTo: { platform: "slack", channel: "D9", answersCommandsInline: true },
    });
  });
});
