// `npm run test:browser`: the admin page in a real browser. Debian's Chromium
// (/usr/bin/chromium) driven by playwright-core, against the gateway started the way
// `npm start` starts it (wrangler dev on its own port, persist dir and inspector
// port), with a fake agent and a hook receiver on loopback. Every process it
// starts is stopped at the end, on failure too. Screenshots of each page go to
// test/browser/artifacts/ (git-ignored).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHmac } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { killAllGroupsSync, startGroup, stopGroup, tail } from "../../bench/lib/proc.mjs";
import { validateOpenApi } from "../../scripts/validate-openapi.mjs";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const ARTIFACTS = join(ROOT, "test", "browser", "artifacts");
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
// This suite's ports (gateway, its inspector, the fake agent and hook receiver).
const PORT = Number(process.env.BROWSER_TEST_PORT ?? 8830);
const INSPECTOR_PORT = PORT + 1;
const FAKES_PORT = PORT + 2;
const ORIGIN = `http://127.0.0.1:${PORT}`;
const ADMIN_TOKEN = "browser-admin-token";
const WEBHOOK_SECRET = "browser-webhook-secret";
const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

const state = mkdtempSync(join(tmpdir(), "sessiongate-browser-"));
let gateway = null;
let fakes = null;
const contexts = [];
/** Event ids the hook receiver acknowledged. */
const hookIds = [];

process.on("exit", () => killAllGroupsSync());
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(130));

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The fake agent (fails a run at once with a 400 when the text says so) and the hook receiver. */
function startFakes() {
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => (body += chunk));
    request.on("end", () => {
      const json = body ? JSON.parse(body) : null;
      if (request.url === "/agent") {
        if (json.message.text.includes("fail")) {
          response.writeHead(400, { "content-type": "application/json" }).end('{"error":"bad"}');
        } else {
          response.writeHead(200, { "content-type": "application/json" });
          response.end(JSON.stringify({ reply: `echo: ${json.message.text}` }));
        }
      } else if (request.url === "/hooks") {
        hookIds.push(json.id);
        response.writeHead(200).end("ok");
      } else if (request.url === "/replies") {
        response.writeHead(200).end("ok");
      } else {
        response.writeHead(404).end();
      }
    });
  });
  return new Promise((resolve) => server.listen(FAKES_PORT, "127.0.0.1", () => resolve(server)));
}

/** Starts the gateway as `npm start` does, on this suite's state, and waits for /healthz. */
/**
 * Runs one SQL statement on the stopped gateway's local D1, as an operator would
 * (`wrangler d1 execute --local` on the same persist directory), and returns its rows.
 */
function d1(sql) {
  const out = execFileSync(
    "npx",
    ["wrangler", "d1", "execute", "DB", "--local", "--persist-to", join(state, "wrangler"), "--json", "--command", sql],
    { cwd: ROOT, env: { ...process.env, WRANGLER_SEND_METRICS: "false" }, encoding: "utf8" },
  );
  return JSON.parse(out)[0]?.results ?? [];
}

async function startGateway(label) {
  const envFile = join(state, "vars.env");
  const fakesOrigin = `http://127.0.0.1:${FAKES_PORT}`;
  writeFileSync(
    envFile,
    [
      `ADMIN_TOKEN=${ADMIN_TOKEN}`,
      `GENERIC_WEBHOOK_SECRET=${WEBHOOK_SECRET}`,
      `GENERIC_REPLY_URL=${fakesOrigin}/replies`,
      `AGENT_URL=${fakesOrigin}/agent`,
      `AGENT_TOKEN=browser-agent-token`,
      `HOOK_URLS=${fakesOrigin}/hooks`,
      `HOOK_SECRET=browser-hook-secret`,
      `SESSION_RESET='{"mode":"both","idle_minutes":90,"at_hour":4,"timezone":"Europe/Berlin"}'`,
      "",
    ].join("\n"),
  );
  const env = { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false", NO_COLOR: "1" };
  env.WRANGLER_LOG_PATH = join(state, "wrangler-logs");
  const logFile = join(state, `gateway-${label}.log`);
  const child = startGroup(
    "npm",
    [
      "start",
      "--",
      "--ip",
      "127.0.0.1",
      "--port",
      String(PORT),
      "--inspector-port",
      String(INSPECTOR_PORT),
      "--persist-to",
      join(state, "wrangler"),
      "--env-file",
      envFile,
      "--show-interactive-dev-session=false",
    ],
    { cwd: ROOT, env, logFile },
  );
  let exited = null;
  child.exited.then((outcome) => (exited = outcome));
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    if (exited) throw new Error(`the gateway exited (${exited.code}):\n${tail(logFile)}`);
    try {
      const response = await fetch(`${ORIGIN}/healthz`, { signal: AbortSignal.timeout(2000) });
      if (response.ok) return child;
    } catch {
      // not up yet
    }
    await sleep(250);
  }
  await stopGroup(child.pid);
  throw new Error(`the gateway did not answer /healthz within 90 s:\n${tail(logFile)}`);
}

