/**
 * The sweep (the Cron Trigger's backstop, src/sweep.ts): it ends sessions whose
 * routing object missed their deadline (after a grace), reaps live sessions whose
 * external run vanished (`orphan_reap`, or `cron_complete` for a scheduled job),
 * deletes old dedupe marks, and its cost does not grow with the sessions that are
 * not due.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { dayOf } from "../src/db/sql-lists";
import { metrics, resetMetrics } from "../src/metrics";
import { RUN_LEASE_MS } from "../src/routing/router";
import { DEDUPE_DAYS_KEPT, SWEEP_GRACE_MS, sweep } from "../src/sweep";
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
} from "./helpers";

const HOOK = "https://hooks.test/sweep";
const AGENT = "https://agent.test/run";
const AGENT_TOKEN = "agent-token-for-sweep-tests";
const IDLE_60 = JSON.stringify({ mode: "idle", idle_minutes: 60 });
const DEADLINE = T0 + 60 * MINUTE + 1; // of a session last active at T0
const DAY = 24 * HOUR;

let calls: Captured[];
let restoreFetch: () => void;
let unexpected: string[];

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: IDLE_60, AGENT_URL: AGENT, AGENT_TOKEN });
  unexpected = [];
  const captured = captureFetch((request) => {
    if (request.url === AGENT) return new Response(null, { status: 202 });
    if (request.url === HOOK) return new Response("ok");
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

const forget = (key: string) => adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
const sweepNow = () => sweep(env, Date.now());

function post(path: string, token: string, body: unknown): Promise<Response> {
  return exports.default.fetch(
    new Request(`${BASE}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
    }),
  );
}

/** The agent requests for one key, in order. */
const agentRuns = (key: string) => calls.filter((c) => c.url === AGENT && c.json?.session?.key === key);

/** One message handed to the external agent at the current time, which answers 202. */
async function externalRun(chat: string, text = "work") {
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text });
  await runAlarm(key);
  const run = agentRuns(key).at(-1)!.json;
  expect(run.message.text).toBe(text);
  return { key, sessionId: sent.body.session_id as string, runId: run.run_id as string, runToken: run.run_token };
}

describe("deadlines the routing object missed", () => {
  it("ends a forgotten live session once its deadline passed more than SWEEP_GRACE_MS ago, and not before", async () => {
    useConfig({ SESSION_RESET: IDLE_60 }); // the echo agent
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    await forget(key);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null, sweep_at: DEADLINE });

    setNow(DEADLINE + 1); // past the deadline, within the grace
    await sweepNow();
    setNow(DEADLINE + SWEEP_GRACE_MS - 1);
    await sweepNow();
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null, ended_at: null });

    const sweptAt = DEADLINE + SWEEP_GRACE_MS;
    setNow(sweptAt);
    await sweepNow();
    const row = (await sessionRow(sent.body.session_id))!;
    expect(row.end_reason).toBe("idle");
    expect(row.ended_at).toBeGreaterThanOrEqual(DEADLINE);
    expect(row.ended_at).toBeLessThanOrEqual(sweptAt);
    expect(row.sweep_at).toBeNull();
    // The next message starts a fresh session in its place.
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(sent.body.session_id);
    expect(await sessionRow(next.body.session_id)).toMatchObject({
      end_reason: null,
      previous_session_id: sent.body.session_id,
      reset_reason: "idle",
    });
  });

  it("a session whose activity moved its deadline is judged on its real last activity, not a stale sweep_at", async () => {
    useConfig({ SESSION_RESET: IDLE_60 });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    setNow(T0 + 30 * MINUTE);
    await send({ chat_id: chat });
    await runAlarm(key);
    await forget(key);
    setNow(DEADLINE + SWEEP_GRACE_MS);
    await sweepNow();
    const row = (await sessionRow(sent.body.session_id))!;
    expect(row.end_reason).toBeNull();
    expect(row.sweep_at).toBe(T0 + 90 * MINUTE + 1);
    setNow(T0 + 90 * MINUTE + 1 + SWEEP_GRACE_MS);
    await sweepNow();
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
  });

  it("a session that is not yet due is untouched", async () => {
    useConfig({ SESSION_RESET: IDLE_60 });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    await forget(key);
    const before = await sessionRow(sent.body.session_id);
    expect(before).toMatchObject({ end_reason: null });
    for (const at of [T0 + 30 * MINUTE, DEADLINE - 1]) {
      setNow(at);
      await sweepNow();
      expect(await sessionRow(sent.body.session_id)).toEqual(before);
    }
    // And the next message still goes to it.
    expect((await send({ chat_id: chat })).body.session_id).toBe(sent.body.session_id);
  });
});

