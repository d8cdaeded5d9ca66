/**
 * Discord's pieces one by one, where the end-to-end tests in discord.test.ts cannot
 * reach every case: its settings refused with the key named, the reply targets
 * refused before any call, how Discord's answers are read (429's `retry_after`, a
 * token gone), and a long reply whose later part fails once a followup is out.
 */
import type { HTTPException } from "hono/http-exception";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { discord } from "../../src/platforms/discord";
import { ConfigError } from "../../src/config";
import { classify, sendDiscord } from "../../src/platforms/discord/send";
import {
  conversationOf,
  firstStringOption,
  interactionAttachments,
  interactionText,
  snowflakeTime,
  type CommandInteraction,
} from "../../src/platforms/discord/interactions";
import { discordSettings } from "../../src/platforms/discord/settings";
import type { PlatformEnv } from "../../src/platforms/types";
import { T0, captureFetch, loggedLines, restoreClock, setNow, type Captured } from "../helpers";
import { outboundReply } from "./outbound";

const DISCORD_API = "https://discord.test/api";
const KEY_HEX = "AB".repeat(32);
const env = {
  DISCORD_PUBLIC_KEY: KEY_HEX,
  DISCORD_APPLICATION_ID: "123456789012345678",
  DISCORD_API_BASE: DISCORD_API,
} as unknown as PlatformEnv;
const target = { application_id: "123456789012345678", token: "tok", interaction_at: T0 };

let answers: (() => Response)[];
let outbound: { calls: Captured[]; restore: () => void };
beforeEach(() => {
  setNow(T0 + 1_000);
  answers = [];
  outbound = captureFetch(() => (answers.shift() ?? (() => Response.json({ id: "m1" })))());
});
afterEach(() => {
  outbound.restore();
  restoreClock();
});

const settingsError = (overrides: Record<string, string>): ConfigError | null => {
  try {
    discordSettings({ ...env, ...overrides } as unknown as PlatformEnv);
    return null;
  } catch (error) {
    return error as ConfigError;
  }
};

describe("discordSettings", () => {
  it("keeps the public key in lower-case hex and the application id as given", () => {
    expect(discordSettings(env)).toMatchObject({
      publicKeyHex: "ab".repeat(32),
      applicationId: "123456789012345678",
      apiBase: DISCORD_API,
    });
  });

  it.each([
    ["DISCORD_PUBLIC_KEY", "not hex", { DISCORD_PUBLIC_KEY: "zz".repeat(32) }],
    ["DISCORD_PUBLIC_KEY", "31 bytes", { DISCORD_PUBLIC_KEY: "ab".repeat(31) }],
    ["DISCORD_APPLICATION_ID", "not a number", { DISCORD_APPLICATION_ID: "app-1" }],
    ["DISCORD_APPLICATION_ID", "digits then more", { DISCORD_APPLICATION_ID: "123abc" }],
    ["DISCORD_APPLICATION_ID", "more then digits", { DISCORD_APPLICATION_ID: "abc123" }],
  ])("refuses %s (%s), naming it and what it must be", (key, _what, overrides) => {
    const error = settingsError(overrides);
    expect(error).toBeInstanceOf(ConfigError);
    expect(error!.key).toBe(key);
    expect(error!.detail).toBe(
      key === "DISCORD_PUBLIC_KEY"
        ? "must be 64 hex characters (the application's Ed25519 public key)"
        : "must be the application's numeric id (a snowflake)",
    );
  });
});

