/**
 * Spec invariant 7, "finalize exactly once": whichever path ends a session with a
 * finalizing reason (alarm, routed message, recovery, command, agent, operator,
 * sweep), D1 holds exactly one `session.finalized` row for it and a hook receiver
 * gets exactly one successful delivery of it, however often the alarm and the
 * sweep run afterwards. A recoverable end (`agent_close`) finalizes only when the
 * policy later promotes it, and not at all when the session is reopened.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SWEEP_GRACE_MS, sweep } from "../../src/sweep";
import {
  BASE,
  HOUR,
  MINUTE,
  T0,
  adminFetch,
  captureFetch,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const HOOK = "https://hooks.test/receiver";
const AGENT = "https://agent.test/run";
const AGENT_TOKEN = "agent-token-for-tests";
const IDLE_60 = JSON.stringify({ mode: "idle", idle_minutes: 60 });
const DEADLINE = T0 + 60 * MINUTE + 1; // of a session last active at T0

const BASE_CONFIG = { SESSION_RESET: IDLE_60, HOOK_URLS: HOOK, HOOK_SECRET: "hook-secret" };
const AGENT_CONFIG = { ...BASE_CONFIG, AGENT_URL: AGENT, AGENT_TOKEN };

let calls: Captured[];
let restoreFetch: () => void;
let unexpected: string[];
/** How the external agent answers a run (202 by default). */
let agentAnswer: (request: Captured) => Response;

beforeEach(() => {
  setNow(T0);
  useConfig(BASE_CONFIG);
  unexpected = [];
  agentAnswer = () => new Response(null, { status: 202 });
  const captured = captureFetch((request) => {
    if (request.url === HOOK) return new Response("ok");
    if (request.url === AGENT) return agentAnswer(request);
    unexpected.push(request.url);
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
  calls = captured.calls;
  restoreFetch = captured.restore;
});
afterEach(() => {
  restoreFetch();
  restoreClock();
  useConfig(null);
  expect(unexpected).toEqual([]);
});

async function finalizedRows(sessionId: string): Promise<{ id: string; reason: string; status: string }[]> {
  const { results } = await env.DB.prepare(
    `SELECT id, reason, status FROM events WHERE session_id = ? AND type = 'session.finalized'`,
  )
    .bind(sessionId)
    .all<{ id: string; reason: string; status: string }>();
  return results;
}

/** Successful (the receiver answers 200) hook deliveries of `type` for the session. */
const delivered = (type: string, sessionId: string) =>
  calls.filter((c) => c.url === HOOK && c.json?.type === type && c.json?.session_id === sessionId);

/** Exactly one finalized row in D1 and exactly one delivery of it, with `reason`. */
async function expectFinalizedOnce(sessionId: string, reason: string): Promise<void> {
  const rows = await finalizedRows(sessionId);
  expect(rows.map((r) => [r.id, r.reason, r.status])).toEqual([[`ev_${sessionId}_finalized`, reason, "sent"]]);
  const hooks = delivered("session.finalized", sessionId);
  expect(hooks).toHaveLength(1);
  expect(hooks[0]!.json).toMatchObject({ id: `ev_${sessionId}_finalized`, reason, session_id: sessionId });
  expect(Array.isArray(hooks[0]!.json.transcript)).toBe(true);
}

async function expectNeverFinalized(sessionId: string): Promise<void> {
  expect(await finalizedRows(sessionId)).toEqual([]);
  expect(delivered("session.finalized", sessionId)).toEqual([]);
}

/**
 * Every repeat that could finalize a second time: the alarm twice, the sweep, then
 * hours later (every deadline and grace long past) the alarm and the sweep again.
 */
async function repeatEverything(key: string): Promise<void> {
  await runAlarm(key);
  await runAlarm(key);
  await sweep(env, Date.now());
  setNow(Date.now() + 3 * HOUR);
  await runAlarm(key);
  await runAlarm(key);
  await sweep(env, Date.now());
  await runAlarm(key);
  setNow(Date.now() + SWEEP_GRACE_MS + 1);
  await sweep(env, Date.now());
  await runAlarm(key);
}

const forget = (key: string) => adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });

/** The agent requests captured for one session key. */
const agentRuns = (key: string) => calls.filter((c) => c.url === AGENT && c.json?.session?.key === key);

