/** The logger's own rules: one JSON object per line, and what it refuses to write whoever calls it. */
import { describe, expect, it } from "vitest";
import { errorSummary, formatLine, registerSecrets, scrub } from "../../src/log";

describe("formatLine", () => {
  it("writes one JSON object with level, msg and the fields", () => {
    const line = formatLine("info", "message routed", { request_id: "req_1", session_key: "generic:dm:1", ms: 3 });
    expect(line).not.toContain("\n");
    expect(JSON.parse(line)).toEqual({
      level: "info",
      msg: "message routed",
      request_id: "req_1",
      session_key: "generic:dm:1",
      ms: 3,
    });
  });

  it("drops fields named like a secret, a token or a message body, at any depth", () => {
    const line = JSON.parse(
      formatLine("warn", "x", {
        text: "hello there",
        run_token: "abc",
        nested: { authorization: "Bearer x", reply: "hi", webhook_signature: "v1,zz", kept: 1 },
      }),
    );
    expect(line).toEqual({
      level: "warn",
      msg: "x",
      text: "[redacted]",
      run_token: "[redacted]",
      nested: { authorization: "[redacted]", reply: "[redacted]", webhook_signature: "[redacted]", kept: 1 },
    });
  });

  it("masks every registered secret value wherever it appears, the message too", () => {
    registerSecrets({
      HOOK_SECRET: "s3cret-value-Uniform",
      SESSION_RESET: '{"mode":"none"}',
      ADMIN_TOKEN: "adm-Victor",
    });
    const line = formatLine("error", "failed with adm-Victor", { error: "Error: key s3cret-value-Uniform refused" });
    expect(line).not.toContain("s3cret-value-Uniform");
    expect(line).not.toContain("adm-Victor");
    // A variable not named like a secret is not a secret.
    expect(formatLine("info", "mode none", { mode: '{"mode":"none"}' })).toContain("none");
  });
});

describe("scrub: URLs that carry a credential are cut to their origin", () => {
  it.each([
    ["https://user:pw@hooks.example/a", "https://hooks.example/[redacted]"],
    ["https://hooks.example/a?token=t1", "https://hooks.example/[redacted]"],
    ["https://hooks.example/a?X-Amz-Signature=ab", "https://hooks.example/[redacted]"],
    [
      "https://api.telegram.org/bot7000000001:AAabcdefghijklmnopqrstuvwxyz/sendMessage",
      "https://api.telegram.org/[redacted]",
    ],
    [
      "fetch to https://graph.example/v1/media?access_token=EAAG failed",
      "fetch to https://graph.example/[redacted] failed",
    ],
  ])("%s", (input, expected) => {
    expect(scrub(input)).toBe(expected);
  });

  it("leaves a URL without credentials and plain words alone", () => {
    expect(scrub("POST https://hooks.example/a?attempt=2 answered 500")).toBe(
      "POST https://hooks.example/a?attempt=2 answered 500",
    );
  });

  it("masks a bare Telegram bot token in error text", () => {
    expect(scrub("bad token 7000000001:AAabcdefghijklmnopqrstuvwxyz")).toBe("bad token [redacted]");
  });
});

describe("errorSummary", () => {
  it("keeps the status of an HTTP error and drops the body the other side answered", () => {
    expect(errorSummary('HTTP 500: {"echo":"the user text"}')).toBe("HTTP 500");
    expect(errorSummary("TypeError: fetch failed")).toBe("TypeError: fetch failed");
    expect(errorSummary(null)).toBeNull();
  });
});
