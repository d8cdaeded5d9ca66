/**
 * The admin web page through the worker's own fetch: sign-in, the session cookie's
 * flags, no access without it, CSRF refusals, filters and paging, the timeline, a
 * retry, and the JSON API left exactly as it was.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SESSION_TTL_MS } from "../../src/routes/admin-ui/session-cookie";
import {
  ADMIN_TOKEN,
  BASE,
  MINUTE,
  T0,
  adminFetch,
  captureFetch,
  eventsOf,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";

const HOOK = "https://hooks.test/page";

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60, timezone: "Europe/Berlin" }) });
});
afterEach(() => {
  restoreClock();
  useConfig(null);
});

const page = (path: string, init: RequestInit = {}) =>
  exports.default.fetch(new Request(`${BASE}${path}`, { redirect: "manual", ...init }));

/** `name=value` of a Set-Cookie header, and its attributes. */
function cookieOf(response: Response, name: string): { pair: string; attributes: string } | null {
  const header = (response.headers as unknown as { getSetCookie(): string[] })
    .getSetCookie()
    .find((c) => c.startsWith(`${name}=`));
  if (!header) return null;
  const [pair, ...attributes] = header.split(";");
  return { pair: pair!.trim(), attributes: attributes.join(";") };
}

const form = (fields: Record<string, string>) => new URLSearchParams(fields).toString();
const formHeaders = (cookie: string) => ({ "content-type": "application/x-www-form-urlencoded", cookie });

/** Loads the sign-in form: its nonce cookie and hidden field. */
async function signInForm(): Promise<{ cookie: string; csrf: string }> {
  const response = await page("/admin");
  expect(response.status).toBe(200);
  const html = await response.text();
  const csrf = /name="csrf" value="([^"]+)"/.exec(html)![1]!;
  return { cookie: cookieOf(response, "sessiongate_sign_in")!.pair, csrf };
}

/** Signs in; returns the session cookie and the CSRF token of the session's pages. */
async function signIn(): Promise<{ cookie: string; csrf: string; response: Response }> {
  const { cookie, csrf } = await signInForm();
  const response = await page("/admin/ui/sign-in", {
    method: "POST",
    headers: formHeaders(cookie),
    body: form({ csrf, token: ADMIN_TOKEN }),
  });
  expect(response.status).toBe(303);
  const session = cookieOf(response, "sessiongate_admin")!;
  const sessions = await page("/admin/ui/sessions", { headers: { cookie: session.pair } });
  const pageCsrf = /name="csrf" value="([^"]+)"/.exec(await sessions.text())![1]!;
  return { cookie: session.pair, csrf: pageCsrf, response };
}

describe("sign-in", () => {
  it("GET /admin shows only the sign-in form, with no session data and no script", async () => {
    const chat = unique("secret-chat");
    await send({ chat_id: chat });
    const response = await page("/admin");
    const html = await response.text();
    expect(response.headers.get("content-type")).toContain("text/html");
    expect(html).toContain('name="token"');
    expect(html).not.toContain(chat);
    expect(html).not.toContain("<script");
    expect(response.headers.get("content-security-policy")).toContain("default-src 'none'");
    expect(response.headers.get("cache-control")).toBe("no-store");
  });

  it("the right token sets an HttpOnly, SameSite=Strict, signed and expiring session cookie", async () => {
    const { response, cookie } = await signIn();
    expect(response.headers.get("location")).toBe("/admin/ui/sessions");
    const attributes = cookieOf(response, "sessiongate_admin")!.attributes;
    expect(attributes).toMatch(/HttpOnly/i);
    expect(attributes).toMatch(/SameSite=Strict/i);
    expect(attributes).toMatch(/Path=\/admin/);
    expect(attributes).toMatch(/Secure/); // https here; plain http on loopback gets no Secure
    expect(attributes).toContain(`Max-Age=${SESSION_TTL_MS / 1000}`);
    expect(cookie).toMatch(/^sessiongate_admin=v1\.\d+\.[A-Za-z0-9_-]+\.[0-9a-f]{64}$/);
    expect(cookie).not.toContain(ADMIN_TOKEN);
  });

  it("a wrong token: 401, the form again, no session cookie", async () => {
    const { cookie, csrf } = await signInForm();
    const response = await page("/admin/ui/sign-in", {
      method: "POST",
      headers: formHeaders(cookie),
      body: form({ csrf, token: "not-the-token" }),
    });
    expect(response.status).toBe(401);
    expect(await response.text()).toContain("That is not the admin token.");
    expect(cookieOf(response, "sessiongate_admin")).toBeNull();
  });

  it("a sign-in POST without its CSRF token, or from another origin, is refused", async () => {
    const { cookie, csrf } = await signInForm();
    const noToken = await page("/admin/ui/sign-in", {
      method: "POST",
      headers: formHeaders(cookie),
      body: form({ token: ADMIN_TOKEN }),
    });
    expect(noToken.status).toBe(403);
    const noCookie = await page("/admin/ui/sign-in", {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: form({ csrf, token: ADMIN_TOKEN }),
    });
    expect(noCookie.status).toBe(403);
    const elsewhere = await page("/admin/ui/sign-in", {
      method: "POST",
      headers: { ...formHeaders(cookie), origin: "https://evil.test" },
      body: form({ csrf, token: ADMIN_TOKEN }),
    });
    expect(elsewhere.status).toBe(403);
    for (const response of [noToken, noCookie, elsewhere]) expect(cookieOf(response, "sessiongate_admin")).toBeNull();
  });
});

