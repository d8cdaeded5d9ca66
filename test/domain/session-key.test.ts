import { describe, expect, it } from "vitest";
import { buildSessionKey, cronSessionKey, encodeKeyPart, type KeyParts } from "../../src/domain/session-key";

describe("buildSessionKey", () => {
  it.each<{ label: string; parts: KeyParts; perUser: boolean; key: string }>([
    {
      label: "the spec's dm example",
      parts: { platform: "telegram", chatType: "dm", chatId: "8494508720", userId: "8494508720" },
      perUser: true,
      key: "telegram:dm:8494508720",
    },
    {
      label: "the spec's channel example (thread then user)",
      parts: {
        platform: "slack",
        chatType: "channel",
        chatId: "C024BE91L",
        threadId: "1700000000.000100",
        userId: "U123",
      },
      perUser: true,
      key: "slack:channel:C024BE91L:1700000000.000100:U123",
    },
    {
      label: "channel thread without per-user sessions",
      parts: {
        platform: "slack",
        chatType: "channel",
        chatId: "C024BE91L",
        threadId: "1700000000.000100",
        userId: "U123",
      },
      perUser: false,
      key: "slack:channel:C024BE91L:1700000000.000100",
    },
    {
      label: "group with per-user sessions",
      parts: { platform: "telegram", chatType: "group", chatId: "-100123", userId: "42" },
      perUser: true,
      key: "telegram:group:-100123:42",
    },
    {
      label: "group without per-user sessions",
      parts: { platform: "telegram", chatType: "group", chatId: "-100123", userId: "42" },
      perUser: false,
      key: "telegram:group:-100123",
    },
    {
      label: "channel without thread, per user",
      parts: { platform: "discord", chatType: "channel", chatId: "998", threadId: null, userId: "77" },
      perUser: true,
      key: "discord:channel:998:77",
    },
    {
      label: "dm never gets the user part, even per user",
      parts: { platform: "generic", chatType: "dm", chatId: "c1", userId: "someone-else" },
      perUser: true,
      key: "generic:dm:c1",
    },
    {
      label: "dm without per-user sessions",
      parts: { platform: "generic", chatType: "dm", chatId: "c1", userId: "u1" },
      perUser: false,
      key: "generic:dm:c1",
    },
    {
      label: "dm in a thread gets the thread but not the user",
      parts: { platform: "generic", chatType: "dm", chatId: "c1", threadId: "t9", userId: "u1" },
      perUser: true,
      key: "generic:dm:c1:t9",
    },
    {
      label: "an empty thread id is no thread",
      parts: { platform: "generic", chatType: "group", chatId: "c1", threadId: "", userId: "u1" },
      perUser: true,
      key: "generic:group:c1:u1",
    },
    {
      label: "ids with colons are encoded",
      parts: { platform: "generic", chatType: "group", chatId: "a:b", threadId: "t:1", userId: "u:2" },
      perUser: true,
      key: "generic:group:a%3Ab:t%3A1:u%3A2",
    },
    {
      label: "ids with percent signs are encoded",
      parts: { platform: "generic", chatType: "dm", chatId: "100%", userId: "u" },
      perUser: true,
      key: "generic:dm:100%25",
    },
  ])("$label", ({ parts, perUser, key }) => {
    expect(buildSessionKey(parts, perUser)).toBe(key);
  });

  it("the user id changes a group key only when per-user sessions are on", () => {
    const alice: KeyParts = { platform: "slack", chatType: "group", chatId: "G1", userId: "alice" };
    const bob: KeyParts = { ...alice, userId: "bob" };
    expect(buildSessionKey(alice, true)).not.toBe(buildSessionKey(bob, true));
    expect(buildSessionKey(alice, false)).toBe(buildSessionKey(bob, false));
  });

  it("the user id never changes a dm key", () => {
    const alice: KeyParts = { platform: "slack", chatType: "dm", chatId: "D1", userId: "alice" };
    expect(buildSessionKey(alice, true)).toBe(buildSessionKey({ ...alice, userId: "bob" }, true));
  });

  describe("ids cannot forge or collide", () => {
    it.each<{ label: string; a: KeyParts; b: KeyParts; perUser: boolean }>([
      {
        label: 'chat "a:b" vs chat "a" in thread "b"',
        a: { platform: "generic", chatType: "dm", chatId: "a:b", userId: "u" },
        b: { platform: "generic", chatType: "dm", chatId: "a", threadId: "b", userId: "u" },
        perUser: true,
      },
      {
        label: 'chat "a%3Ab" vs chat "a:b"',
        a: { platform: "generic", chatType: "dm", chatId: "a%3Ab", userId: "u" },
        b: { platform: "generic", chatType: "dm", chatId: "a:b", userId: "u" },
        perUser: true,
      },
      {
        label: 'chat "a%253Ab" vs chat "a%3Ab"',
        a: { platform: "generic", chatType: "dm", chatId: "a%253Ab", userId: "u" },
        b: { platform: "generic", chatType: "dm", chatId: "a%3Ab", userId: "u" },
        perUser: true,
      },
      {
        label: 'group chat "a", user "b:c" vs chat "a", thread "b", user "c"',
        a: { platform: "generic", chatType: "group", chatId: "a", userId: "b:c" },
        b: { platform: "generic", chatType: "group", chatId: "a", threadId: "b", userId: "c" },
        perUser: true,
      },
      {
        label: 'group chat "a:b", user "c" vs chat "a", thread "b", user "c"',
        a: { platform: "generic", chatType: "group", chatId: "a:b", userId: "c" },
        b: { platform: "generic", chatType: "group", chatId: "a", threadId: "b", userId: "c" },
        perUser: true,
      },
      {
        label: 'thread "x:y" vs thread "x" with user "y" (per-user off)',
        a: { platform: "generic", chatType: "channel", chatId: "c", threadId: "x:y", userId: "y" },
        b: { platform: "generic", chatType: "channel", chatId: "c", threadId: "x", userId: "y" },
        perUser: false,
      },
      {
        label: 'thread "b" vs chat "a:b" (per-user off)',
        a: { platform: "generic", chatType: "group", chatId: "a", threadId: "b", userId: "u" },
        b: { platform: "generic", chatType: "group", chatId: "a:b", userId: "u" },
        perUser: false,
      },
      {
        label: 'user "%3A" vs user ":"',
        a: { platform: "generic", chatType: "group", chatId: "g", userId: "%3A" },
        b: { platform: "generic", chatType: "group", chatId: "g", userId: ":" },
        perUser: true,
      },
    ])("$label", ({ a, b, perUser }) => {
      expect(buildSessionKey(a, perUser)).not.toBe(buildSessionKey(b, perUser));
    });

    it("a chat id cannot add a segment to the key", () => {
      const key = buildSessionKey({ platform: "generic", chatType: "dm", chatId: "x:y:z:w", userId: "u" }, true);
      expect(key.split(":")).toEqual(["generic", "dm", "x%3Ay%3Az%3Aw"]);
    });

    it("every encoded part decodes back to its id", () => {
      for (const id of ["a:b", "a%3Ab", "%", "%%::", "100%25", "plain", ""]) {
        const encoded = encodeKeyPart(id);
        expect(encoded).not.toContain(":");
        expect(decodeURIComponent(encoded)).toBe(id);
      }
    });
  });
});

describe("encodeKeyPart", () => {
  it.each([
    ["plain", "plain"],
    ["a:b", "a%3Ab"],
    ["a%3Ab", "a%253Ab"],
    ["%", "%25"],
    ["::", "%3A%3A"],
    ["50%:off", "50%25%3Aoff"],
    ["1700000000.000100", "1700000000.000100"],
  ])("%s -> %s", (id, encoded) => {
    expect(encodeKeyPart(id)).toBe(encoded);
  });
});

describe("cronSessionKey", () => {
  it("is cron:{job_id}:{run_id} with encoded ids", () => {
    expect(cronSessionKey("nightly", "run-1")).toBe("cron:nightly:run-1");
    expect(cronSessionKey("a:b", "c")).toBe("cron:a%3Ab:c");
    expect(cronSessionKey("a:b", "c")).not.toBe(cronSessionKey("a", "b:c"));
  });
});
