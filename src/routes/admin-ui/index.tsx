/**
 * The admin web page (`GET /admin`, then `/admin/ui/*`): server-rendered HTML for
 * an operator in a browser. Mounted at /admin before the JSON operator API, which
 * keeps every path it had (the page only claims `/admin` itself and `/admin/ui/*`).
 *
 * Sign-in takes ADMIN_TOKEN through a form and sets a signed, expiring, HttpOnly,
 * SameSite=Strict cookie; every POST carries the session's CSRF token; nothing is
 * shown before sign-in. The page sends no JavaScript.
 */
import { Hono, type Context } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { explainKey } from "../../admin/explain-key";
import { now } from "../../clock";
import { configOf } from "../../config";
import { safeEqual } from "../../crypto";
import {
  selectFailedDeliveries,
  selectFailedEvents,
  selectConversations,
  selectFailedRuns,
  selectPlatforms,
  selectSessionPage,
  selectSessionRuns,
} from "../../db/admin-views";
import { Database } from "../../db/client";
import { selectSessionDeliveries } from "../../db/deliveries";
import { selectSessionEvents } from "../../db/events";
import type { SessionRow } from "../../db/schema";
import { selectMessages, selectSession } from "../../db/sessions";
import { resolvePolicy } from "../../domain/reset-policy";
import { snapshot } from "../../metrics";
import { csrfForm, pageRetryKinds, sessionsFilter, signInForm, type PageRetryKind } from "./forms";
import { RETRY, type ApiFetch } from "./retry";
import {
  SESSION_COOKIE,
  SESSION_TTL_MS,
  SIGN_IN_COOKIE,
  SIGN_IN_TTL_MS,
  issueSession,
  readSession,
  signInNonce,
  type PageSession,
} from "./session-cookie";
import {
  FailedPage,
  MessagePage,
  MetricsPage,
  SessionPage,
  SessionsPage,
  SignInPage,
  type ExplainView,
  type Notice,
} from "./views";

type PageEnv = { Bindings: Env; Variables: { pageSession: PageSession } };
type PageContext = Context<PageEnv>;

const PAGE_SIZE = 25;
const FAILED_LIMIT = 100;

/** Page headers: no caching of operator data, no scripts, no framing, forms only to this origin. */
const PAGE_HEADERS: Record<string, string> = {
  "cache-control": "no-store",
  "content-security-policy":
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-frame-options": "DENY",
  "referrer-policy": "same-origin",
  "x-content-type-options": "nosniff",
};

const cookieOptions = (c: PageContext, maxAgeMs: number) => ({
  path: "/admin",
  httpOnly: true,
  sameSite: "Strict" as const,
  // Secure on https; wrangler dev on http://127.0.0.1 would otherwise drop it.
  secure: new URL(c.req.url).protocol === "https:",
  maxAge: Math.floor(maxAgeMs / 1000),
});

const db = (env: Env) => new Database(env.DB, "background");

/** A form field as a string (a file or a repeated field is not a valid value). */
async function formOf(c: PageContext): Promise<Record<string, string>> {
  const body = await c.req.parseBody().catch(() => ({}));
  return Object.fromEntries(Object.entries(body).filter((e): e is [string, string] => typeof e[1] === "string"));
}

function refuse(c: PageContext, status: 400 | 401 | 403 | 404, title: string, text: string, csrf?: string) {
  return c.html(<MessagePage title={title} text={text} csrf={csrf} />, status);
}

/** A POST from another origin is refused whatever it carries (SameSite is the first guard, this the second). */
function crossOrigin(c: PageContext): boolean {
  const origin = c.req.header("origin");
  return origin !== undefined && origin !== "null" && origin !== new URL(c.req.url).origin;
}

function noticeOf(c: PageContext): Notice | null {
  const text = c.req.query("notice");
  return text ? { text: text.slice(0, 300), error: c.req.query("error") === "1" } : null;
}