describe("no access without the session cookie", () => {
  const pages = ["/admin/ui/sessions", "/admin/ui/failed", "/admin/ui/metrics", "/admin/ui/sessions/ses_x"];

  it("every page redirects to the sign-in form; a POST is 401", async () => {
    for (const path of pages) {
      const response = await page(path);
      expect(response.status, path).toBe(303);
      expect(response.headers.get("location")).toBe("/admin");
    }
    const post = await page("/admin/ui/retry/event/evt_x", {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: form({ csrf: "x" }),
    });
    expect(post.status).toBe(401);
  });

  it("a forged, expired, or other token's cookie is no cookie", async () => {
    const { cookie } = await signIn();
    const [name, value] = cookie.split("=") as [string, string];
    const forged = `${name}=${value.replace(/\.(\d+)\./, (_m, t: string) => `.${Number(t) + 1000}.`)}`;
    expect((await page("/admin/ui/sessions", { headers: { cookie: forged } })).status).toBe(303);
    setNow(T0 + SESSION_TTL_MS);
    expect((await page("/admin/ui/sessions", { headers: { cookie } })).status).toBe(303);
    setNow(T0);
    expect((await page("/admin/ui/sessions", { headers: { cookie } })).status).toBe(200);
    useConfig({ ADMIN_TOKEN: "a-rotated-admin-token" });
    expect((await page("/admin/ui/sessions", { headers: { cookie } })).status).toBe(303);
  });

  it("the cookie does not open the JSON API, which keeps its bearer token and answers", async () => {
    const { cookie } = await signIn();
    expect((await page("/admin/sessions", { headers: { cookie } })).status).toBe(401);
    const json = await adminFetch("/admin/sessions");
    expect(json.status).toBe(200);
    expect(json.headers.get("content-type")).toContain("application/json");
    expect(await json.json()).toHaveProperty("sessions");
  });
});

describe("signed-in pages", () => {
  it("sessions: filters by key, state, end reason and platform", async () => {
    const { cookie } = await signIn();
    const prefix = unique("filter");
    const open = await send({ chat_id: `${prefix}-open` });
    const ended = await send({ chat_id: `${prefix}-ended` });
    await adminFetch(`/admin/sessions/${ended.body.session_id}/end`, { method: "POST" });
    const list = async (query: string) => {
      const response = await page(`/admin/ui/sessions?${query}`, { headers: { cookie } });
      expect(response.status).toBe(200);
      return response.text();
    };
    const key = encodeURIComponent(`generic:dm:${prefix}`);
    const all = await list(`key=${key}`);
    expect(all).toContain(open.body.session_id);
    expect(all).toContain(ended.body.session_id);
    const openOnly = await list(`key=${key}&state=open`);
    expect(openOnly).toContain(open.body.session_id);
    expect(openOnly).not.toContain(ended.body.session_id);
    const byReason = await list(`key=${key}&reason=admin`);
    expect(byReason).not.toContain(open.body.session_id);
    expect(byReason).toContain(ended.body.session_id);
    expect(await list(`key=${key}&platform=telegram`)).not.toContain(open.body.session_id);
    expect(await list(`key=${key}&platform=generic&state=`)).toContain(open.body.session_id);
    expect((await page(`/admin/ui/sessions?state=maybe`, { headers: { cookie } })).status).toBe(400);
  });

  it("sessions: pages of 25, newest first, with no session lost between pages", async () => {
    const { cookie } = await signIn();
    const prefix = unique("paging");
    const ids: string[] = [];
    for (let i = 0; i < 27; i++) {
      if (i % 3 === 0) setNow(T0 + i); // threes share a start time, one of them split by the page boundary
      ids.push((await send({ chat_id: `${prefix}-${i}` })).body.session_id);
    }
    const key = encodeURIComponent(`generic:dm:${prefix}`);
    const first = await (await page(`/admin/ui/sessions?key=${key}`, { headers: { cookie } })).text();
    const next = /href="([^"]+)">Older/.exec(first)![1]!.replaceAll("&amp;", "&");
    const second = await (await page(next, { headers: { cookie } })).text();
    const shown = (html: string) => ids.filter((id) => html.includes(`>${id}<`));
    expect(shown(first)).toHaveLength(25);
    expect(shown(second)).toHaveLength(2);
    expect(new Set([...shown(first), ...shown(second)]).size).toBe(27);
    expect(second).not.toContain(">Older");
  });

  it("one session: its timeline, times in UTC and the policy's zone, and the explain block", async () => {
    const { cookie } = await signIn();
    const chat = unique("timeline");
    const sent = await send({ chat_id: chat, text: "hello <b>there</b>" });
    const response = await page(`/admin/ui/sessions/${sent.body.session_id}`, { headers: { cookie } });
    expect(response.status).toBe(200);
    const html = await response.text();
    expect(html).toContain("hello &lt;b&gt;there&lt;/b&gt;"); // escaped, never markup
    expect(html).toContain("2031-01-15 12:00:00 UTC");
    expect(html).toContain("2031-01-15 13:00:00 +01:00 Europe/Berlin");
    expect(html).toContain("session.started");
    expect(html).toContain("A message now:");
    expect(html).toContain(`stored in the live session ${sent.body.session_id}`);
    expect(html).toContain("idle 60 min");
    expect((await page(`/admin/ui/sessions/ses_nope`, { headers: { cookie } })).status).toBe(404);
  });

  it("metrics: every counter", async () => {
    const { cookie } = await signIn();
    const html = await (await page("/admin/ui/metrics", { headers: { cookie } })).text();
    for (const counter of ["messages_routed", "sessions_created", "d1_rows_written_ingress", "events_failed"]) {
      expect(html).toContain(counter);
    }
  });
});

