/**
 * No URL that carries a credential is ever logged or shown (spec "Logs"): the
 * Telegram bot token lives in the Bot API's path, and hook URLs may carry a
 * user:password or a token. A failing send must keep them out of every console
 * line and out of `last_error` in the operator API.
 */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  BASE,
  T0,
  adminFetch,
  captureFetch,
  deliveriesOf,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { redactUrl, scrubUrl } from "../../src/http/outbound";

const TOKEN = "7000000001:AAsecret-bot-token-do-not-log";
const API = "https://telegram.test";

let logged: string[];
let consoleSpies: { mockRestore(): void }[];

beforeEach(() => {
  setNow(T0);
  logged = [];
  consoleSpies = (["log", "info", "warn", "error", "debug"] as const).map((level) =>
    vi.spyOn(console, level).mockImplementation((...args: unknown[]) => {
      logged.push(args.map((a) => (a instanceof Error ? `${a.message} ${a.stack}` : String(a))).join(" "));
    }),
  );
});
afterEach(() => {
  for (const spy of consoleSpies) spy.mockRestore();
  restoreClock();
  useConfig(null);
});

/** A response whose body fails while it is read (the path that logs the URL). */
const brokenBody = (status: number) =>
  new Response(new ReadableStream({ pull: (controller) => controller.error(new Error("stream reset")) }), { status });

describe("the Telegram bot token", () => {
  it("never reaches a log line or last_error when sending fails (a broken body, then a network error quoting the URL)", async () => {
    useConfig({
      TELEGRAM_BOT_TOKEN: TOKEN,
      TELEGRAM_WEBHOOK_SECRET: "tg-secret",
      TELEGRAM_API_BASE: API,
      SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
    });
    let attempt = 0;
    const outbound = captureFetch((request) => {
      attempt += 1;
      if (attempt === 1) return brokenBody(502);
      throw new TypeError(`Network connection lost while fetching ${request.url}`);
    });
    try {
      const chatId = 800_000_000 + Math.floor(Math.random() * 1_000_000);
      const update = {
        update_id: chatId,
        message: { message_id: 1, date: 1, chat: { id: chatId, type: "private" }, from: { id: chatId }, text: "hi" },
      };
      const response = await exports.default.fetch(
        new Request(`${BASE}/webhooks/telegram`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-telegram-bot-api-secret-token": "tg-secret" },
          body: JSON.stringify(update),
        }),
      );
      expect(response.status).toBe(200);
      const key = `telegram:dm:${chatId}`;
      await runAlarm(key);
      setNow(T0 + 1_000);
      await runAlarm(key);
      expect(outbound.calls.map((c) => c.url)).toEqual([
        `${API}/bot${TOKEN}/sendMessage`,
        `${API}/bot${TOKEN}/sendMessage`,
      ]);
      // The failing paths did log (the broken body), and none of it carries the token.
      expect(logged.some((line) => line.includes("could not read the response body"))).toBe(true);
      for (const line of logged) expect(line).not.toContain("AAsecret");
      const [session] = await sessionsOfKey(key);
      const [delivery] = await deliveriesOf(session!.id);
      expect(delivery.last_error).toContain("Network connection lost");
      expect(delivery.last_error).not.toContain("AAsecret");
      expect(JSON.stringify(await (await adminFetch(`/admin/sessions/${session!.id}`)).json())).not.toContain(
        "AAsecret",
      );
    } finally {
      outbound.restore();
    }
  });
});

describe("hook URLs", () => {
  it("are shown in last_error as scheme and host only, never with their credentials", async () => {
    const hook = "https://hookuser:hookpass@hooks.test/in/abc?token=hooktoken";
    useConfig({
      SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
      HOOK_URLS: hook,
      HOOK_SECRET: "s",
    });
    const outbound = captureFetch(() => new Response("down", { status: 500 }));
    try {
      const chat = unique("chat");
      const sent = await send({ chat_id: chat });
      await runAlarm(genericKey(chat));
      expect(outbound.calls.length).toBeGreaterThan(0);
      const view = JSON.stringify(await (await adminFetch(`/admin/sessions/${sent.body.session_id}`)).json());
      expect(view).toContain("https://hooks.test: HTTP 500");
      for (const secret of ["hookuser", "hookpass", "hooktoken", "/in/abc"]) expect(view).not.toContain(secret);
      for (const line of logged) expect(line).not.toContain("hookpass");
    } finally {
      outbound.restore();
    }
  });

  it("redactUrl keeps scheme and host; scrubUrl removes every form of the URL from a message", () => {
    expect(redactUrl("https://u:p@h.test:8443/a/b?c=d")).toBe("https://h.test:8443");
    expect(redactUrl("not a url")).toBe("(invalid URL)");
    const url = `${API}/bot${TOKEN}/sendMessage`;
    expect(scrubUrl(`failed: ${url} and again /bot${TOKEN}/sendMessage`, url)).toBe(`failed: ${API} and again ${API}`);
  });
});
