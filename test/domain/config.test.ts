import { describe, expect, it } from "vitest";
import { ConfigError, parseConfigFresh, type ConfigEnv } from "../../src/config";
import { PLATFORMS } from "../../src/domain/session-key";
import { ADAPTERS } from "../../src/platforms";

/** Parses `env` and returns the ConfigError it throws (fails the test when it does not throw one). */
function configError(env: ConfigEnv): ConfigError {
  try {
    parseConfigFresh(env);
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return error as ConfigError;
  }
  throw new Error(`expected a ConfigError for ${JSON.stringify(env)}`);
}

describe("parseConfigFresh defaults", () => {
  it("an empty env is valid and everything optional is off", () => {
    expect(parseConfigFresh({})).toEqual({
      reset: {},
      groupSessionsPerUser: true,
      agentUrl: null,
      agentToken: null,
      agentTimeoutMs: 30_000,
      hookUrls: [],
      hookSecret: null,
      adminToken: null,
      genericWebhookSecret: null,
      genericReplyUrl: null,
      outboxDrain: "inline",
      attachmentMaxBytes: 25 * 1024 * 1024,
      overlap: {},
    });
  });

  it("blank strings count as unset", () => {
    const config = parseConfigFresh({
      SESSION_RESET: "  ",
      AGENT_URL: "",
      HOOK_URLS: " , ",
      GROUP_SESSIONS_PER_USER: "",
    });
    expect(config.reset).toEqual({});
    expect(config.agentUrl).toBeNull();
    expect(config.hookUrls).toEqual([]);
    expect(config.groupSessionsPerUser).toBe(true);
  });

  it("reads every variable", () => {
    const config = parseConfigFresh({
      SESSION_RESET: JSON.stringify({
        mode: "daily",
        idle_minutes: 0.5,
        at_hour: 2,
        at_minute: 30,
        timezone: "America/New_York",
        by_platform: { slack: { mode: "idle" } },
        by_chat_type: { group: { idle_minutes: 10 } },
      }),
      GROUP_SESSIONS_PER_USER: "false",
      AGENT_URL: "https://agent.example/run",
      AGENT_TOKEN: " agent-token ",
      AGENT_TIMEOUT_MS: "5000",
      HOOK_URLS: "https://a.example/hook, http://b.example/hook",
      HOOK_SECRET: "hook-secret",
      ADMIN_TOKEN: "admin",
      GENERIC_WEBHOOK_SECRET: "generic",
      GENERIC_REPLY_URL: "https://reply.example/",
      OUTBOX_DRAIN: "alarm",
      ATTACHMENT_MAX_BYTES: "1000000",
      OVERLAP: JSON.stringify({ mode: "interrupt", by_platform: { telegram: { debounce_ms: 500 } } }),
    });
    expect(config).toEqual({
      overlap: { mode: "interrupt", by_platform: { telegram: { debounce_ms: 500 } } },
      reset: {
        mode: "daily",
        idle_minutes: 0.5,
        at_hour: 2,
        at_minute: 30,
        timezone: "America/New_York",
        by_platform: { slack: { mode: "idle" } },
        by_chat_type: { group: { idle_minutes: 10 } },
      },
      groupSessionsPerUser: false,
      agentUrl: "https://agent.example/run",
      agentToken: "agent-token",
      agentTimeoutMs: 5000,
      hookUrls: ["https://a.example/hook", "http://b.example/hook"],
      hookSecret: "hook-secret",
      adminToken: "admin",
      genericWebhookSecret: "generic",
      genericReplyUrl: "https://reply.example/",
      outboxDrain: "alarm",
      attachmentMaxBytes: 1_000_000,
    });
  });

  it("refuses an unknown OUTBOX_DRAIN, naming it", () => {
    expect(() => parseConfigFresh({ OUTBOX_DRAIN: "sometimes" })).toThrow(/OUTBOX_DRAIN/);
  });
});

