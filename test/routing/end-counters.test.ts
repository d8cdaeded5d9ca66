/**
 * `sessions_ended` in `GET /admin/metrics` (spec "Operator API": counters keyed by
 * reason), as an operator reads it: every end is counted once, under its own reason,
 * whichever path ends it (the alarm's policy, an operator, the agent, a vanished
 * owner's lease), and an end that did not happen (already ended, or a race lost to
 * another writer) is not counted.
 */
import { afterEach, beforeEach, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import {
  AGENT_TOKEN,
  accepted,
  agentApi,
  agentConfig,
  dispatchedThrough,
  fakeServices,
  replyWith,
} from "../agent/support";
import {
  MINUTE,
  T0,
  adminFetch,
  alarmOf,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";

let services: ReturnType<typeof fakeServices>;
let answer: () => Response;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
  answer = () => replyWith("ok");
  services = fakeServices(() => answer());
});
afterEach(() => {
  injectD1Fault(null);
  services.restore();
  restoreClock();
  useConfig(null);
});

/** The `sessions_ended` counters an operator reads now. */
async function ended(): Promise<Record<string, number>> {
  return ((await (await adminFetch("/admin/metrics")).json()) as { sessions_ended: Record<string, number> })
    .sessions_ended;
}

/** How each counter moved while `step` ran (only those that moved). */
async function counted(step: () => Promise<unknown>): Promise<Record<string, number>> {
  const before = await ended();
  await step();
  const after = await ended();
  return Object.fromEntries(
    Object.entries(after)
      .map(([reason, n]) => [reason, n - (before[reason] ?? 0)] as const)
      .filter(([, moved]) => moved !== 0),
  );
}

/** A key with one answered message; its session expires 60 idle minutes later (the alarm comes just after). */
async function answered(chat: string) {
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "hello" });
  await runAlarm(key);
  return { key, sessionId: sent.body.session_id as string };
}

it("the alarm ending a session by its policy counts idle once; the alarm coming again counts nothing", async () => {
  const { key, sessionId } = await answered(unique("chat"));
  setNow(T0 + 60 * MINUTE + 1);
  expect(await counted(() => runAlarm(key))).toEqual({ idle: 1 });
  expect(await sessionRow(sessionId)).toMatchObject({ end_reason: "idle" });
  expect(await counted(() => runAlarm(key))).toEqual({});
});

it("an alarm whose end lost the race to another writer (the activity moved) counts nothing, and the session lives", async () => {
  const { key, sessionId } = await answered(unique("chat"));
  const late = T0 + 60 * MINUTE + 1;
  setNow(late);
  const slipped = injectD1Fault({
    match: (sql) => sql.some((s) => s.includes("SET end_reason = ?, ended_at = COALESCE")),
    before: (db) => db.prepare(`UPDATE sessions SET last_active_at = ? WHERE id = ?`).bind(late, sessionId).run(),
  });
  expect(await counted(() => runAlarm(key))).toEqual({});
  expect(slipped.hits()).toBe(1);
  expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
});

it("an operator's end counts admin once; ending it again counts nothing", async () => {
  const { sessionId } = await answered(unique("chat"));
  const end = () => adminFetch(`/admin/sessions/${sessionId}/end`, { method: "POST" });
  expect(await counted(end)).toEqual({ admin: 1 });
  expect(await counted(end)).toEqual({});
});

it("the agent's end counts agent_close once", async () => {
  answer = accepted;
  const run = await dispatchedThrough(services, unique("chat"));
  const end = () => agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, {});
  expect(await counted(end)).toEqual({ agent_close: 1 });
  expect(await counted(end)).toEqual({});
});

it("a run accepted (202) that falls silent past its lease is reaped: orphan_reap once", async () => {
  answer = accepted;
  const chat = unique("chat");
  const run = await dispatchedThrough(services, chat);
  const key = genericKey(chat);
  expect(await alarmOf(key)).toBe(T0 + RUN_LEASE_MS);
  setNow(T0 + RUN_LEASE_MS);
  expect(await counted(() => runAlarm(key))).toEqual({ orphan_reap: 1 });
  // A reaped row stays recoverable until its policy deadline (60 idle minutes), when it is promoted for good.
  expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "orphan_reap", sweep_at: T0 + 60 * MINUTE + 1 });
  setNow(T0 + 60 * MINUTE + 1);
  expect(await counted(() => runAlarm(key))).toEqual({ idle: 1 });
  expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle", sweep_at: null });
});

it("a scheduled job's run accepted (202) that falls silent ends as cron_complete once, with nothing left to look at", async () => {
  answer = accepted;
  const job = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "nightly", text: "summarise the day" });
  const { session_id, session_key } = job.body;
  await runAlarm(session_key);
  expect(await alarmOf(session_key)).toBe(T0 + RUN_LEASE_MS);
  setNow(T0 + RUN_LEASE_MS);
  expect(await counted(() => runAlarm(session_key))).toEqual({ cron_complete: 1 });
  expect(await sessionRow(session_id)).toMatchObject({ end_reason: "cron_complete", sweep_at: null });
  expect(await alarmOf(session_key)).toBeNull();
});
