/**
 * The agent API between the worker's check and the routing object's own read (spec
 * "The D1 contract": operators edit the tables by hand). The worker finds the run and
 * its session before it calls the object, but an operator's SQL can land after that
 * check and before the object reads them again under its lock; `injectD1Fault`'s
 * `before` runs it exactly there. A row gone by then is a 404 with the error shape
 * naming what is missing, never a server error, and nothing reaches the chat. Also
 * here: a rotation whose batch cannot start the continuation, what D1 work a reply
 * costs, and progress of a scheduled job's run, whose platform has nowhere to deliver.
 */
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { MINUTE, T0, genericKey, runAlarm, send, sessionRow, sessionsOfKey, setNow, unique } from "../helpers";
import { AGENT_TOKEN, accepted, agentApi, agentTestHooks, dispatchedThrough } from "./support";

const agent = agentTestHooks();

/** Another writer's SQL: the session row removed by hand. */
const deleteSession = (sessionId: string) => (db: D1Database) =>
  db.prepare(`DELETE FROM sessions WHERE id = ?`).bind(sessionId).run();

/** A batch reading a run with the session it belongs to (the worker's check of a run route, then the object's read). */
const readsRunWithSession = (sql: readonly string[]) =>
  sql.some((s) => s.includes("WHERE id = (SELECT session_id FROM runs WHERE id = ?)"));

/** A batch reading a run and a session by their ids together: only the object's read on the session routes. */
const readsRunAndSession = (sql: readonly string[]) =>
  sql.some((s) => /from "runs" where "runs"\."id" = \?$/i.test(s)) &&
  sql.some((s) => /from "sessions" where "sessions"\."id" = \?$/i.test(s));

/** `write` just before the `nth` batch that `match` accepts. */
function beforeNth(
  nth: number,
  match: (sql: readonly string[]) => boolean,
  write: (db: D1Database) => Promise<unknown>,
) {
  let seen = 0;
  return injectD1Fault({ match: (sql) => match(sql) && ++seen === nth, before: write });
}

const notFound = (message: string) => ({ status: 404, body: { error: { code: "not_found", message } } });

describe("a session row deleted by SQL after the worker's check, before the object's read", () => {
  it("a run API reply is 404 not_found naming the run, and nothing is sent", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    const slipped = beforeNth(2, readsRunWithSession, deleteSession(run.sessionId));
    const replied = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    expect(slipped.hits()).toBe(1);
    expect(replied).toEqual(notFound(`no run ${run.runId}`));
    await runAlarm(genericKey(chat));
    expect(agent.services.replies()).toEqual([]);
  });

  it("progress is 404 not_found naming the run, and nothing is sent", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    const slipped = beforeNth(2, readsRunWithSession, deleteSession(run.sessionId));
    const progress = await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "working on it" });
    expect(slipped.hits()).toBe(1);
    expect(progress).toEqual(notFound(`no run ${run.runId}`));
    expect(agent.services.replies()).toEqual([]);
  });

  it("the run ending its session is 404 not_found naming the session", async () => {
    const run = await dispatchedThrough(agent.services, unique("chat"));
    const slipped = beforeNth(1, readsRunAndSession, deleteSession(run.sessionId));
    const ended = await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "agent_close" });
    expect(slipped.hits()).toBe(1);
    expect(ended).toEqual(notFound(`no session ${run.sessionId}`));
  });

  it("the run rotating its session is 404 not_found naming the session, and no continuation is started", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    const slipped = beforeNth(1, readsRunAndSession, deleteSession(run.sessionId));
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(slipped.hits()).toBe(1);
    expect(rotated).toEqual(notFound(`no session ${run.sessionId}`));
    const rows = await env.DB.prepare(`SELECT id FROM sessions WHERE session_key = ?`).bind(genericKey(chat)).all();
    expect(rows.results).toEqual([]);
  });
});

describe("a session row deleted by SQL just after the object read the run and its session", () => {
  it("a run API reply is 409 session_ended, as when the row goes just before the reply's batch, and nothing is sent", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    // The first batch after the object's own read (the worker's check is the first read).
    let reads = 0;
    const slipped = injectD1Fault({
      match: (sql) => reads === 2 || (readsRunWithSession(sql) && ++reads > 2),
      before: deleteSession(run.sessionId),
    });
    const replied = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    expect(slipped.hits()).toBe(1);
    expect(replied).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    await runAlarm(genericKey(chat));
    expect(agent.services.replies()).toEqual([]);
  });
});

