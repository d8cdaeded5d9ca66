/**
 * Reset-policy choices an operator reads in the docs and sees in D1 and in
 * `GET /admin/routes/{key}/explain`: the end reason when the idle and daily
 * deadlines coincide (docs/lifecycle.md: `idle` on a tie), the `channel` entry of
 * `by_chat_type`, and the error that names a time zone the runtime does not know.
 */
import { describe, expect, it } from "vitest";
import { ConfigError, parseConfigFresh } from "../../src/config";
import { DEFAULT_POLICY, deadline, expiryReason, resolvePolicy, type ResetPolicy } from "../../src/domain/reset-policy";

const HOUR = 3_600_000;

describe("mode both, idle and daily deadlines at the same instant", () => {
  // 60 idle minutes after 02:59:59.999 is 04:00:00.000 minus 1 ms, so the idle
  // deadline (the first millisecond past it) is 04:00 UTC: the daily boundary.
  const p: ResetPolicy = { ...DEFAULT_POLICY, mode: "both", idleMinutes: 60, atHour: 4, atMinute: 0 };
  const last = Date.UTC(2026, 4, 10, 2, 59, 59, 999);
  const tie = Date.UTC(2026, 4, 10, 4, 0);

  it("ends the session as idle, as documented, at the tie and long after it", () => {
    expect(deadline(p, last)).toBe(tie);
    expect(expiryReason(p, last, tie)).toBe("idle");
    expect(expiryReason(p, last, tie + 30 * HOUR)).toBe("idle");
  });

  it("names daily when the boundary comes one millisecond before the idle deadline", () => {
    expect(expiryReason(p, last + 1, tie)).toBe("daily");
  });
});

describe("SESSION_RESET by_chat_type", () => {
  it("accepts a channel override and applies it to channel chats only", () => {
    const { reset } = parseConfigFresh({
      SESSION_RESET: JSON.stringify({ mode: "idle", by_chat_type: { channel: { mode: "daily", at_hour: 6 } } }),
    });
    expect(reset.by_chat_type).toEqual({ channel: { mode: "daily", at_hour: 6 } });
    expect(resolvePolicy(reset, "slack", "channel")).toEqual({ ...DEFAULT_POLICY, mode: "daily", atHour: 6 });
    expect(resolvePolicy(reset, "slack", "group")).toEqual({ ...DEFAULT_POLICY, mode: "idle" });
  });

  it.each(["dm", "group", "channel"])("accepts an override for %s chats", (chatType) => {
    const json = JSON.stringify({ by_chat_type: { [chatType]: { mode: "none" } } });
    expect(resolvePolicy(parseConfigFresh({ SESSION_RESET: json }).reset, "telegram", chatType).mode).toBe("none");
  });
});

describe("SESSION_RESET time zones", () => {
  it.each([
    ["the top level", { timezone: "Mars/Olympus_Mons" }, "SESSION_RESET.timezone"],
    [
      "a chat type",
      { by_chat_type: { channel: { timezone: "Mars/Olympus_Mons" } } },
      "SESSION_RESET.by_chat_type.channel.timezone",
    ],
  ])("tells the operator a zone in %s is not an IANA time zone", (_where, config, key) => {
    let error: unknown;
    try {
      parseConfigFresh({ SESSION_RESET: JSON.stringify(config) });
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toBe(`${key}: not an IANA time zone`);
  });
});