describe("sendDiscord", () => {
  it.each<[string, Record<string, unknown>]>([
    ["no application id", { ...target, application_id: undefined }],
    ["an empty application id", { ...target, application_id: "" }],
    ["no token", { ...target, token: undefined }],
    ["an empty token", { ...target, token: "" }],
    ["no interaction time", { ...target, interaction_at: undefined }],
    ["an interaction time that is not a number", { ...target, interaction_at: Number.NaN }],
  ])("refuses a reply target with %s, for good and without a call", async (_what, bad) => {
    expect(await sendDiscord(outboundReply("discord", bad), env)).toEqual({
      ok: false,
      retryable: false,
      retryAfterMs: null,
      status: null,
      error: "reply target has no Discord interaction token",
    });
    expect(outbound.calls).toEqual([]);
  });

  it("refuses for good, without a call, when Discord is not configured", async () => {
    const outcome = await sendDiscord(outboundReply("discord", target), {} as PlatformEnv);
    expect(outcome).toMatchObject({ ok: false, retryable: false, error: "discord is not configured or misconfigured" });
    expect(outbound.calls).toEqual([]);
  });

  it("a one-part reply's failure is Discord's answer as classified; a later part's names the part", async () => {
    answers = [() => new Response("busy", { status: 503 })];
    const one = await sendDiscord(outboundReply("discord", target), env);
    expect(one).toMatchObject({ ok: false, retryable: true, status: 503 });
    expect(one.error).toContain("503");
    expect(one.error).not.toMatch(/^part /);
    // The first followup fails: it may be retried (editing @original again is harmless).
    answers = [() => Response.json({ id: "m1" }), () => new Response("busy", { status: 503 })];
    const two = await sendDiscord(outboundReply("discord", target, "a".repeat(2000) + "b"), env);
    expect(two).toMatchObject({ ok: false, retryable: true, status: 503, error: `part 2 of 2: ${one.error}` });
  });

  it("a long reply whose followup fails after another followup went out is not retried, and says why", async () => {
    const text = "a".repeat(2000) + "b".repeat(2000) + "c";
    answers = [
      () => Response.json({ id: "m1" }),
      () => Response.json({ id: "m2" }),
      () => new Response("busy", { status: 503 }),
    ];
    const outcome = await sendDiscord(outboundReply("discord", target, text), env);
    expect(outbound.calls.map((c) => c.method)).toEqual(["PATCH", "POST", "POST"]);
    expect(outcome).toMatchObject({ ok: false, retryable: false, retryAfterMs: null, status: 503 });
    expect(outcome.error).toMatch(/^part 3 of 3: .*503.* \(not retried: earlier followups were sent\)$/);
  });
});

describe("classify", () => {
  const failed = (status: number, json: unknown = null) => ({
    ok: false as const,
    retryable: status >= 500 || status === 429,
    retryAfterMs: 7_000,
    status,
    error: `HTTP ${status}`,
    json,
  });

  it("a success is not retried", () => {
    expect(
      classify({ ok: true, retryable: false, retryAfterMs: null, status: 200, error: null, json: {} } as never),
    ).toEqual({
      ok: true,
      retryable: false,
      retryAfterMs: null,
      status: 200,
      error: null,
    });
  });

  it("429 waits Discord's retry_after (seconds), else the Retry-After header's time", () => {
    expect(classify(failed(429, { retry_after: 1.2 }) as never)).toMatchObject({ retryable: true, retryAfterMs: 1200 });
    expect(classify(failed(429, { retry_after: 0 }) as never)).toMatchObject({ retryable: true, retryAfterMs: 0 });
    expect(classify(failed(429, { retry_after: -1 }) as never)).toMatchObject({ retryable: true, retryAfterMs: 7_000 });
    expect(classify(failed(429, { retry_after: "soon" }) as never)).toMatchObject({ retryAfterMs: 7_000 });
    expect(classify(failed(429, null) as never)).toMatchObject({ retryAfterMs: 7_000 });
  });

  it("401 and 404 mean the token is gone: failed for good, saying so", () => {
    for (const status of [401, 404]) {
      expect(classify(failed(status) as never)).toMatchObject({
        ok: false,
        retryable: false,
        status,
        error: `discord: interaction token expired or unknown (HTTP ${status})`,
      });
    }
  });
});