describe("SESSION_RESET", () => {
  it.each([
    { json: "{}", expected: {} },
    { json: '{"mode":"none"}', expected: { mode: "none" } },
    { json: '{"mode":"idle","idle_minutes":1.5}', expected: { mode: "idle", idle_minutes: 1.5 } },
    { json: '{"idle_minutes":0.5}', expected: { idle_minutes: 0.5 } },
    { json: '{"at_hour":0,"at_minute":59}', expected: { at_hour: 0, at_minute: 59 } },
    { json: '{"at_hour":23}', expected: { at_hour: 23 } },
    { json: '{"timezone":"Australia/Sydney"}', expected: { timezone: "Australia/Sydney" } },
    { json: '{"by_chat_type":{"dm":{"mode":"none"}}}', expected: { by_chat_type: { dm: { mode: "none" } } } },
  ])("accepts $json", ({ json, expected }) => {
    expect(parseConfigFresh({ SESSION_RESET: json }).reset).toEqual(expected);
  });

  it.each([
    { label: "invalid JSON", json: "{mode: both}", key: "SESSION_RESET", mentions: "JSON" },
    { label: "truncated JSON", json: '{"mode":"both"', key: "SESSION_RESET", mentions: "JSON" },
    { label: "not an object", json: "[]", key: "SESSION_RESET", mentions: null },
    { label: "a bare string", json: '"both"', key: "SESSION_RESET", mentions: null },
    {
      label: "an unknown field",
      json: '{"mode":"idle","idle_minute":5}',
      key: "SESSION_RESET",
      mentions: "idle_minute",
    },
    { label: "a bad mode", json: '{"mode":"weekly"}', key: "SESSION_RESET.mode", mentions: null },
    { label: "a null mode", json: '{"mode":null}', key: "SESSION_RESET.mode", mentions: null },
    { label: "negative idle_minutes", json: '{"idle_minutes":-5}', key: "SESSION_RESET.idle_minutes", mentions: null },
    { label: "zero idle_minutes", json: '{"idle_minutes":0}', key: "SESSION_RESET.idle_minutes", mentions: null },
    {
      label: "idle_minutes as a string",
      json: '{"idle_minutes":"60"}',
      key: "SESSION_RESET.idle_minutes",
      mentions: null,
    },
    {
      label: "a bad timezone",
      json: '{"timezone":"Mars/Olympus_Mons"}',
      key: "SESSION_RESET.timezone",
      mentions: null,
    },
    { label: "an empty timezone", json: '{"timezone":""}', key: "SESSION_RESET.timezone", mentions: null },
    { label: "at_hour 24", json: '{"at_hour":24}', key: "SESSION_RESET.at_hour", mentions: null },
    { label: "negative at_hour", json: '{"at_hour":-1}', key: "SESSION_RESET.at_hour", mentions: null },
    { label: "fractional at_hour", json: '{"at_hour":4.5}', key: "SESSION_RESET.at_hour", mentions: null },
    { label: "at_minute 60", json: '{"at_minute":60}', key: "SESSION_RESET.at_minute", mentions: null },
    {
      label: "a bad by_platform mode",
      json: '{"by_platform":{"telegram":{"mode":"weekly"}}}',
      key: "SESSION_RESET.by_platform.telegram.mode",
      mentions: null,
    },
    {
      label: "a bad by_platform idle_minutes",
      json: '{"by_platform":{"slack":{"idle_minutes":-1}}}',
      key: "SESSION_RESET.by_platform.slack.idle_minutes",
      mentions: null,
    },
    {
      label: "an unknown field in a by_platform entry",
      json: '{"by_platform":{"slack":{"idle":5}}}',
      key: "SESSION_RESET.by_platform.slack",
      mentions: "idle",
    },
    {
      label: "a by_platform entry that is not an object",
      json: '{"by_platform":{"slack":"idle"}}',
      key: "SESSION_RESET.by_platform.slack",
      mentions: null,
    },
    {
      label: "an unknown chat type in by_chat_type",
      json: '{"by_chat_type":{"thread":{"mode":"none"}}}',
      key: "SESSION_RESET.by_chat_type",
      mentions: "thread",
    },
    {
      label: "a bad by_chat_type timezone",
      json: '{"by_chat_type":{"group":{"timezone":"Nowhere/Land"}}}',
      key: "SESSION_RESET.by_chat_type.group.timezone",
      mentions: null,
    },
  ])("rejects $label, naming $key", ({ json, key, mentions }) => {
    const error = configError({ SESSION_RESET: json });
    expect(error.key).toBe(key);
    expect(error.message.startsWith(`${key}: `)).toBe(true);
    if (mentions) expect(error.message).toContain(mentions);
  });

  it("rejects a non-string value", () => {
    const error = configError({ SESSION_RESET: { mode: "idle" } });
    expect(error.key).toBe("SESSION_RESET");
  });
});

