/**
 * D1 cost of sending an answer whose row the routing object knows is in D1: a
 * command's answer and a run API reply (staged before the batch that inserts their
 * row, confirmed by that batch), and an operator's retry of a command's answer
 * (staged from the row the retry's batch read back). Sending one costs one
 * statement, its attempt recorded, whether the alarm or the inline drain sends it:
 * only an answer the object cannot vouch for (one left by a batch that threw) asks
 * D1 for its row first. A change that reads the row back again fails here.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { COMMAND_REPLIES } from "../../src/domain/commands";
import { metrics, resetMetrics } from "../../src/metrics";
import { SessionRouter } from "../../src/routing/router";
import {
  T0,
  deliveriesOf,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentApi, agentConfig, dispatchedThrough, echoConfig, fakeServices } from "../agent/support";

beforeEach(() => setNow(T0));
afterEach(() => {
  injectD1Fault(null);
  restoreClock();
  useConfig(null);
});

/** The D1 batches of `step` (each statement's first word) and the rows they read and wrote. */
async function d1CostOf(step: () => Promise<unknown>) {
  const batches: string[][] = [];
  injectD1Fault({
    match: (sql) => (batches.push(sql.map((s) => s.trimStart().split(/\s/)[0]!.toUpperCase())), false),
    times: Infinity,
  });
  resetMetrics();
  await step();
  injectD1Fault(null);
  return { batches, rowsRead: metrics.d1_rows_read, rowsWritten: metrics.d1_rows_written };
}

/** A fresh instance of the key's routing object over the same storage (nothing in memory, as after an eviction) runs `step`. */
function afterRestart<T>(key: string, step: (fresh: SessionRouter) => Promise<T>): Promise<T> {
  return runInDurableObject(router(key), (_instance, state) => step(new SessionRouter(state, env)));
}

/** What sending one answer costs: the attempt recorded on its row, found by its primary key. */
const ONE_ATTEMPT_RECORDED = { batches: [["UPDATE"]], rowsRead: 1, rowsWritten: 1 };

it("a command's answer is sent with one statement, its attempt: the command's batch stored its row", async () => {
  useConfig(echoConfig());
  const services = fakeServices(() => {
    throw new Error("the echo agent answers: no agent call expected");
  });
  try {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "/new" });
    const cost = await d1CostOf(() => runAlarm(genericKey(chat)));
    expect(services.replies().map((reply) => reply.text)).toEqual([COMMAND_REPLIES.started]);
    expect(cost).toEqual(ONE_ATTEMPT_RECORDED);
  } finally {
    services.restore();
  }
});

it("an operator's retry of a command's answer, on an object restarted since, is sent with one statement: the retry read its row", async () => {
  useConfig(echoConfig());
  let refuse = true;
  const services = fakeServices(
    () => {
      throw new Error("the echo agent answers: no agent call expected");
    },
    () => (refuse ? new Response("gone", { status: 410 }) : new Response("ok")),
  );
  try {
    const chat = unique("chat");
    const key = genericKey(chat);
    const command = await send({ chat_id: chat, text: "/new" });
    // Refused for good (410): the answer is dead-lettered.
    await runAlarm(key);
    const [failed] = await deliveriesOf(command.body.session_id);
    expect(failed).toMatchObject({ kind: "command", status: "failed" });
    refuse = false;
    // An operator retries later, when the object that sent the answer is long gone
    // (the one that did remembers the answer's row without the retry's help).
    const cost = await afterRestart(key, async (fresh) => {
      // A fresh instance reads its session once, for the deadline: not measured here.
      await fresh.alarm();
      expect(await fresh.retryDelivery(failed.id, key)).toMatchObject({ status: 200 });
      return d1CostOf(async () => {
        await fresh.alarm();
        await fresh.drained();
      });
    });
    expect(services.replies().map((reply) => reply.text)).toEqual([COMMAND_REPLIES.started, COMMAND_REPLIES.started]);
    expect(cost).toEqual(ONE_ATTEMPT_RECORDED);
  } finally {
    services.restore();
  }
});

it("a run API reply is sent with one statement, its attempt: the reply's batch stored its row", async () => {
  useConfig(agentConfig());
  const services = fakeServices(() => accepted());
  try {
    const chat = unique("chat");
    const { runId, token } = await dispatchedThrough(services, chat, "work");
    expect((await agentApi(`/v1/runs/${runId}/reply`, token, { text: "done" })).status).toBe(200);
    const cost = await d1CostOf(() => runAlarm(genericKey(chat)));
    expect(services.replies().map((reply) => reply.text)).toEqual(["done"]);
    expect(cost).toEqual(ONE_ATTEMPT_RECORDED);
  } finally {
    services.restore();
  }
});

it("with the inline drain, a run API reply the drain takes up while its batch is in flight is sent without reading its row", async () => {
  useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
  const services = fakeServices(() => accepted());
  try {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "work" });
    await router(key).drained();
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    // Staging the reply before its batch starts a drain at once: the drain waits for
    // the object's lock, and finds the reply confirmed by the batch when it gets it.
    const cost = await d1CostOf(async () => {
      expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "done" })).status).toBe(200);
      await router(key).drained();
    });
    expect(services.replies().map((reply) => reply.text)).toEqual(["done"]);
    // The reply recorded (run, session, message, delivery, notice, the delivery read
    // back), then the attempt: nothing read between them.
    expect(cost.batches.slice(-2)).toEqual([["UPDATE", "UPDATE", "INSERT", "INSERT", "UPDATE", "SELECT"], ["UPDATE"]]);
  } finally {
    services.restore();
  }
});
