/**
 * What a failing or odd hand-off leaves behind (spec "Agent backend", invariant 12):
 * the log line an operator reads for each failed attempt, a reply of only spaces,
 * a D1 failure while the agent's reply is recorded, a dead letter whose batch
 * committed but did not answer, and the echo agent's turn past its session's deadline.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { RUN_GIVE_UP_MS } from "../../src/routing/outbox";
import {
  HOUR,
  T0,
  genericKey,
  loggedLines,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentApi, agentConfig, echoConfig, fakeServices, replyWith } from "./support";

let services: ReturnType<typeof fakeServices> | undefined;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
});
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  services = undefined;
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

/** The "agent hand-off failed" lines logged so far. */
const handOffFailures = (spy: { mock: { calls: unknown[][] } }) => loggedLines(spy, "agent hand-off failed");

const runOf = (runId: string) =>
  env.DB.prepare(`SELECT finished_at, failed_at, attempts FROM runs WHERE id = ?`).bind(runId).first<any>();

/**
 * "question" sent, and the agent's answer (`reply`) lost to a D1 failure while it was
 * recorded: nothing reached the chat yet. Returns the key and the stored message's session.
 */
async function replyLostToD1(reply: string) {
  services = fakeServices(() => replyWith(reply));
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "question" });
  const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("UPDATE runs SET finished_at")) });
  await runAlarm(key);
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  expect(services.replies()).toEqual([]);
  return { key, sessionId: sent.body.session_id as string };
}

/** Moves the clock to the key's next due item and runs the alarm. */
async function runNextDue(key: string): Promise<void> {
  const [item] = await router(key).outbox();
  setNow(item!.dueAt);
  await runAlarm(key);
}

it("each failed attempt is logged with its session, run, attempt and whether it will be retried", async () => {
  const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
  let calls = 0;
  services = fakeServices(() =>
    ++calls === 1 ? new Response("busy", { status: 503 }) : new Response("no", { status: 400 }),
  );
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "hello" });
  await runAlarm(key);
  setNow(T0 + 1_000);
  await runAlarm(key);
  const runId = services.agentCalls()[0]!.json.run_id;
  const expected = { session_key: key, session_id: sent.body.session_id, run_id: runId };
  expect(handOffFailures(warn)).toEqual([
    expect.objectContaining({ ...expected, attempt: 1, will_retry: true, error: expect.stringContaining("503") }),
    expect.objectContaining({ ...expected, attempt: 2, will_retry: false, error: expect.stringContaining("400") }),
  ]);
});

it("a 5xx past the give-up age is the last attempt: logged as not retried, and the run is marked failed", async () => {
  const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
  services = fakeServices(() => new Response("busy", { status: 503 }));
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "hello" });
  await runAlarm(key);
  setNow(T0 + RUN_GIVE_UP_MS + 1);
  await runAlarm(key);
  expect(handOffFailures(warn).map((line) => line.will_retry)).toEqual([true, false]);
  expect(await runOf(services.agentCalls()[0]!.json.run_id)).toMatchObject({ failed_at: T0 + RUN_GIVE_UP_MS + 1 });
  expect((await router(key).outbox()).filter((item) => item.kind === "run")).toEqual([]);
});

it("a reply of only spaces is a finished turn with nothing to say: nothing added, nothing sent", async () => {
  services = fakeServices(() => replyWith("  \n\t "));
  const chat = unique("chat");
  const sent = await send({ chat_id: chat });
  await runAlarm(genericKey(chat));
  await router(genericKey(chat)).drained();
  expect((await messagesOf(sent.body.session_id)).map((m) => m.role)).toEqual(["user"]);
  expect(services.replies()).toEqual([]);
  expect(await runOf(services.agentCalls()[0]!.json.run_id)).toMatchObject({ finished_at: T0 });
});