describe("GROUP_SESSIONS_PER_USER", () => {
  it.each([
    { value: undefined, expected: true },
    { value: "true", expected: true },
    { value: "TRUE", expected: true },
    { value: " on ", expected: true },
    { value: "1", expected: true },
    { value: "yes", expected: true },
    { value: "false", expected: false },
    { value: "False", expected: false },
    { value: "0", expected: false },
    { value: "off", expected: false },
    { value: "no", expected: false },
  ])("$value -> $expected", ({ value, expected }) => {
    expect(parseConfigFresh({ GROUP_SESSIONS_PER_USER: value }).groupSessionsPerUser).toBe(expected);
  });

  it.each(["maybe", "tru", "2", "enabled"])("rejects %s, naming the key but never quoting the value", (value) => {
    const error = configError({ GROUP_SESSIONS_PER_USER: value });
    expect(error.key).toBe("GROUP_SESSIONS_PER_USER");
    expect(error.message).toContain("GROUP_SESSIONS_PER_USER");
    expect(error.message).not.toContain(`"${value}"`);
  });
});

describe("AGENT_URL and AGENT_TOKEN", () => {
  it("AGENT_URL without AGENT_TOKEN names AGENT_TOKEN", () => {
    const error = configError({ AGENT_URL: "https://agent.example/run" });
    expect(error.key).toBe("AGENT_TOKEN");
    expect(error.message).toContain("AGENT_URL");
  });

  it("a blank AGENT_TOKEN counts as missing", () => {
    expect(configError({ AGENT_URL: "https://agent.example/run", AGENT_TOKEN: "  " }).key).toBe("AGENT_TOKEN");
  });

  it.each(["not a url", "agent.example/run", "ftp://agent.example/run"])("rejects AGENT_URL %s", (value) => {
    const error = configError({ AGENT_URL: value, AGENT_TOKEN: "t" });
    expect(error.key).toBe("AGENT_URL");
    expect(error.message).not.toContain(value);
  });

  it("AGENT_TOKEN without AGENT_URL is allowed (the echo agent answers)", () => {
    const config = parseConfigFresh({ AGENT_TOKEN: "t" });
    expect(config.agentUrl).toBeNull();
    expect(config.agentToken).toBe("t");
  });

  it.each(["0", "-5", "1.5", "25MB"])("rejects ATTACHMENT_MAX_BYTES %s", (value) => {
    expect(configError({ ATTACHMENT_MAX_BYTES: value }).key).toBe("ATTACHMENT_MAX_BYTES");
  });

  it.each(["0", "-5", "1.5", "soon"])("rejects AGENT_TIMEOUT_MS %s", (value) => {
    expect(configError({ AGENT_TIMEOUT_MS: value }).key).toBe("AGENT_TIMEOUT_MS");
  });
});

