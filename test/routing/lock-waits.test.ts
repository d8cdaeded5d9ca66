/**
 * A hand-off whose item is done while its handler waits for the lock. With the
 * inline drain, a call that stages work under the lock (a command's answer, a run
 * API reply's delivery) starts the drain before its own D1 batch: a retried hand-off
 * due by then starts too, and waits for the lock. The call then takes that hand-off
 * out of the outbox (`/stop` revokes its run; the run API's reply finishes it), so
 * the handler finds nothing to hand over and leaves quietly: no failed item logged,
 * no second hand-off. The object restarted first (the agent was down a while), so
 * nothing in its memory says the hand-off was confirmed. The same for a command's
 * answer whose batch D1 refused: the command takes it out again, and its handler,
 * waiting meanwhile, asks D1 nothing more (D1 is still down) and logs no failure.
 */
import { abortAllDurableObjects } from "cloudflare:test";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { COMMAND_REPLIES } from "../../src/domain/commands";
import { T0, genericKey, loggedLines, restoreClock, router, send, setNow, unique, useConfig } from "../helpers";
import { accepted, agentApi, agentConfig, fakeServices } from "../agent/support";
import { sessionAnswer } from "./overlap-support";

let services: ReturnType<typeof fakeServices> | null = null;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "", OUTBOX_DRAIN: "inline" }));
});
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  services = null;
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

/**
 * "one" handed to an agent that answers 503 and goes on working (its retry is due
 * 1 s later), then the object restarts and the clock reaches that retry.
 */
async function retryDue() {
  const agent = fakeServices(() => new Response("busy", { status: 503 }));
  services = agent;
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "one" });
  await router(key).drained();
  const [item] = await router(key).outbox();
  expect(item).toMatchObject({ kind: "run", attempts: 1 });
  await abortAllDurableObjects();
  setNow(item!.dueAt);
  const errors = vi.spyOn(console, "error");
  return { agent, chat, key, sessionId: sent.body.session_id as string, run: agent.agentCalls()[0]!.json, errors };
}

it("/stop while the retry of a hand-off waits for the lock: dropped quietly, never handed over again", async () => {
  const { agent, chat, key, sessionId, errors } = await retryDue();
  expect((await send({ chat_id: chat, text: "/stop" })).status).toBe(200);
  await router(key).drained();
  expect(loggedLines(errors, "outbox item failed")).toEqual([]);
  expect(agent.agentCalls()).toHaveLength(1);
  expect(agent.replies().map((r) => r.text)).toEqual([COMMAND_REPLIES.stopped]);
  expect((await sessionAnswer(sessionId)).runs.map((r) => r.revoked_reason)).toEqual(["stopped"]);
  expect(await router(key).outbox()).toEqual([]);
});

it("the run API's reply while the retry of its hand-off waits for the lock: the reply is sent once, the hand-off dropped quietly", async () => {
  const { agent, key, run, errors } = await retryDue();
  expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "answer" })).status).toBe(200);
  await router(key).drained();
  expect(loggedLines(errors, "outbox item failed")).toEqual([]);
  expect(agent.agentCalls()).toHaveLength(1);
  expect(agent.replies().map((r) => r.text)).toEqual(["answer"]);
  expect(await router(key).outbox()).toEqual([]);
});

it("a command whose batch D1 refused while its answer waited for the lock: the answer is dropped quietly", async () => {
  const agent = fakeServices(() => new Response("busy", { status: 503 }));
  services = agent;
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "one" });
  await router(key).drained();
  const errors = vi.spyOn(console, "error");
  // D1 is down for the deliveries table: the command's batch (it writes the answer's row) fails.
  const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("deliveries")), times: 10 });
  expect((await send({ chat_id: chat, text: "/new" })).status).toBe(503);
  await router(key).drained();
  expect(fault.hits()).toBe(1);
  expect(loggedLines(errors, "outbox item failed")).toEqual([]);
  expect(agent.replies()).toEqual([]);
  expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["run"]);
});

it("a run API reply whose batch D1 refused is not sent: the drain that took it up waited for D1's word; the agent's retry is sent once", async () => {
  const agent = fakeServices(() => accepted());
  services = agent;
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "one" });
  await router(key).drained();
  const { run_id, run_token } = agent.agentCalls()[0]!.json;
  // D1 refuses the reply's batch (it writes the delivery's row); staging the reply before it started a drain.
  const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("INSERT INTO deliveries")) });
  expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" })).status).toBe(503);
  await router(key).drained();
  expect(fault.hits()).toBe(1);
  expect(agent.replies()).toEqual([]);
  // The agent retries, as a 503 asks: the reply is recorded and sent once.
  expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" })).status).toBe(200);
  await router(key).drained();
  expect(agent.replies().map((r) => r.text)).toEqual(["answer"]);
  expect(await router(key).outbox()).toEqual([]);
});