async function webhook(message) {
  const body = JSON.stringify({ chat_type: "dm", user_id: "u1", ...message });
  const signature = createHmac("sha256", WEBHOOK_SECRET).update(body).digest("hex");
  const response = await fetch(`${ORIGIN}/webhooks/generic`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-signature-256": `sha256=${signature}` },
    body,
  });
  assert.equal(response.status, 200, await response.clone().text());
  return response.json();
}

async function admin(path, init = {}) {
  const response = await fetch(`${ORIGIN}${path}`, {
    ...init,
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...init.headers },
  });
  return { status: response.status, body: await response.json() };
}

async function until(what, check, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (${JSON.stringify(seeded.progress)})`);
    await sleep(200);
  }
}

const seeded = {};

async function browserContext(label, { javaScriptEnabled = true } = {}) {
  const context = await chromium.launchPersistentContext(mkdtempSync(join(state, `chromium-${label}-`)), {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    javaScriptEnabled,
    viewport: { width: 1280, height: 900 },
  });
  contexts.push(context);
  return context;
}

async function shot(page, name) {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

async function signIn(page, token = ADMIN_TOKEN) {
  await page.goto(`${ORIGIN}/admin`);
  await page.fill('input[name="token"]', token);
  await Promise.all([page.waitForLoadState("load"), page.click('button[type="submit"]')]);
}

before(async () => {
  rmSync(ARTIFACTS, { recursive: true, force: true });
  mkdirSync(ARTIFACTS, { recursive: true });
  fakes = await startFakes();
  gateway = await startGateway("seed");
  // A conversation with a few turns, one in a Berlin chat with an encoded id, one ended
  // by the operator, one whose hand-off fails for good (the agent answers 400), a cron job.
  seeded.alice = await webhook({ event_id: "e-alice-1", chat_id: "alice", text: "Hello! Can you summarise my notes?" });
  await webhook({ event_id: "e-alice-2", chat_id: "alice", text: "And the action items, please." });
  seeded.odd = await webhook({ event_id: "e-odd-1", chat_id: "a:b", text: "a chat id with a colon" });
  seeded.ended = await webhook({ event_id: "e-bob-1", chat_id: "bob", text: "bye for now" });
  assert.equal((await admin(`/admin/sessions/${seeded.ended.session_id}/end`, { method: "POST" })).status, 200);
  seeded.failedRun = await webhook({ event_id: "e-carol-1", chat_id: "carol", text: "please fail this turn" });
  const cron = await fetch(`${ORIGIN}/v1/cron/runs`, {
    method: "POST",
    headers: { authorization: "Bearer browser-agent-token", "content-type": "application/json" },
    body: JSON.stringify({ job_id: "nightly-digest", text: "digest" }),
  });
  assert.equal(cron.status, 200);
  await until("the failed run and alice's replies", async () => {
    const carol = await admin(`/admin/routes/${encodeURIComponent("generic:dm:carol")}/explain`);
    const alice = await admin(`/admin/sessions/${seeded.alice.session_id}`);
    // The hand-off was made (a current run) and is over (no open run): the agent's 400 failed it.
    const failed = carol.body.session?.current_run_id && carol.body.open_run === null;
    seeded.progress = { carol: carol.body.open_run, alice: alice.body.messages.length };
    return failed && alice.body.messages.length >= 4;
  });
  // Dead letters take hours of retries to happen by themselves: an operator's SQL makes
  // one event and one delivery dead-lettered, on the stopped gateway's D1 file.
  await until("alice's events delivered", async () => {
    const { body } = await admin(`/admin/sessions/${seeded.alice.session_id}`);
    return body.events.length > 0 && body.events.every((e) => e.status === "sent");
  });
  await stopGroup(gateway.pid);
  gateway = null;
  const event = d1(
    `SELECT id FROM events WHERE session_id = '${seeded.ended.session_id}' AND type = 'session.ended'`,
  )[0];
  d1(
    `UPDATE events SET status = 'failed', attempts = 12, delivered_to = '[]', last_error = 'http://127.0.0.1/hooks: HTTP 503' WHERE id = '${event.id}'`,
  );
  seeded.failedEventId = event.id;
  const delivery = d1(`SELECT id FROM deliveries WHERE session_id = '${seeded.alice.session_id}' LIMIT 1`)[0];
  d1(
    `UPDATE deliveries SET status = 'failed', attempts = 10, last_status = 500, last_error = 'HTTP 500' WHERE id = '${delivery.id}'`,
  );
  seeded.failedDeliveryId = delivery.id;
  gateway = await startGateway("pages");
});

after(async () => {
  for (const context of contexts) await context.close().catch(() => {});
  if (gateway) await stopGroup(gateway.pid);
  if (fakes) await new Promise((resolve) => fakes.close(resolve));
  // Kept when asked, to read the gateway's logs.
  if (!process.env.KEEP_BROWSER_STATE) rmSync(state, { recursive: true, force: true });
  else console.log(`state kept in ${state}`);
});

describe("the admin page in Chromium", () => {
  it("a wrong token: the form again with an error, no cookie", async () => {
    const context = await browserContext("wrong");
    const page = await context.newPage();
    await page.goto(`${ORIGIN}/admin`);
    await shot(page, "01-sign-in");
    assert.equal(await page.locator("main table").count(), 0); // nothing shown before sign-in
    await signIn(page, "not-the-token");
    assert.match(await page.textContent("main"), /That is not the admin token/);
    await shot(page, "02-sign-in-wrong-token");
    const cookies = await context.cookies();
    assert.equal(cookies.filter((c) => c.name === "sessiongate_admin").length, 0);
    const response = await page.goto(`${ORIGIN}/admin/ui/sessions`);
    assert.equal(new URL(response.url()).pathname, "/admin"); // redirected to sign in
  });

  it("signs in; the cookie is HttpOnly and SameSite=Strict; sessions with filters", async () => {
    const context = await browserContext("main");
    const page = await context.newPage();
    await signIn(page);
    assert.equal(new URL(page.url()).pathname, "/admin/ui/sessions");
    const cookie = (await context.cookies()).find((c) => c.name === "sessiongate_admin");
    assert.ok(cookie, "session cookie set");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.ok(cookie.expires > Date.now() / 1000, "expiring");
    const text = await page.textContent("main");
    for (const id of [seeded.alice.session_id, seeded.ended.session_id, seeded.odd.session_id])
      assert.ok(text.includes(id));
    assert.match(text, /Europe\/Berlin/);
    await shot(page, "03-sessions");

    await page.selectOption('select[name="state"]', "ended");
    await Promise.all([page.waitForURL(/state=ended/), page.click('form.filters button[type="submit"]')]);
    const ended = await page.textContent("main table");
    assert.ok(ended.includes(seeded.ended.session_id));
    assert.ok(!ended.includes(seeded.alice.session_id));
    await shot(page, "04-sessions-ended");

    await page.goto(`${ORIGIN}/admin/ui/sessions`);
    await page.selectOption('select[name="platform"]', "cron");
    await Promise.all([page.waitForURL(/platform=cron/), page.click('form.filters button[type="submit"]')]);
    const cron = await page.textContent("main table");
    assert.match(cron, /cron:nightly-digest:/);
    assert.ok(!cron.includes(seeded.alice.session_id));

    await page.goto(`${ORIGIN}/admin/ui/sessions`);
    await page.fill('input[name="key"]', "generic:dm:a%3Ab");
    await Promise.all([page.waitForURL(/key=/), page.click('form.filters button[type="submit"]')]);
    const odd = await page.textContent("main table");
    assert.ok(odd.includes(seeded.odd.session_id));
    assert.ok(!odd.includes(seeded.alice.session_id));
  });

  it("one session's timeline and its explain block", async () => {
    const page = await contexts.at(-1).newPage();
    await page.goto(`${ORIGIN}/admin/ui/sessions`);
    await Promise.all([
      page.waitForURL(/\/admin\/ui\/sessions\/ses_/),
      page.click(`a:text("${seeded.alice.session_id}")`),
    ]);
    const text = await page.textContent("main");
    assert.match(text, /Hello! Can you summarise my notes\?/);
    assert.match(text, /echo: And the action items, please\./);
    assert.match(text, /A message now:\s*append/);
    assert.match(text, /idle 90 min, daily at 04:00 Europe\/Berlin/);
    assert.match(text, /session\.started/);
    await shot(page, "05-session-timeline");
  });

  it("failed runs, deliveries and events, each with a retry button; an event retried", async () => {
    const page = await contexts.at(-1).newPage();
    await page.goto(`${ORIGIN}/admin/ui/failed`);
    const text = await page.textContent("main");
    assert.ok(text.includes(seeded.failedEventId));
    assert.ok(text.includes(seeded.failedDeliveryId));
    assert.ok(text.includes(seeded.failedRun.session_id));
    assert.equal(await page.locator('form[action^="/admin/ui/retry/"] button').count(), 3);
    await shot(page, "06-failed");
    const before = hookIds.filter((id) => id === seeded.failedEventId).length;
    await Promise.all([
      page.waitForURL(/notice=/),
      page.click(`form[action="/admin/ui/retry/event/${seeded.failedEventId}"] button`),
    ]);
    assert.match(await page.textContent(".notice"), new RegExp(`Retried event ${seeded.failedEventId}`));
    await shot(page, "07-failed-after-retry");
    await until(
      "the retried event delivered",
      () => hookIds.filter((id) => id === seeded.failedEventId).length > before,
    );
    await page.goto(`${ORIGIN}/admin/ui/failed`);
    assert.ok(!(await page.textContent("main")).includes(seeded.failedEventId));
  });

  it("a POST without the CSRF token is refused", async () => {
    const page = await contexts.at(-1).newPage();
    await page.goto(`${ORIGIN}/admin/ui/failed`);
    const form = `form[action^="/admin/ui/retry/delivery/"]`;
    await page.locator(`${form} input[name="csrf"]`).evaluate((input) => input.remove());
    const [response] = await Promise.all([page.waitForNavigation(), page.click(`${form} button`)]);
    assert.equal(response.status(), 403);
    assert.match(await page.textContent("main"), /did not carry this session's CSRF token/);
    await shot(page, "08-csrf-refused");
    // The same from outside the page: the browser's cookie, no token.
    const direct = await contexts.at(-1).request.post(`${ORIGIN}/admin/ui/retry/event/${seeded.failedEventId}`, {
      form: { back: "/admin/ui/failed" },
      maxRedirects: 0,
    });
    assert.equal(direct.status(), 403);
  });

  it("the metrics", async () => {
    const page = await contexts.at(-1).newPage();
    await page.goto(`${ORIGIN}/admin/ui/metrics`);
    const text = await page.textContent("main");
    for (const counter of ["messages_routed", "sessions_ended", "events_failed", "d1_rows_written_ingress"]) {
      assert.ok(text.includes(counter), counter);
    }
    await shot(page, "09-metrics");
  });

  it("works with JavaScript off: sign in, filter, a session, a retry, sign out", async () => {
    const context = await browserContext("nojs", { javaScriptEnabled: false });
    const page = await context.newPage();
    await signIn(page);
    assert.equal(new URL(page.url()).pathname, "/admin/ui/sessions");
    await page.selectOption('select[name="state"]', "open");
    await Promise.all([page.waitForURL(/state=open/), page.click('form.filters button[type="submit"]')]);
    assert.ok(!(await page.textContent("main table")).includes(seeded.ended.session_id));
    await page.goto(`${ORIGIN}/admin/ui/sessions/${seeded.odd.session_id}`);
    assert.match(await page.textContent("main"), /generic:dm:a%3Ab/);
    assert.match(await page.textContent("main"), /A message now:/);
    await shot(page, "10-no-javascript-session");
    await page.goto(`${ORIGIN}/admin/ui/failed`);
    await Promise.all([page.waitForURL(/notice=/), page.click(`form[action^="/admin/ui/retry/run/"] button`)]);
    assert.ok(await page.locator(".notice").count(), "the retry's outcome is shown");
    await shot(page, "11-no-javascript-retry");
    await Promise.all([page.waitForURL(/\/admin$/), page.click('header form button[type="submit"]')]);
    assert.equal((await context.cookies()).filter((c) => c.name === "sessiongate_admin").length, 0);
  });

  it("GET /openapi.json is a valid OpenAPI 3.1 document", async () => {
    const response = await fetch(`${ORIGIN}/openapi.json`);
    assert.equal(response.status, 200);
    const result = await validateOpenApi(await response.json());
    assert.deepEqual(result.errors, null);
    assert.equal(result.valid, true);
    assert.equal(result.version, "3.1");
  });
});
