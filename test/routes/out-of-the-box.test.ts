/**
 * What a new operator meets first: /admin with ADMIN_TOKEN unset says so; /healthz
 * names a half-configured platform (degraded) instead of answering ok; an invalid
 * configuration names every key at fault and never echoes a value to an
 * unauthenticated caller; a bad query names its parameter.
 */
import { exports } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { ADMIN_TOKEN, BASE, adminFetch, send, unique, useConfig } from "../helpers";

afterEach(() => useConfig(null));

const get = (path: string, headers: Record<string, string> = {}) =>
  exports.default.fetch(new Request(`${BASE}${path}`, { headers }));

describe("ADMIN_TOKEN unset", () => {
  it.each([
    ["no token", {}],
    ["some token", { authorization: `Bearer ${ADMIN_TOKEN}` }],
  ])("answers 401 saying ADMIN_TOKEN is not set (%s), not that the token is invalid", async (_label, headers) => {
    useConfig({ ADMIN_TOKEN: "" });
    const response = await get("/admin/sessions", headers);
    expect(response.status).toBe(401);
    const body = (await response.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("not_configured");
    expect(body.error.message).toContain("ADMIN_TOKEN is not set");
    expect(body.error.message).not.toMatch(/invalid/i);
  });
});

describe("/healthz", () => {
  it("is degraded, naming each missing key, when a platform is half-configured", async () => {
    useConfig({ TELEGRAM_BOT_TOKEN: "7000000003:AAhealth-check-token", SLACK_SIGNING_SECRET: "slack-half-secret" });
    const response = await get("/healthz");
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.ok).toBe(false);
    expect(body.status).toBe("degraded");
    const byPlatform = Object.fromEntries(body.problems.map((p: any) => [p.platform, p.keys]));
    expect(byPlatform.telegram).toEqual(["TELEGRAM_WEBHOOK_SECRET"]);
    expect(byPlatform.slack).toContain("SLACK_BOT_TOKEN");
    const text = JSON.stringify(body);
    expect(text).not.toContain("health-check-token");
    expect(text).not.toContain("slack-half-secret");
  });

  it("is ok when every platform is off or whole", async () => {
    expect(await (await get("/healthz")).json()).toEqual({ ok: true, status: "ok" });
  });
});

describe("invalid configuration, as an unauthenticated caller sees it", () => {
  it("names every key at fault and quotes no value", async () => {
    useConfig({
      GROUP_SESSIONS_PER_USER: "sometimes-Xray",
      GENERIC_REPLY_URL: "not a url with pass-Yankee",
      SESSION_RESET: '{"by_platform":{"telgram":{"mode":"none"}}}',
    });
    for (const response of [await get("/healthz"), (await send({ chat_id: unique("chat") })) as any]) {
      const status = response.status;
      const body = response instanceof Response ? await response.json() : response.body;
      expect(status).toBe(500);
      const message = (body as any).error.message as string;
      for (const key of ["GROUP_SESSIONS_PER_USER", "GENERIC_REPLY_URL", "SESSION_RESET.by_platform"])
        expect(message).toContain(key);
      expect(message).toContain("telgram"); // the misspelt key is named: it is a key, not a value
      expect(message).not.toContain("Xray");
      expect(message).not.toContain("Yankee");
    }
  });
});

describe("query errors", () => {
  it("name the parameter", async () => {
    const response = await adminFetch("/admin/sessions?open=maybe&limit=0");
    expect(response.status).toBe(400);
    const body = (await response.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("invalid_query");
    expect(body.error.message).toMatch(/^open: /);
    expect(body.error.message).toContain("limit: ");
  });
});