describe("HOOK_URLS and HOOK_SECRET", () => {
  it("a non-URL entry names HOOK_URLS", () => {
    const error = configError({ HOOK_URLS: "https://a.example/hook,not-a-url", HOOK_SECRET: "s" });
    expect(error.key).toBe("HOOK_URLS");
    expect(error.message).toBe("HOOK_URLS: entry 2 is not a URL");
  });

  it("a non-http(s) entry names HOOK_URLS", () => {
    expect(configError({ HOOK_URLS: "mailto:ops@example.com", HOOK_SECRET: "s" }).key).toBe("HOOK_URLS");
  });

  it("HOOK_URLS without HOOK_SECRET names HOOK_SECRET", () => {
    const error = configError({ HOOK_URLS: "https://a.example/hook" });
    expect(error.key).toBe("HOOK_SECRET");
    expect(error.message).toContain("HOOK_URLS");
  });

  it("HOOK_SECRET without HOOK_URLS is allowed", () => {
    expect(parseConfigFresh({ HOOK_SECRET: "s" }).hookUrls).toEqual([]);
  });
});

describe("GENERIC_REPLY_URL", () => {
  it("rejects a non-URL, naming the key", () => {
    expect(configError({ GENERIC_REPLY_URL: "reply here" }).key).toBe("GENERIC_REPLY_URL");
  });
});

describe("every key at fault is named, no value is quoted", () => {
  it("names each invalid key in one error, in order", () => {
    const error = configError({
      AGENT_URL: "https://agent.example/run",
      GROUP_SESSIONS_PER_USER: "maybe",
      HOOK_URLS: "https://hook.example/?token=secret-in-url",
      GENERIC_REPLY_URL: "ftp://reply.example/",
      SESSION_RESET: '{"mode":"weekly","by_platform":{"telegram":{"idle_minutes":-1}}}',
    });
    expect(error.keys).toEqual([
      "AGENT_TOKEN",
      "HOOK_SECRET",
      "SESSION_RESET.mode",
      "SESSION_RESET.by_platform.telegram.idle_minutes",
      "GROUP_SESSIONS_PER_USER",
      "GENERIC_REPLY_URL",
    ]);
    for (const key of error.keys) expect(error.message).toContain(`${key}: `);
    expect(error.message).not.toContain("secret-in-url");
    expect(error.message).not.toContain("ftp://");
    expect(error.message).not.toContain("maybe");
  });

  it.each([
    [
      "a misspelt platform under by_platform",
      '{"by_platform":{"telgram":{"mode":"none"}}}',
      "SESSION_RESET.by_platform",
      "telgram",
    ],
    [
      "an unknown chat type under by_chat_type",
      '{"by_chat_type":{"thread":{"mode":"none"}}}',
      "SESSION_RESET.by_chat_type",
      "thread",
    ],
    [
      "an unknown field in a by_platform entry",
      '{"by_platform":{"slack":{"idle":5}}}',
      "SESSION_RESET.by_platform.slack",
      "idle",
    ],
    ["an unknown field at the top", '{"idle":5}', "SESSION_RESET", "idle"],
  ])("refuses %s", (_label, json, key, name) => {
    const error = configError({ SESSION_RESET: json });
    expect(error.keys).toEqual([key]);
    expect(error.message).toContain(name);
  });

  it("accepts every platform under by_platform", () => {
    const json = JSON.stringify({
      by_platform: Object.fromEntries(
        ["generic", "telegram", "slack", "discord", "whatsapp", "cron"].map((p) => [p, { mode: "none" }]),
      ),
    });
    expect(Object.keys(parseConfigFresh({ SESSION_RESET: json }).reset.by_platform ?? {})).toHaveLength(6);
  });

  it.each(["HOOK_SECRET", "GENERIC_WEBHOOK_SECRET"])("%s written whsec_ must be base64 after the prefix", (key) => {
    expect(configError({ [key]: "whsec_not base64!" }).keys).toEqual([key]);
    expect(configError({ [key]: "whsec_" }).keys).toEqual([key]);
    expect(parseConfigFresh({ [key]: "whsec_c2VjcmV0" })).toBeTruthy();
  });
});

describe("PLATFORMS", () => {
  it("holds every adapter's name, so by_platform accepts each of them", () => {
    for (const adapter of ADAPTERS) expect(PLATFORMS).toContain(adapter.name);
  });
});