describe("runs whose owner vanished", () => {
  it("an external run that answered 202 and never heartbeats is reaped by the sweep as orphan_reap after RUN_LEASE_MS", async () => {
    const chat = unique("chat");
    const { key, sessionId, runId, runToken } = await externalRun(chat);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null, sweep_at: T0 + RUN_LEASE_MS });

    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS - 1);
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });

    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS);
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "orphan_reap" });
    // The vanished run no longer owns the session.
    const heartbeat = await post(`/v1/runs/${runId}/heartbeat`, runToken, {});
    expect(heartbeat.status).toBe(409);
    expect(await heartbeat.json()).toEqual({ owns: false, reason: "session_ended" });

    // Recoverable: the next message within policy reopens the same session, transcript kept.
    setNow(T0 + 20 * MINUTE);
    const next = await send({ chat_id: chat, text: "still there?" });
    expect(next.body.session_id).toBe(sessionId);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null, ended_at: null });
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["work", "still there?"]);
    await runAlarm(key);
    expect(agentRuns(key).at(-1)!.json.session).toMatchObject({ id: sessionId, is_new: false });
  });

  it("a reaped session whose entry was forgotten is promoted to idle by the sweep once its deadline passes, and finalizes once", async () => {
    const chat = unique("chat");
    const { key, sessionId } = await externalRun(chat);
    await forget(key);
    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS);
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "orphan_reap" });
    setNow(DEADLINE - 1); // still within its policy: it stays recoverable
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "orphan_reap", sweep_at: DEADLINE });
    setNow(DEADLINE + SWEEP_GRACE_MS);
    await sweepNow();
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "idle", sweep_at: null });
    const { results } = await env.DB.prepare(
      `SELECT reason FROM events WHERE session_id = ? AND type = 'session.finalized'`,
    )
      .bind(sessionId)
      .all();
    expect(results).toEqual([{ reason: "idle" }]);
  });

  it("the routing object's alarm reaps at the end of the lease too, not before", async () => {
    const chat = unique("chat");
    const { key, sessionId } = await externalRun(chat);
    setNow(T0 + RUN_LEASE_MS - 1);
    await runAlarm(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
    setNow(T0 + RUN_LEASE_MS);
    await runAlarm(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "orphan_reap" });
  });

  it("a heartbeat within the lease keeps the session alive past the first lease; silence after it reaps", async () => {
    const chat = unique("chat");
    const { key, sessionId, runId, runToken } = await externalRun(chat);
    setNow(T0 + 8 * MINUTE);
    const heartbeat = await post(`/v1/runs/${runId}/heartbeat`, runToken, {});
    expect(heartbeat.status).toBe(200);
    expect(await heartbeat.json()).toEqual({ owns: true });

    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS + 1);
    await sweepNow();
    await runAlarm(key);
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
    expect((await post(`/v1/runs/${runId}/heartbeat`, runToken, {})).status).toBe(200);

    // That heartbeat (at T0 + 11 min) is the last: the lease runs out RUN_LEASE_MS later.
    const lastHeard = Date.now();
    setNow(lastHeard + RUN_LEASE_MS - 1);
    await sweepNow(); // the row is due for a look (sweep_at from the first heartbeat), but its lease holds
    await runAlarm(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
    setNow(lastHeard + RUN_LEASE_MS + SWEEP_GRACE_MS);
    await sweepNow();
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "orphan_reap" });
  });

  it("a cron session whose agent answered 202 and never came back is ended as cron_complete by the sweep after the lease", async () => {
    const jobId = unique("job");
    const response = await post(`/v1/cron/runs`, AGENT_TOKEN, { job_id: jobId, text: "nightly report" });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { run_id: string; session_id: string; session_key: string };
    expect(body.session_key).toBe(`cron:${jobId}:${body.run_id}`);
    await runAlarm(body.session_key);
    const [run] = agentRuns(body.session_key);
    expect(run!.json).toMatchObject({
      run_id: body.run_id,
      session: { id: body.session_id, key: body.session_key, is_new: true },
      message: { text: "nightly report" },
    });
    expect(await sessionRow(body.session_id)).toMatchObject({ end_reason: null });

    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS - 1);
    await sweepNow();
    expect(await sessionRow(body.session_id)).toMatchObject({ end_reason: null });

    setNow(T0 + RUN_LEASE_MS + SWEEP_GRACE_MS);
    await sweepNow();
    expect(await sessionRow(body.session_id)).toMatchObject({ end_reason: "cron_complete", sweep_at: null });
    const { results } = await env.DB.prepare(
      `SELECT type, reason FROM events WHERE session_id = ? AND type = 'session.finalized'`,
    )
      .bind(body.session_id)
      .all();
    expect(results).toEqual([{ type: "session.finalized", reason: "cron_complete" }]);
    // Its run may no longer act.
    const late = await post(`/v1/runs/${body.run_id}/reply`, run!.json.run_token, { text: "too late" });
    expect(late.status).toBe(409);
  });
});