// The runs table is not the contract's, but a row removed by hand is still an unknown id.
describe("a run row deleted by SQL after the worker's check, before the object's read", () => {
  const deleteRun = (runId: string) => (db: D1Database) =>
    db.prepare(`DELETE FROM runs WHERE id = ?`).bind(runId).run();

  it("the run ending its session is 404 not_found, and the session stays live", async () => {
    const run = await dispatchedThrough(agent.services, unique("chat"));
    const slipped = beforeNth(1, readsRunAndSession, deleteRun(run.runId));
    const ended = await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "agent_close" });
    expect(slipped.hits()).toBe(1);
    expect(ended).toEqual(notFound(`no session ${run.sessionId}`));
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
  });

  it("the run rotating its session is 404 not_found, and the session stays live", async () => {
    const run = await dispatchedThrough(agent.services, unique("chat"));
    const slipped = beforeNth(1, readsRunAndSession, deleteRun(run.runId));
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(slipped.hits()).toBe(1);
    expect(rotated).toEqual(notFound(`no session ${run.sessionId}`));
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
  });
});

describe("a rotation whose batch ends the session but cannot start the continuation", () => {
  it("when an operator made an older row of the key its newest (started_at): 409 session_ended, and no continuation row", async () => {
    agent.answerWith(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await dispatchedThrough(agent.services, chat, "hello");
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "/new" });
    const run = await dispatchedThrough(agent.services, chat, "again");
    expect(run.sessionId).not.toBe(first.sessionId);
    // By hand: the first row now starts after the live one, so the key's newest row is an ended one.
    await env.DB.prepare(`UPDATE sessions SET started_at = ? WHERE id = ?`)
      .bind(T0 + 2 * MINUTE, first.sessionId)
      .run();
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(rotated).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect((await sessionsOfKey(key)).map((row) => row.id).sort()).toEqual([first.sessionId, run.sessionId].sort());
    const moved = await env.DB.prepare(`SELECT session_id FROM runs WHERE id = ?`).bind(run.runId).first();
    expect(moved).toEqual({ session_id: run.sessionId });
  });
});

describe("a session ended as compression by SQL between the rotation's read and its batch", () => {
  it("the operator's end wins (invariant 4): 409 session_ended, no continuation, the run stays", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await dispatchedThrough(agent.services, chat);
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("UPDATE runs SET session_id")),
      before: (db) =>
        db
          .prepare(`UPDATE sessions SET end_reason = 'compression', ended_at = ? WHERE id = ?`)
          .bind(T0, run.sessionId)
          .run(),
    });
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(slipped.hits()).toBe(1);
    expect(rotated).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect((await sessionsOfKey(key)).map((row) => row.id)).toEqual([run.sessionId]);
    const moved = await env.DB.prepare(`SELECT session_id FROM runs WHERE id = ?`).bind(run.runId).first();
    expect(moved).toEqual({ session_id: run.sessionId });
  });
});

// What a reply costs D1: a first reply does not look for an earlier one to restage, and
// a repeated one is refused without a write. A D1 that refuses exactly that read or
// that write shows it: the answer does not change.
describe("the D1 work of a run's reply", () => {
  /** The read of one delivery row by its id, alone in its batch (restaging an earlier reply). */
  const readsADelivery = (sql: readonly string[]) =>
    sql.length === 1 && sql[0]!.startsWith("SELECT * FROM deliveries WHERE id = ?");
  /** The batch that records a run's reply. */
  const recordsAReply = (sql: readonly string[]) => sql.some((s) => s.startsWith("UPDATE runs SET finished_at"));

  it("a first reply is recorded and sent without reading a delivery to restage", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    const refused = injectD1Fault({ match: readsADelivery, times: Infinity });
    const replied = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    expect(replied).toEqual({ status: 200, body: { recorded: true } });
    expect(refused.hits()).toBe(0);
    injectD1Fault(null);
    await runAlarm(genericKey(chat));
    expect(agent.services.replies().map((reply) => reply.text)).toEqual(["answer"]);
  });

  it("a repeated reply of a finished run is 409 finished without a write, and the first reply alone is sent", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat);
    expect(await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" })).toMatchObject({ status: 200 });
    const refused = injectD1Fault({ match: recordsAReply, times: Infinity });
    const again = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer again" });
    expect(again).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
    expect(refused.hits()).toBe(0);
    injectD1Fault(null);
    await runAlarm(genericKey(chat));
    expect(agent.services.replies().map((reply) => reply.text)).toEqual(["answer"]);
  });
});

describe("progress of a scheduled job's run", () => {
  it("owns its session but is not sent: the job's platform has nowhere to deliver", async () => {
    const job = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: unique("job"), text: "summarise the day" });
    await runAlarm(job.body.session_key);
    const { run_id, run_token } = agent.services.agentCalls().at(-1)!.json;
    const progress = await agentApi(`/v1/runs/${run_id}/progress`, run_token, { text: "halfway" });
    expect(progress).toEqual({ status: 200, body: { owns: true, sent: false } });
    expect(agent.services.replies()).toEqual([]);
    const rows = await env.DB.prepare(`SELECT id FROM deliveries WHERE session_id = ?`).bind(job.body.session_id).all();
    expect(rows.results).toEqual([]);
    expect(await sessionRow(job.body.session_id)).toMatchObject({ end_reason: null });
  });
});