describe("retry from the page", () => {
  async function failedEvent(): Promise<{ key: string; sessionId: string; eventId: string }> {
    const chat = unique("retry");
    const sent = await send({ chat_id: chat });
    const [event] = await eventsOf(sent.body.session_id);
    await env.DB.prepare(`UPDATE events SET status = 'failed', attempts = 12, last_error = 'HTTP 500' WHERE id = ?`)
      .bind(event!.id)
      .run();
    return { key: genericKey(chat), sessionId: sent.body.session_id, eventId: event!.id };
  }

  it("a failed event is listed with a retry button; the POST with the CSRF token retries it", async () => {
    useConfig({ HOOK_URLS: HOOK, HOOK_SECRET: "page-hook-secret" });
    const { cookie, csrf } = await signIn();
    const { key, eventId } = await failedEvent();
    const failed = await (await page("/admin/ui/failed", { headers: { cookie } })).text();
    expect(failed).toContain(eventId);
    expect(failed).toContain(`action="/admin/ui/retry/event/${eventId}"`);
    const hooks = captureFetch((request) => {
      if (request.url !== HOOK) throw new Error(`unexpected ${request.url}`);
      return new Response("ok");
    });
    try {
      const response = await page(`/admin/ui/retry/event/${eventId}`, {
        method: "POST",
        headers: formHeaders(cookie),
        body: form({ csrf, back: "/admin/ui/failed" }),
      });
      expect(response.status).toBe(303);
      expect(response.headers.get("location")).toMatch(/^\/admin\/ui\/failed\?notice=Retried/);
      await runAlarm(key); // the routing object delivers it (tests drain by alarm)
    } finally {
      hooks.restore();
    }
    expect(hooks.calls.map((call) => call.json?.id)).toContain(eventId);
    const row = await env.DB.prepare(`SELECT status FROM events WHERE id = ?`)
      .bind(eventId)
      .first<{ status: string }>();
    expect(row!.status).toBe("sent");
  });

  it("a POST without the CSRF token, or with another session's, is refused and changes nothing", async () => {
    const { cookie } = await signIn();
    const other = await signIn();
    const { eventId } = await failedEvent();
    for (const body of [form({ back: "/admin/ui/failed" }), form({ csrf: other.csrf })]) {
      const response = await page(`/admin/ui/retry/event/${eventId}`, {
        method: "POST",
        headers: formHeaders(cookie),
        body,
      });
      expect(response.status).toBe(403);
    }
    const row = await env.DB.prepare(`SELECT status FROM events WHERE id = ?`)
      .bind(eventId)
      .first<{ status: string }>();
    expect(row!.status).toBe("failed");
  });

  it("an unknown id is reported on the page, not retried", async () => {
    const { cookie, csrf } = await signIn();
    const response = await page(`/admin/ui/retry/event/evt_nope`, {
      method: "POST",
      headers: formHeaders(cookie),
      body: form({ csrf }),
    });
    expect(response.status).toBe(303);
    expect(decodeURIComponent(response.headers.get("location")!)).toContain("error=1");
  });

  it("sign-out needs the CSRF token too, then the cookie is cleared", async () => {
    const { cookie, csrf } = await signIn();
    const refused = await page("/admin/ui/sign-out", { method: "POST", headers: formHeaders(cookie), body: "" });
    expect(refused.status).toBe(403);
    const out = await page("/admin/ui/sign-out", {
      method: "POST",
      headers: formHeaders(cookie),
      body: form({ csrf }),
    });
    expect(out.status).toBe(303);
    expect(cookieOf(out, "sessiongate_admin")!.attributes).toMatch(/Max-Age=0/);
  });
});

it("explains a session whose key holds an encoded id", async () => {
  const { cookie } = await signIn();
  const chat = `${unique("a")}:b`;
  const sent = await send({ chat_id: chat });
  setNow(T0 + 61 * MINUTE);
  const html = await (await page(`/admin/ui/sessions/${sent.body.session_id}`, { headers: { cookie } })).text();
  expect(html).toContain(genericKey(chat.replace(":", "%3A")));
  expect(html).toContain(`ends ${sent.body.session_id} as idle (its deadline passed)`);
});