describe("dedupe marks", () => {
  it(`deletes marks of days older than the ${DEDUPE_DAYS_KEPT} kept and keeps the recent ones`, async () => {
    const key = genericKey(unique("chat"));
    const now = T0 + 40 * DAY;
    const today = dayOf(now);
    const ages = [0, 1, 2, 3, 4, 10];
    await env.DB.batch(
      ages.map((age) =>
        env.DB.prepare(
          `INSERT INTO inbound_events (day, platform, event_id, session_key, session_id, run_id, received_at)
            VALUES (?, 'generic', ?, ?, NULL, NULL, ?)`,
        ).bind(today - age, `${key}-evt-${age}`, key, now - age * DAY),
      ),
    );
    setNow(now);
    await sweepNow();
    const { results } = await env.DB.prepare(`SELECT day FROM inbound_events WHERE session_key = ? ORDER BY day DESC`)
      .bind(key)
      .all<{ day: number }>();
    expect(results.map((r) => today - r.day)).toEqual([0, 1, 2]);
    expect(DEDUPE_DAYS_KEPT).toBe(3);
  });

  it("a platform retry 23 hours later, after a sweep, is still a duplicate", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }) });
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "once" });
    await runAlarm(genericKey(chat));
    setNow(T0 + 23 * HOUR); // the next UTC day
    await sweepNow();
    const retry = await send({ chat_id: chat, text: "once", event_id: first.eventId });
    expect(retry.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["once", "echo: once"]);
  });
});

describe("cost", () => {
  it("the sweep's D1 rows read do not grow with the number of sessions that are not due", async () => {
    useConfig({ SESSION_RESET: IDLE_60, HOOK_URLS: HOOK, HOOK_SECRET: "s" });
    const at = T0 + 100 * DAY;
    setNow(at);
    // Settle everything earlier tests of this file left due, so only what follows is measured.
    for (let i = 0; i < 50; i++) {
      const report = await sweepNow();
      if (report.sessionsChecked === 0 && report.eventsAttempted === 0 && report.failures === 0) break;
    }
    resetMetrics();
    const idle = await sweepNow();
    const baseline = metrics.d1_rows_read;
    expect(idle).toEqual({ sessionsChecked: 0, eventsAttempted: 0, failures: 0 });

    const ids: string[] = [];
    for (let i = 0; i < 30; i++) {
      const chat = unique("chat");
      ids.push((await send({ chat_id: chat })).body.session_id);
      await runAlarm(genericKey(chat));
    }
    setNow(at + 30 * MINUTE); // all 30 live, none due
    resetMetrics();
    const report = await sweepNow();
    expect(report).toEqual({ sessionsChecked: 0, eventsAttempted: 0, failures: 0 });
    expect(metrics.d1_rows_read).toBe(baseline);
    for (const id of ids) expect(await sessionRow(id)).toMatchObject({ end_reason: null });
    // Thirty messages and alarms: on a loaded machine this takes longer than the default 5 s.
  }, 30_000);
});