it("D1 failing while the agent's reply is recorded: the retry records the reply kept, and the agent is asked once", async () => {
  const { key, sessionId } = await replyLostToD1("the answer");
  await runNextDue(key);
  await router(key).drained();
  expect(services!.agentCalls()).toHaveLength(1);
  expect(services!.replies().map((r) => r.text)).toEqual(["the answer"]);
  expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["question", "the answer"]);
});

it("a dead letter whose batch committed but did not answer is not handed to the agent again", async () => {
  services = fakeServices(() => new Response("no", { status: 400 }));
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "hello" });
  const fault = injectD1Fault({ afterCommit: true, match: (sql) => sql.some((s) => s.includes("SET failed_at")) });
  await runAlarm(key);
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  // The item is still in the outbox (its handler threw); its retry finds the run failed.
  const [item] = await router(key).outbox();
  expect(item?.kind).toBe("run");
  setNow(item!.dueAt);
  await runAlarm(key);
  expect(services.agentCalls()).toHaveLength(1);
  expect(await runOf(services.agentCalls()[0]!.json.run_id)).toMatchObject({ failed_at: T0, finished_at: null });
  expect((await router(key).outbox()).filter((i) => i.kind === "run")).toEqual([]);
});

it("the echo agent's turn still answers when its hand-off runs past the session's deadline (invariant 6)", async () => {
  useConfig(echoConfig({ HOOK_URLS: "" }));
  services = fakeServices(() => replyWith("unused"));
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "ping" });
  // The hand-off waited past the idle deadline (60 minutes) before it ran.
  setNow(T0 + 2 * HOUR);
  await runAlarm(key);
  await router(key).drained();
  const texts = (await messagesOf(sent.body.session_id)).map((m) => m.role);
  expect(texts).toEqual(["user", "assistant"]);
  expect(services.replies()).toHaveLength(1);
  expect(services.agentCalls()).toEqual([]);
});

it("a reply kept across a D1 failure is recorded even if AGENT_URL was removed before the retry (no echo instead)", async () => {
  const { key, sessionId } = await replyLostToD1("the agent's answer");
  // The operator switches to the built-in echo agent before the retry.
  useConfig(echoConfig({ HOOK_URLS: "" }));
  await runNextDue(key);
  await router(key).drained();
  expect(services!.replies().map((r) => r.text)).toEqual(["the agent's answer"]);
  expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["question", "the agent's answer"]);
});

it("an agent that posts its reply twice through the run API gets 409 finished, and the chat one message", async () => {
  services = fakeServices(() => accepted());
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "question" });
  await runAlarm(key);
  const { run_id, run_token } = services.agentCalls()[0]!.json;
  expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" })).status).toBe(200);
  await runAlarm(key);
  await router(key).drained();
  expect(services.replies().map((r) => r.text)).toEqual(["answer"]);
  const again = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" });
  expect(again).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
  await runAlarm(key);
  await router(key).drained();
  expect(services.replies().map((r) => r.text)).toEqual(["answer"]);
});

it("a run API reply whose batch committed but did not answer, while the hand-off waits to be retried, is delivered once and the agent not asked again", async () => {
  services = fakeServices(() => new Response("busy", { status: 503 }));
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "question" });
  await runAlarm(key);
  const { run_id, run_token } = services.agentCalls()[0]!.json;
  // The agent got the run despite its 503 and answers through the run API; the answer is lost on the way back.
  const fault = injectD1Fault({
    afterCommit: true,
    match: (sql) => sql.some((s) => s.includes("UPDATE runs SET finished_at")),
  });
  const replied = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "late answer" });
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  expect(replied.status).toBeGreaterThanOrEqual(500);
  // The agent does not retry. The hand-off's retry comes due; the reply still reaches the chat, once.
  setNow(T0 + 60_000);
  await runAlarm(key);
  await router(key).drained();
  expect(services.agentCalls()).toHaveLength(1);
  expect(services.replies().map((r) => r.text)).toEqual(["late answer"]);
  expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["question", "late answer"]);
  expect(await router(key).outbox()).toEqual([]);
});