function agentApi(path: string, token: string, body: unknown): Promise<Response> {
  return exports.default.fetch(
    new Request(`${BASE}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
    }),
  );
}

/** One message handed to the external agent (202); its run id and token as the agent received them. */
async function startExternalRun(chat: string): Promise<{ sessionId: string; runId: string; runToken: string }> {
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "work" });
  await runAlarm(key);
  const runs = agentRuns(key);
  expect(runs).toHaveLength(1);
  expect(runs[0]!.headers.authorization).toBe(`Bearer ${AGENT_TOKEN}`);
  const { run_id: runId, run_token: runToken, session } = runs[0]!.json;
  expect(session.id).toBe(sent.body.session_id);
  return { sessionId: sent.body.session_id, runId, runToken };
}

describe("exactly one session.finalized per finalizing end, whichever path ended it", () => {
  it("(a) idle expiry by the alarm, with no message", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    expect(await finalizedRows(sent.body.session_id)).toEqual([]);
    setNow(DEADLINE);
    expect(await runAlarm(key)).toBe(true);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle", ended_at: DEADLINE });
    await expectFinalizedOnce(sent.body.session_id, "idle");
    await repeatEverything(key);
    await expectFinalizedOnce(sent.body.session_id, "idle");
  });

  it("(b) a routed message after the deadline, before the alarm ran", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 61 * MINUTE);
    const late = await send({ chat_id: chat, text: "two" });
    expect(late.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    await runAlarm(key);
    await expectFinalizedOnce(first.body.session_id, "idle");
    const finalized = delivered("session.finalized", first.body.session_id)[0]!.json;
    expect(finalized.transcript.map((l: { text: string }) => l.text)).toEqual(["one", "echo: one"]);
    await repeatEverything(key);
    await expectFinalizedOnce(first.body.session_id, "idle");
    // The session that replaced it expired during the repeats: it finalized once too.
    await expectFinalizedOnce(late.body.session_id, "idle");
  });

  it("(c) recovery: the entry was forgotten and the newest row is expired", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    expect((await forget(key)).status).toBe(200);
    setNow(T0 + 2 * HOUR);
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    await runAlarm(key);
    await expectFinalizedOnce(first.body.session_id, "idle");
    await forget(key);
    await repeatEverything(key);
    await expectFinalizedOnce(first.body.session_id, "idle");
  });

  it("(d) /new", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(command.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "new_command" });
    await runAlarm(key);
    await expectFinalizedOnce(first.body.session_id, "new_command");
    // A retried /new changes nothing.
    await send({ chat_id: chat, text: "/new", event_id: command.eventId });
    await repeatEverything(key);
    await expectFinalizedOnce(first.body.session_id, "new_command");
  });

  it("(e) /stop", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    await send({ chat_id: chat, text: "/stop" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "suspended" });
    await runAlarm(key);
    await expectFinalizedOnce(first.body.session_id, "suspended");
    // A second /stop finds nothing to stop.
    await send({ chat_id: chat, text: "/stop" });
    await repeatEverything(key);
    await expectFinalizedOnce(first.body.session_id, "suspended");
  });

  it("(f) the agent API end, by the session's current run", async () => {
    useConfig(AGENT_CONFIG);
    const chat = unique("chat");
    const key = genericKey(chat);
    const { sessionId, runToken } = await startExternalRun(chat);
    const end = await agentApi(`/v1/sessions/${sessionId}/end`, runToken, { reason: "admin" });
    expect(end.status).toBe(200);
    expect(await end.json()).toMatchObject({ changed: true, session: { id: sessionId, end_reason: "admin" } });
    await runAlarm(key);
    await expectFinalizedOnce(sessionId, "admin");
    // Ending again is answered with the row unchanged.
    const again = await agentApi(`/v1/sessions/${sessionId}/end`, runToken, { reason: "admin" });
    expect(again.status).toBe(200);
    expect(await again.json()).toMatchObject({ changed: false, session: { end_reason: "admin" } });
    await repeatEverything(key);
    await expectFinalizedOnce(sessionId, "admin");
  });

  it("(g) the operator end", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    const end = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, { method: "POST", body: "{}" });
    expect(end.status).toBe(200);
    expect(await end.json()).toMatchObject({ changed: true, session: { end_reason: "admin" } });
    await runAlarm(key);
    await expectFinalizedOnce(sent.body.session_id, "admin");
    const again = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, {
      method: "POST",
      body: JSON.stringify({ reason: "suspended" }),
    });
    expect(await again.json()).toMatchObject({ changed: false, session: { end_reason: "admin" } });
    await repeatEverything(key);
    await expectFinalizedOnce(sent.body.session_id, "admin");
  });

  it("(h) the sweep, for a session whose entry was forgotten", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    await forget(key);
    setNow(DEADLINE + SWEEP_GRACE_MS);
    await sweep(env, Date.now());
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
    expect(await finalizedRows(sent.body.session_id)).toHaveLength(1);
    await runAlarm(key);
    await expectFinalizedOnce(sent.body.session_id, "idle");
    await repeatEverything(key);
    await expectFinalizedOnce(sent.body.session_id, "idle");
  });

  it("(h') the sweep alone delivers the finalized event once, without the routing object's alarm", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    await forget(key);
    setNow(DEADLINE + SWEEP_GRACE_MS);
    await sweep(env, Date.now());
    setNow(Date.now() + SWEEP_GRACE_MS);
    await sweep(env, Date.now());
    await sweep(env, Date.now());
    await expectFinalizedOnce(sent.body.session_id, "idle");
    await repeatEverything(key);
    await expectFinalizedOnce(sent.body.session_id, "idle");
  });

  it("a cron session that completes (its run replied) finalizes once as cron_complete", async () => {
    useConfig(AGENT_CONFIG);
    agentAnswer = () => Response.json({ reply: "job done" });
    const response = await exports.default.fetch(
      new Request(`${BASE}/v1/cron/runs`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${AGENT_TOKEN}` },
        body: JSON.stringify({ job_id: unique("job"), text: "nightly" }),
      }),
    );
    expect(response.status).toBe(200);
    const { session_id: sessionId, session_key: key } = (await response.json()) as any;
    await runAlarm(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "cron_complete" });
    await runAlarm(key);
    await expectFinalizedOnce(sessionId, "cron_complete");
    await repeatEverything(key);
    await expectFinalizedOnce(sessionId, "cron_complete");
  });
});