/** The page, given the app's own fetch so that its retry buttons go through the JSON API. */
export function adminPage(api: ApiFetch) {
  const page = new Hono<PageEnv>();

  page.use("/", async (c, next) => {
    await next();
    for (const [name, value] of Object.entries(PAGE_HEADERS)) c.res.headers.set(name, value);
  });
  page.use("/ui/*", async (c, next) => {
    await next();
    for (const [name, value] of Object.entries(PAGE_HEADERS)) c.res.headers.set(name, value);
  });

  const renderSignIn = (c: PageContext, error?: string) => {
    const nonce = signInNonce();
    setCookie(c, SIGN_IN_COOKIE, nonce, cookieOptions(c, SIGN_IN_TTL_MS));
    return c.html(<SignInPage nonce={nonce} error={error} />, error ? 401 : 200);
  };

  page.get("/", async (c) => {
    const session = await readSession(configOf(c.env).adminToken, getCookie(c, SESSION_COOKIE), now());
    if (session) return c.redirect("/admin/ui/sessions", 303);
    return renderSignIn(c);
  });

  page.post("/ui/sign-in", async (c) => {
    const form = await formOf(c);
    const expected = getCookie(c, SIGN_IN_COOKIE);
    if (crossOrigin(c) || !expected || !form.csrf || !safeEqual(form.csrf, expected)) {
      return refuse(c, 403, "Sign-in refused", "The sign-in form was stale or not this page's. Load it again.");
    }
    const parsed = signInForm.safeParse(form);
    const adminToken = configOf(c.env).adminToken;
    if (!parsed.success || !adminToken || !safeEqual(parsed.data.token, adminToken)) {
      return renderSignIn(c, "That is not the admin token.");
    }
    const { cookie } = await issueSession(adminToken, now());
    deleteCookie(c, SIGN_IN_COOKIE, { path: "/admin" });
    setCookie(c, SESSION_COOKIE, cookie, cookieOptions(c, SESSION_TTL_MS));
    return c.redirect("/admin/ui/sessions", 303);
  });

  // Everything else under /ui needs a signed-in session; a POST also its CSRF token.
  page.use("/ui/*", async (c, next) => {
    const session = await readSession(configOf(c.env).adminToken, getCookie(c, SESSION_COOKIE), now());
    if (!session) {
      if (c.req.method === "GET") return c.redirect("/admin", 303);
      return refuse(c, 401, "Not signed in", "Sign in first.");
    }
    if (c.req.method === "POST") {
      const form = csrfForm.safeParse(await formOf(c));
      if (crossOrigin(c) || !form.success || !safeEqual(form.data.csrf, session.csrf)) {
        return refuse(c, 403, "Refused", "This form did not carry this session's CSRF token.", session.csrf);
      }
    }
    c.set("pageSession", session);
    await next();
  });

  page.post("/ui/sign-out", (c) => {
    deleteCookie(c, SESSION_COOKIE, { path: "/admin" });
    return c.redirect("/admin", 303);
  });

  const zoneOf = (env: Env) => {
    const reset = configOf(env).reset;
    return (row: Pick<SessionRow, "platform" | "chatType">) =>
      resolvePolicy(reset, row.platform, row.chatType).timeZone;
  };

  page.get("/ui/sessions", async (c) => {
    const csrf = c.get("pageSession").csrf;
    const parsed = sessionsFilter.safeParse(c.req.query());
    if (!parsed.success) return refuse(c, 400, "Bad filter", parsed.error.issues[0]?.message ?? "invalid filter", csrf);
    const filter = parsed.data;
    const cursor = filter.before ? /^(\d+)\.(.+)$/.exec(filter.before) : null;
    const database = db(c.env);
    const [rows, platforms] = await database.batch(
      selectSessionPage({
        key: filter.key,
        state: filter.state,
        reason: filter.reason,
        platform: filter.platform,
        before: cursor ? { startedAt: Number(cursor[1]), id: cursor[2]! } : undefined,
        limit: PAGE_SIZE,
      }),
      selectPlatforms(),
    );
    const shown = rows.slice(0, PAGE_SIZE);
    const last = shown.at(-1);
    const next = rows.length > PAGE_SIZE && last ? `${last.startedAt}.${last.id}` : null;
    return c.html(
      <SessionsPage
        csrf={csrf}
        filter={filter}
        rows={shown}
        next={next}
        platforms={platforms.map((p) => p.platform)}
        zoneOf={zoneOf(c.env)}
        notice={noticeOf(c)}
      />,
    );
  });

  page.get("/ui/sessions/:id", async (c) => {
    const csrf = c.get("pageSession").csrf;
    const id = c.req.param("id");
    const database = db(c.env);
    const [rows, messages, runs, events, deliveries] = await database.batch(
      selectSession(database, id),
      selectMessages(database, id),
      selectSessionRuns(id),
      selectSessionEvents(database, id),
      selectSessionDeliveries(database, id),
    );
    const row = rows[0];
    if (!row) return refuse(c, 404, "No such session", `There is no session ${id}.`, csrf);
    const explain = (await explainKey(c.env, row.sessionKey)) as unknown as ExplainView;
    return c.html(
      <SessionPage
        csrf={csrf}
        row={row}
        zone={zoneOf(c.env)(row)}
        messages={messages}
        runs={runs}
        events={events}
        deliveries={deliveries}
        explain={explain}
        notice={noticeOf(c)}
      />,
    );
  });

  page.get("/ui/failed", async (c) => {
    const database = db(c.env);
    const [runs, deliveries, events] = await database.batch(
      selectFailedRuns(FAILED_LIMIT),
      selectFailedDeliveries(FAILED_LIMIT),
      selectFailedEvents(FAILED_LIMIT),
    );
    const ids = [...new Set([...runs, ...deliveries, ...events].map((item) => item.sessionId))];
    const [conversations] = ids.length > 0 ? await database.batch(selectConversations(ids)) : [[]];
    const zone = zoneOf(c.env);
    const zones = new Map(conversations.map((s) => [s.id, zone({ platform: s.platform, chatType: s.chat_type })]));
    return c.html(
      <FailedPage
        csrf={c.get("pageSession").csrf}
        runs={runs}
        deliveries={deliveries}
        events={events}
        zoneOf={(sessionId) => zones.get(sessionId) ?? "UTC"}
        notice={noticeOf(c)}
      />,
    );
  });

  page.get("/ui/metrics", (c) => c.html(<MetricsPage csrf={c.get("pageSession").csrf} counters={snapshot()} />));

  page.post("/ui/retry/:kind/:id", async (c) => {
    const csrf = c.get("pageSession").csrf;
    const kind = c.req.param("kind") as PageRetryKind;
    if (!pageRetryKinds.includes(kind)) return refuse(c, 404, "Nothing to retry", `Unknown kind ${kind}.`, csrf);
    const id = c.req.param("id");
    const form = await formOf(c);
    const back = /^\/admin\/ui\/[A-Za-z0-9/_%.-]*$/.test(form.back ?? "") ? form.back! : "/admin/ui/failed";
    const outcome = await RETRY[kind](api, c.env, configOf(c.env).adminToken ?? "", id);
    const ok = outcome.status === 200;
    const params = new URLSearchParams({
      notice: ok ? `Retried ${kind} ${id}.` : `Could not retry ${kind} ${id}: ${outcome.message}`,
    });
    if (!ok) params.set("error", "1");
    return c.redirect(`${back}?${params}`, 303);
  });

  return page;
}
