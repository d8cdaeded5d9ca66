/**
 * What a session's end takes out of the outbox, and what it leaves (spec "Agent
 * backend": delivery to the agent is durable, and a reply recorded is delivered).
 * An end drops the hand-offs of its own session only, and only those still to be
 * handed over:
 * - the idle end of a row `/new` replaced (its check, at its deadline) leaves the
 *   hand-off of the key's live session, which the agent (down) has not taken yet;
 * - a `/stop` after the agent's 200 answer was recorded in D1, its delivery never
 *   staged (the object threw after the commit), leaves the run's item: replayed, it
 *   still sends the answer D1 recorded before the end.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { COMMAND_REPLIES } from "../../src/domain/commands";
import {
  MINUTE,
  T0,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentApi, agentConfig, fakeServices, replyWith } from "../agent/support";
import { answeredUserMessages, carriedBy } from "./overlap-support";

const has = (fragment: string) => (sql: readonly string[]) => sql.some((s) => s.includes(fragment));
let services: ReturnType<typeof fakeServices> | null = null;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
});
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  services = null;
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

it("the idle end of a row /new replaced leaves the live session's hand-off, which the agent gets once it is back", async () => {
  let up = false;
  const agent = fakeServices((request) =>
    request.json.message.text === "one" || up ? accepted() : new Response("down", { status: 503 }),
  );
  services = agent;
  const chat = unique("chat");
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  const replaced = one.body.session_id as string;
  await runAlarm(key);
  const run = agent.agentCalls()[0]!.json;
  // The agent releases the session (recoverable), then /new replaces it: its row is
  // watched until its deadline, when the policy ends it for good.
  expect((await agentApi(`/v1/sessions/${replaced}/end`, run.run_token, { reason: "agent_close" })).status).toBe(200);
  setNow(T0 + MINUTE);
  const fresh = (await send({ chat_id: chat, text: "/new" })).body.session_id as string;
  expect(fresh).not.toBe(replaced);
  const two = await send({ chat_id: chat, text: "two" });
  expect(two.body.session_id).toBe(fresh);
  await runAlarm(key); // the agent is down: "two" is retried
  const check = (await router(key).outbox()).find((item) => item.id === `check_${replaced}`)!;
  setNow(check.dueAt);
  await runAlarm(key); // the replaced row ends as idle; "two" is tried again, the agent still down
  expect((await sessionRow(replaced))!.end_reason).toBe("idle");
  up = true;
  setNow(check.dueAt + 10 * MINUTE);
  await runAlarm(key);
  await router(key).drained();
  expect(carriedBy(agent)).toEqual([["one"], ["two"], ["two"], ["two"]]);
  const [, runOfTwo] = agent.agentCalls().map((c) => c.json.run_id as string);
  expect(await answeredUserMessages(fresh)).toEqual([{ text: "two", run_id: runOfTwo, not_dispatched: null }]);
  expect(await router(key).outbox()).toEqual([]);
});

it("a /stop after the agent's answer was recorded, its delivery not yet staged, still sends that answer once", async () => {
  const agent = fakeServices(() => replyWith("quick answer"));
  services = agent;
  vi.spyOn(console, "error").mockImplementation(() => undefined); // the failed record is logged
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "quick question" });
  const sessionId = sent.body.session_id as string;
  // The answer's batch commits in D1, then the call throws: the run's item keeps the reply.
  const fault = injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
  await runAlarm(key);
  expect(fault.hits()).toBe(1);
  expect(agent.replies()).toEqual([]);
  const [item] = await router(key).outbox();
  setNow(T0 + 1);
  expect((await send({ chat_id: chat, text: "/stop" })).status).toBe(200);
  setNow(item!.dueAt);
  await runAlarm(key);
  await router(key).drained();
  expect(agent.agentCalls()).toHaveLength(1);
  expect(agent.replies().map((r) => r.text)).toEqual([COMMAND_REPLIES.stopped, "quick answer"]);
  const delivery = await env.DB.prepare(
    `SELECT status, attempts FROM deliveries WHERE session_id = ? AND kind = 'reply'`,
  )
    .bind(sessionId)
    .first();
  expect(delivery).toEqual({ status: "sent", attempts: 1 });
  expect(await router(key).outbox()).toEqual([]);
});