describe("recoverable ends", () => {
  it("agent_close then a message: the same session reopens and nothing is finalized", async () => {
    useConfig(AGENT_CONFIG);
    const chat = unique("chat");
    const key = genericKey(chat);
    const { sessionId, runToken } = await startExternalRun(chat);
    const end = await agentApi(`/v1/sessions/${sessionId}/end`, runToken, { reason: "agent_close" });
    expect(end.status).toBe(200);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "agent_close" });
    await runAlarm(key);
    // session.ended is sent for the recoverable end too.
    const ended = delivered("session.ended", sessionId);
    expect(ended.map((c) => c.json.reason)).toEqual(["agent_close"]);
    expect(ended[0]!.json).toMatchObject({ recoverable: true });

    setNow(T0 + 5 * MINUTE);
    const next = await send({ chat_id: chat, text: "again" });
    expect(next.body.session_id).toBe(sessionId);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null, ended_at: null });
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["work", "again"]);
    await runAlarm(key);
    await runAlarm(key);
    await sweep(env, Date.now());
    await runAlarm(key);
    await expectNeverFinalized(sessionId);
  });

  it("agent_close then the deadline: the alarm promotes it to idle and it finalizes once", async () => {
    useConfig(AGENT_CONFIG);
    const chat = unique("chat");
    const key = genericKey(chat);
    const { sessionId, runToken } = await startExternalRun(chat);
    const end = await agentApi(`/v1/sessions/${sessionId}/end`, runToken, {});
    expect(end.status).toBe(200);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "agent_close", ended_at: T0 });
    await runAlarm(key);
    await expectNeverFinalized(sessionId);

    setNow(DEADLINE - 1);
    await runAlarm(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "agent_close" });
    await expectNeverFinalized(sessionId);

    setNow(DEADLINE);
    expect(await runAlarm(key)).toBe(true);
    // Promoted by the alarm itself (no message, no sweep); it keeps the time it was released.
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "idle", ended_at: T0 });
    await expectFinalizedOnce(sessionId, "idle");
    expect(delivered("session.ended", sessionId).map((c) => c.json.reason)).toEqual(["agent_close", "idle"]);

    await runAlarm(key);
    await runAlarm(key);
    await sweep(env, Date.now());
    setNow(Date.now() + 2 * SWEEP_GRACE_MS);
    await sweep(env, Date.now());
    await repeatEverything(key);
    await expectFinalizedOnce(sessionId, "idle");
  });

  it("a rotation never finalizes the parent; the continuation finalizes once when it ends", async () => {
    useConfig(AGENT_CONFIG);
    const chat = unique("chat");
    const key = genericKey(chat);
    const { sessionId, runToken } = await startExternalRun(chat);
    const rotated = await agentApi(`/v1/sessions/${sessionId}/rotate`, runToken, { reason: "compression" });
    expect(rotated.status).toBe(200);
    const continuation = ((await rotated.json()) as any).session_id as string;
    expect(continuation).not.toBe(sessionId);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "compression" });
    await runAlarm(key);
    const end = await adminFetch(`/admin/sessions/${continuation}/end`, { method: "POST", body: "{}" });
    expect(end.status).toBe(200);
    await repeatEverything(key);
    await expectNeverFinalized(sessionId);
    await expectFinalizedOnce(continuation, "admin");
  });
});