describe("reading an interaction", () => {
  const command = (fields: Record<string, unknown>) =>
    ({ data: { name: "ask", options: [] }, ...fields }) as unknown as CommandInteraction;

  it("takes the first string option, inside subcommands and groups too, skipping other types", () => {
    expect(firstStringOption(undefined)).toBeNull();
    expect(firstStringOption([{ type: 4, name: "n", value: 3 }] as never)).toBeNull();
    expect(
      firstStringOption([
        { type: 1, name: "sub", options: [{ type: 4, name: "n", value: 1 }] },
        {
          type: 2,
          name: "group",
          options: [{ type: 1, name: "sub", options: [{ type: 3, name: "q", value: "deep" }] }],
        },
      ] as never),
    ).toBe("deep");
    expect(
      firstStringOption([
        { type: 1, name: "sub", options: [{ type: 3, name: "q", value: "first" }] },
        { type: 3, name: "later", value: "second" },
      ] as never),
    ).toBe("first");
  });

  it('an option of only spaces is no text: null, or "" when attachments come with it', () => {
    const spaces = command({ data: { name: "ask", options: [{ type: 3, name: "q", value: "   " }] } });
    expect(interactionText(spaces)).toBeNull();
    expect(interactionText(spaces, 1)).toBe("");
    const asked = command({ data: { name: "ask", options: [{ type: 3, name: "q", value: " hi " }] } });
    expect(interactionText(asked)).toBe(" hi ");
  });

  it("a guild interaction needs member.user.id and a channel; channel_id stands in for the channel object", async () => {
    const guild = { guild_id: "g1", member: { user: { id: "u1" } } };
    expect(conversationOf(command({ ...guild, channel_id: "c9" }))).toEqual({
      chatType: "channel",
      chatId: "c9",
      userId: "u1",
      threadId: null,
    });
    const refusal = async (fields: Record<string, unknown>) => {
      try {
        conversationOf(command(fields));
        return null;
      } catch (error) {
        const response = (error as HTTPException).getResponse();
        return { status: response.status, message: ((await response.json()) as any).error.message };
      }
    };
    expect(await refusal({ guild_id: "g1", channel_id: "c9" })).toEqual({
      status: 400,
      message: "member.user.id is required for this interaction",
    });
    expect(await refusal(guild)).toEqual({ status: 400, message: "channel_id is required for this interaction" });
    expect(await refusal({})).toEqual({ status: 400, message: "user.id is required for this interaction" });
  });

  it("an attachment option whose value is not an id string is no attachment: the command is read without it, not refused", () => {
    // Discord sends an attachment option's value as the snowflake string of its entry in data.resolved.
    const malformed = command({ data: { name: "ask", options: [{ type: 11, name: "file", value: 12 }] } });
    expect(interactionAttachments(malformed)).toEqual([]);
    const listed = command({
      data: {
        name: "ask",
        options: [{ type: 11, name: "file", value: 12 }],
        resolved: { attachments: { "12": { id: "12", filename: "a.txt", url: "https://cdn.discordapp.test/a.txt" } } },
      },
    });
    expect(interactionAttachments(listed)).toEqual([]);
  });

  it("a DM interaction's user comes from user, else member.user", () => {
    expect(conversationOf(command({ user: { id: "u2" } }))).toMatchObject({ chatType: "dm", chatId: "u2" });
    expect(conversationOf(command({ member: { user: { id: "u3" } } }))).toMatchObject({ chatType: "dm", chatId: "u3" });
  });

  it("a snowflake's time is its top bits plus Discord's epoch; a malformed id has none", () => {
    // The example of Discord's documentation ("Snowflakes").
    expect(snowflakeTime("175928847299117063")).toBe(1_462_015_105_796);
    expect(snowflakeTime("not-a-number")).toBeNull();
  });
});

describe("whether a reply can be delivered to Discord", () => {
  const config = {} as never;
  const misconfigured = { ...env, DISCORD_PUBLIC_KEY: "ab" } as unknown as PlatformEnv;
  const loggedPlatforms = (spy: { mock: { calls: unknown[][] } }) =>
    loggedLines(spy, "replies not sent: invalid configuration").map((line) => line.platform);

  it("only a target with an interaction token, with Discord configured", () => {
    const canDeliver = discord.sender!.canDeliver;
    expect(canDeliver({ platform: "discord", ...target }, config, env)).toBe(true);
    expect(canDeliver({ platform: "discord", ...target, token: "" }, config, env)).toBe(false);
    expect(canDeliver({ platform: "discord", ...target }, config, {} as PlatformEnv)).toBe(false);
  });

  it("a misconfigured Discord delivers nothing, and the log names the platform", async () => {
    const error = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      expect(discord.sender!.canDeliver({ platform: "discord", ...target }, config, misconfigured)).toBe(false);
      expect(await sendDiscord(outboundReply("discord", target), misconfigured)).toMatchObject({
        ok: false,
        retryable: false,
      });
      expect(loggedPlatforms(error)).toEqual(["discord", "discord"]);
      expect(outbound.calls).toEqual([]);
    } finally {
      error.mockRestore();
    }
  });
});
