/**
 * Rows an operator deleted or edited by SQL (spec "The D1 contract": the tables are
 * part of the contract) under a routing object that is using them: a session row
 * deleted while the agent answers its run, or between the object's read and its
 * batch (as `another-writer.test.ts` slips writes in, through `injectD1Fault`'s
 * `before`), and a delivery row whose platform was changed to one the gateway has no
 * sender for. Each time the caller gets the spec's answer (404 with the error shape
 * for a row that is gone, 409 for a reply with nowhere to land), nothing reaches the
 * chat, the object does not fail over the missing row, and a delivery it cannot make
 * is dead-lettered where the operator sees why.
 */
import { env } from "cloudflare:workers";
import { describe, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { SWEEP_GRACE_MS, sweep } from "../../src/sweep";
import { REPLY_URL, agentApi, agentTestHooks, dispatchedThrough, replyWith } from "../agent/support";
import {
  HOUR,
  MINUTE,
  T0,
  adminFetch,
  genericKey,
  loggedLines,
  router,
  runAlarm,
  send,
  setNow,
  unique,
} from "../helpers";

const agent = agentTestHooks();

/** Another writer's SQL: the session row removed by hand. */
const deleteSession = (sessionId: string) => (db: D1Database) =>
  db.prepare(`DELETE FROM sessions WHERE id = ?`).bind(sessionId).run();

const answerOf = async (response: Response) => ({ status: response.status, body: await response.json() });
const post = (path: string) => adminFetch(path, { method: "POST" });
const metrics = async () => (await (await adminFetch(`/admin/metrics`)).json()) as any;

describe("a session row deleted by SQL while the agent answers its run", () => {
  it("the reply is dropped without an error: nothing sent, the hand-off not retried, the next message answered afresh", async () => {
    agent.answerWith(async (request) => {
      // The operator removes the row while the agent is composing its answer.
      if (request.json.message.text === "question") await deleteSession(request.json.session.id)(env.DB);
      return replyWith(`re: ${request.json.message.text}`);
    });
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "question" });
    await runAlarm(key);
    await router(key).drained();
    expect(agent.services.replies()).toEqual([]);
    expect(loggedLines(errors, "outbox item failed")).toEqual([]);
    // Nothing is left owed for the deleted session (no hand-off item retried for ever).
    expect(await router(key).outbox()).toEqual([]);

    setNow(T0 + MINUTE);
    await runAlarm(key);
    await router(key).drained();
    expect(agent.services.agentCalls()).toHaveLength(1);
    expect(loggedLines(errors, "outbox item failed")).toEqual([]);

    const next = await send({ chat_id: chat, text: "again" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    await runAlarm(key);
    await router(key).drained();
    expect(agent.services.replies().map((reply) => reply.text)).toEqual(["re: again"]);
  });
});

describe("a session row deleted by SQL between the object's read and its batch", () => {
  it("a run API reply is 409 session_ended, not a server error, and nothing is sent", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat, "question");
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("UPDATE runs SET finished_at")),
      before: deleteSession(run.sessionId),
    });
    const replied = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    expect(slipped.hits()).toBe(1);
    expect(replied).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    await runAlarm(genericKey(chat));
    expect(agent.services.replies()).toEqual([]);
  });

  it("an operator's end is 404 not_found, not a server error", async () => {
    const chat = unique("chat");
    const { sessionId } = await dispatchedThrough(agent.services, chat);
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.startsWith("UPDATE sessions SET end_reason = ?, ended_at = ?")),
      before: deleteSession(sessionId),
    });
    const ended = await post(`/admin/sessions/${sessionId}/end`);
    expect(slipped.hits()).toBe(1);
    expect(await answerOf(ended)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: `no session ${sessionId}` } },
    });
  });

  it("the sweep's look at it completes without a failure", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const chat = unique("chat");
    const { sessionId } = await dispatchedThrough(agent.services, chat);
    // Due for the sweep a day before anything else of this file, so the sweep looks at this row alone.
    const sweptAt = T0 - 24 * HOUR;
    await env.DB.prepare(`UPDATE sessions SET sweep_at = ? WHERE id = ?`)
      .bind(sweptAt - SWEEP_GRACE_MS, sessionId)
      .run();
    const slipped = injectD1Fault({
      match: (sql) => sql.length === 1 && /from "sessions" where "sessions"\."id" = \?$/i.test(sql[0]!),
      before: deleteSession(sessionId),
    });
    setNow(sweptAt);
    const report = await sweep(env, sweptAt);
    expect(slipped.hits()).toBe(1);
    expect(report).toEqual({ sessionsChecked: 1, eventsAttempted: 0, failures: 0 });
    expect(loggedLines(errors, "sweep: could not check session")).toEqual([]);
  });
});

describe("a failed run whose session row was deleted by SQL", () => {
  it("POST /admin/runs/{id}/retry is 404 not_found, and nothing is handed to the agent", async () => {
    agent.answerWith(() => new Response("bad", { status: 400 }));
    const chat = unique("chat");
    const { sessionId, runId } = await dispatchedThrough(agent.services, chat);
    await env.DB.prepare(`DELETE FROM sessions WHERE id = ?`).bind(sessionId).run();
    const retried = await post(`/admin/runs/${runId}/retry`);
    expect(await answerOf(retried)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: `no run ${runId}` } },
    });
    setNow(T0 + MINUTE);
    await runAlarm(genericKey(chat));
    expect(agent.services.agentCalls()).toHaveLength(1);
  });
});

describe("a dead-lettered reply whose platform was changed by SQL to one with no sender", () => {
  it("the operator's retry fails it at once, not retried, with the reason in its row, counted and logged", async () => {
    agent.answerWith(
      () => replyWith("hi"),
      () => new Response("gone", { status: 410 }),
    );
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    const view = async () => (await (await adminFetch(`/admin/sessions/${sent.body.session_id}`)).json()) as any;
    const [dead] = (await view()).deliveries;
    expect(dead).toMatchObject({ status: "failed", last_status: 410 });
    await env.DB.prepare(`UPDATE deliveries SET platform = 'pager' WHERE id = ?`).bind(dead.id).run();
    const before = (await metrics()).deliveries_failed;

    const retried = await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`);
    expect(retried.status).toBe(200);
    setNow(T0 + MINUTE);
    await runAlarm(key);
    await router(key).drained();

    const reason = "no sender for platform pager";
    expect((await view()).deliveries).toMatchObject([
      { id: dead.id, platform: "pager", status: "failed", attempts: 1, last_status: null, last_error: reason },
    ]);
    expect(agent.services.calls.filter((c) => c.url === REPLY_URL)).toHaveLength(1);
    expect((await metrics()).deliveries_failed).toBe(before + 1);
    expect(loggedLines(warn, "reply delivery failed").at(-1)).toMatchObject({
      delivery_id: dead.id,
      platform: "pager",
      attempt: 1,
      status: null,
      will_retry: false,
      error: reason,
    });
    // Nothing left owed: a later alarm sends nothing and changes nothing.
    expect(await router(key).outbox()).toEqual([]);
    setNow(T0 + HOUR);
    await runAlarm(key);
    expect(agent.services.calls.filter((c) => c.url === REPLY_URL)).toHaveLength(1);
    expect((await view()).deliveries).toMatchObject([{ status: "failed", attempts: 1 }]);
  });
});
