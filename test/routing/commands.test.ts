/**
 * The chat commands (`/new`, `/reset`, `/stop`) as a user and an operator see them,
 * beyond the end-to-end cases in echo-and-commands.test.ts: the answer each one
 * gives in the chat, the counters, a turn in progress holding an expired session
 * open, what the fresh session records of the one it replaced, a D1 failure that
 * changes nothing, and the hooks a command owes.
 */
import { env } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { COMMAND_REPLIES } from "../../src/domain/commands";
import { metrics } from "../../src/metrics";
import { MAX_ROUTING_ATTEMPTS } from "../../src/routing/context";
import { AGENT_URL, accepted, agentConfig } from "../agent/support";
import {
  MINUTE,
  T0,
  alarmOf,
  captureFetch,
  deliveriesOf,
  endOtherwiseBySql,
  eventsOf,
  genericKey,
  router,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  restoreClock,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const REPLY_URL = "https://client.test/replies";
const HOOK_URL = "https://hooks.test/events";
let outbound: { calls: Captured[]; restore: () => void };

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }), GENERIC_REPLY_URL: REPLY_URL });
  outbound = captureFetch((request) => {
    if (request.url === REPLY_URL || request.url === HOOK_URL) return new Response("ok");
    if (request.url === AGENT_URL) return accepted();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  injectD1Fault(null);
  outbound.restore();
  restoreClock();
  useConfig(null);
});

/** The command answers sent to the chat, in order. */
const chatAnswers = () => outbound.calls.filter((c) => c.url === REPLY_URL).map((c) => c.json.text as string);

/** A key whose session has one message, answered, with the calls so far forgotten. */
async function answeredSession(text: string) {
  const chat = unique("chat");
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text });
  await runAlarm(key);
  outbound.calls.length = 0;
  return { chat, key, first };
}

/**
 * The session ended as `agent_close` by SQL at T0, as the agent's own end writes it:
 * the row stays recoverable until the policy's deadline (60 idle minutes).
 */
async function releasedByAgent(sessionId: string): Promise<void> {
  await env.DB.prepare(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`)
    .bind(T0, sessionId)
    .run();
}

describe("the answer in the chat", () => {
  it("/stop of a live session says it stopped; a second /stop says there is nothing to stop", async () => {
    const { chat, key, first } = await answeredSession("work");
    const stop = await send({ chat_id: chat, text: "/stop" });
    const again = await send({ chat_id: chat, text: "/stop" });
    expect(again.body.session_id).toBe(first.body.session_id);
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.stopped, COMMAND_REPLIES.nothingToStop]);
    expect(stop.body.session_id).toBe(first.body.session_id);
    expect(await sessionsOfKey(key)).toHaveLength(1);
  });

  it("/stop on a key never seen starts nothing and names no session", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const stop = await send({ chat_id: chat, text: "/stop" });
    expect(stop.status).toBe(200);
    expect(stop.body.session_id).toBeNull();
    await runAlarm(key);
    expect(await sessionsOfKey(key)).toEqual([]);
  });

  it("/new answers that a new session started", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "/new" });
    await runAlarm(genericKey(chat));
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started]);
  });
});

describe("where no answer can be delivered", () => {
  it("a command on a chat the gateway cannot answer owes no answer: no delivery, none failed", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) });
    const chat = unique("chat");
    const failedBefore = metrics.deliveries_failed;
    const command = await send({ chat_id: chat, text: "/new" });
    await runAlarm(genericKey(chat));
    expect(await deliveriesOf(command.body.session_id)).toEqual([]);
    expect(metrics.deliveries_failed).toBe(failedBefore);
    expect(outbound.calls).toEqual([]);
  });
});

describe("after /stop", () => {
  it("the stopped session's deadline no longer sets the alarm (an idle key costs nothing)", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "work" });
    await runAlarm(key);
    await send({ chat_id: chat, text: "/stop" });
    await runAlarm(key);
    await router(key).drained();
    expect(chatAnswers()).toContain(COMMAND_REPLIES.stopped);
    expect(await alarmOf(key)).toBeNull();
  });

  it("with the inline drain (the default), no wake is left once the answer is sent, not even the drain's safety net", async () => {
    useConfig({
      SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
      GENERIC_REPLY_URL: REPLY_URL,
      OUTBOX_DRAIN: "inline",
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "work" });
    await router(key).drained();
    expect(await alarmOf(key)).not.toBeNull();
    await send({ chat_id: chat, text: "/stop" });
    await router(key).drained();
    expect(chatAnswers()).toEqual(["echo: work", COMMAND_REPLIES.stopped]);
    expect(await alarmOf(key)).toBeNull();
  });

  it("nor is the stopped session left for the cron sweep to wake its key (no sweep_at)", async () => {
    const { chat, first } = await answeredSession("work");
    expect((await sessionRow(first.body.session_id))?.sweep_at).not.toBeNull();
    await send({ chat_id: chat, text: "/stop" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "suspended", sweep_at: null });
  });
});

describe("what the fresh session records of the one it replaced", () => {
  it("whether the replaced session had any messages", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "hello" });
    const afterActivity = await send({ chat_id: chat, text: "/new" });
    const afterNothing = await send({ chat_id: chat, text: "/new" });
    expect(await sessionRow(afterActivity.body.session_id)).toMatchObject({
      reset_reason: "new_command",
      reset_had_activity: 1,
    });
    expect(await sessionRow(afterNothing.body.session_id)).toMatchObject({
      reset_reason: "new_command",
      reset_had_activity: 0,
      previous_session_id: afterActivity.body.session_id,
    });
  });
});

describe("a session /stop ended", () => {
  it("stays ended as suspended: a /new past its old deadline replaces it as suspended, not by the policy", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "hello" });
    await runAlarm(genericKey(chat));
    await send({ chat_id: chat, text: "/stop" });
    setNow(T0 + 3 * 60 * MINUTE);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "suspended" });
    expect(await sessionRow(command.body.session_id)).toMatchObject({
      previous_session_id: first.body.session_id,
      reset_reason: "suspended",
    });
  });
});

describe("a session the agent ended (recoverable), replaced by /new within its policy", () => {
  it("is finalized when its old deadline passes, by the alarm of the key, not before", async () => {
    const { chat, key, first } = await answeredSession("hello");
    await releasedByAgent(first.body.session_id);
    setNow(T0 + MINUTE);
    const fresh = await send({ chat_id: chat, text: "/new" });
    expect(fresh.body.session_id).not.toBe(first.body.session_id);
    await runAlarm(key);
    const types = async () => (await eventsOf(first.body.session_id)).map((e) => e.type);
    expect(await types()).not.toContain("session.finalized");
    // The key's alarm comes for it just past its old deadline (60 idle minutes after "hello").
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await types()).toContain("session.finalized");
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    // Its check is done: nothing is left to wake the key for it.
    expect((await router(key).outbox()).filter((item) => item.kind === "check")).toEqual([]);
  });

  it("replaced again after the operator deleted the fresh session by SQL: /new is answered, and the row still finalized once", async () => {
    const { chat, key, first } = await answeredSession("hello");
    await releasedByAgent(first.body.session_id);
    setNow(T0 + MINUTE);
    const fresh = await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    // The operator removes the fresh session: the released row is the key's newest again.
    await env.DB.prepare(`DELETE FROM sessions WHERE id = ?`).bind(fresh.body.session_id).run();
    setNow(T0 + 2 * MINUTE);
    const again = await send({ chat_id: chat, text: "/new" });
    expect(again.status).toBe(200);
    expect(again.body.session_id).not.toBe(first.body.session_id);
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started, COMMAND_REPLIES.started]);
    // One look at the released row, at its old deadline.
    expect((await router(key).outbox()).filter((item) => item.kind === "check")).toHaveLength(1);
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect((await eventsOf(first.body.session_id)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });
});

describe("a session the agent ended (recoverable), then /stop within its policy", () => {
  it("says there is nothing to stop, and the alarm still finalizes the session at its old deadline", async () => {
    const { chat, key, first } = await answeredSession("hello");
    await releasedByAgent(first.body.session_id);
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "/stop" });
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.nothingToStop]);
    // The command ended nothing: the key's alarm still comes just past its session's
    // deadline (60 idle minutes after "hello"), to finalize it.
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    expect((await eventsOf(first.body.session_id)).map((e) => e.type)).toContain("session.finalized");
  });
});

describe("with no reset policy, a session the agent ended, replaced by /new", () => {
  it("is left as it is: the command is answered, nothing is staged to look at the row again, and the answer's alarm reads nothing", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }), GENERIC_REPLY_URL: REPLY_URL });
    const { chat, key, first } = await answeredSession("hello");
    await releasedByAgent(first.body.session_id);
    setNow(T0 + MINUTE);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(command.status).toBe(200);
    expect(command.body).toMatchObject({ accepted: true, duplicate: false });
    expect(command.body.session_id).not.toBe(first.body.session_id);
    // Without a policy a recoverable row has no deadline: there is no time to look at it again.
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["delivery"]);
    const batches: string[][] = [];
    injectD1Fault({
      match: (sql) => (batches.push(sql.map((s) => s.trimStart().split(/\s/)[0]!.toUpperCase())), false),
      times: Infinity,
    });
    await runAlarm(key);
    injectD1Fault(null);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started]);
    // The answer's attempt recorded, and nothing else.
    expect(batches).toEqual([["UPDATE"]]);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "agent_close" });
  });
});

describe("a session the agent ended, replaced by /new, when the policy changes before its old deadline", () => {
  it("is looked at again at its new deadline, not over and over from the old one", async () => {
    const { chat, key, first } = await answeredSession("hello");
    await releasedByAgent(first.body.session_id);
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    // The operator doubles the idle window: the replaced row stays recoverable for longer.
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 120 }), GENERIC_REPLY_URL: REPLY_URL });
    setNow(T0 + 60 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "agent_close" });
    const check = (await router(key).outbox()).find((item) => item.kind === "check");
    expect(check?.dueAt).toBe(T0 + 120 * MINUTE + 1);
    setNow(T0 + 120 * MINUTE + 1);
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
  });
});

describe("a turn in progress holds an expired session open (invariant 6)", () => {
  it("/new past the deadline while the agent still works ends it for the command, not by the policy", async () => {
    useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 1 }) }));
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "long task" });
    await runAlarm(genericKey(chat));
    // Two minutes on: past the idle deadline, but the accepted run's lease holds.
    setNow(T0 + 2 * MINUTE);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "new_command" });
    expect(await sessionRow(command.body.session_id)).toMatchObject({ reset_reason: "new_command" });
    // The command revoked the run it ended the session under.
    const run = await env.DB.prepare(`SELECT revoked_reason FROM runs WHERE session_id = ?`)
      .bind(first.body.session_id)
      .first<{ revoked_reason: string | null }>();
    expect(run?.revoked_reason).not.toBeNull();
  });
  it("a row ended as agent_close while its run still works is expired by /new past its deadline: only a live row is held", async () => {
    useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 1 }) }));
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "long task" });
    await runAlarm(genericKey(chat));
    // Ended out of band: the accepted run is not revoked and its lease still holds.
    await releasedByAgent(first.body.session_id);
    setNow(T0 + 2 * MINUTE);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    expect(await sessionRow(command.body.session_id)).toMatchObject({ reset_reason: "idle" });
  });
});

describe("counters", () => {
  it("count a session ended, a session created and a duplicate, each once", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "hello" });
    const ended = metrics.sessions_ended.suspended ?? 0;
    const created = metrics.sessions_created;
    const duplicates = metrics.duplicates;
    const ingressBatches = metrics.d1_batches_ingress;
    const stop = await send({ chat_id: chat, text: "/stop" });
    // A command's D1 call is counted with the webhook's (ingress) cost.
    expect(metrics.d1_batches_ingress).toBeGreaterThan(ingressBatches);
    await send({ chat_id: chat, text: "/stop" });
    await send({ chat_id: chat, text: "/stop", event_id: stop.eventId });
    expect(metrics.sessions_ended.suspended).toBe(ended + 1);
    expect(metrics.duplicates).toBe(duplicates + 1);
    expect(metrics.sessions_created).toBe(created);
    await send({ chat_id: chat, text: "/new" });
    expect(metrics.sessions_created).toBe(created + 1);
  });
});

describe("D1 failing", () => {
  it("the command is answered 5xx, changes nothing and owes no answer; its retry is answered once", async () => {
    const { chat, key, first } = await answeredSession("hello");
    const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("INSERT INTO deliveries")), index: -1 });
    const failed = await send({ chat_id: chat, text: "/new" });
    expect(fault.hits()).toBe(1);
    expect(failed.status).toBeGreaterThanOrEqual(500);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
    expect(await sessionsOfKey(key)).toHaveLength(1);
    expect((await router(key).outbox()).filter((item) => item.kind === "delivery")).toEqual([]);
    const retried = await send({ chat_id: chat, text: "/new", event_id: failed.eventId });
    expect(retried.status).toBe(200);
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started]);
    expect(await sessionsOfKey(key)).toHaveLength(2);
  });
});

describe("another writer between the command's read and its batch", () => {
  /** Ends the row by SQL (an operator's tool) just before the next command batch D1 sees, `times` times. */
  function slipAnEnd(sessionId: string, times = 1) {
    return injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("INSERT INTO deliveries")),
      times,
      // Each time a different reason, so the batch's own end (or its guard on the last one seen) misses.
      before: endOtherwiseBySql(sessionId, T0),
    });
  }

  it("/new: the session it ended first is read again and replaced as it was ended; one answer, no end of its own counted", async () => {
    const { chat, key, first } = await answeredSession("hello");
    const ended = metrics.sessions_ended.new_command ?? 0;
    const slipped = slipAnEnd(first.body.session_id);
    setNow(T0 + MINUTE);
    const answer = await send({ chat_id: chat, text: "/new" });
    expect(slipped.hits()).toBe(1);
    expect(answer.status).toBe(200);
    // The operator's end stands; the fresh session follows it.
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "agent_close" });
    const sessions = await sessionsOfKey(key);
    expect(sessions.map((row) => row.id)).toEqual([first.body.session_id, answer.body.session_id]);
    expect(await sessionRow(answer.body.session_id)).toMatchObject({
      end_reason: null,
      previous_session_id: first.body.session_id,
    });
    expect(metrics.sessions_ended.new_command ?? 0).toBe(ended);
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started]);
  });

  it("/new gives up after MAX_ROUTING_ATTEMPTS batches that each lost the race: 5xx, no answer owed; the retry is answered", async () => {
    const { chat, key, first } = await answeredSession("hello");
    const slipped = slipAnEnd(first.body.session_id, MAX_ROUTING_ATTEMPTS + 1);
    setNow(T0 + MINUTE);
    const failed = await send({ chat_id: chat, text: "/new" });
    // 503, so the platform retries, saying why.
    expect(failed).toMatchObject({
      status: 503,
      body: {
        error: { message: expect.stringContaining(`command did not settle after ${MAX_ROUTING_ATTEMPTS} attempts`) },
      },
    });
    expect(slipped.hits()).toBe(MAX_ROUTING_ATTEMPTS);
    expect(await sessionsOfKey(key)).toHaveLength(1);
    expect((await router(key).outbox()).filter((item) => item.kind === "delivery")).toEqual([]);
    injectD1Fault(null);
    const retried = await send({ chat_id: chat, text: "/new", event_id: failed.eventId });
    expect(retried.status).toBe(200);
    await runAlarm(key);
    expect(chatAnswers()).toEqual([COMMAND_REPLIES.started]);
  });
});

describe("hooks", () => {
  it("/new sends the replaced session's end and the fresh session's start", async () => {
    useConfig({
      SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
      GENERIC_REPLY_URL: REPLY_URL,
      HOOK_URLS: HOOK_URL,
      HOOK_SECRET: "hook-secret",
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    await router(key).drained();
    outbound.calls.length = 0;
    const command = await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    await router(key).drained();
    const events = outbound.calls
      .filter((c) => c.url === HOOK_URL)
      .map((c) => [c.json.type, c.json.session_id ?? c.json.session?.id]);
    expect(events).toContainEqual(["session.ended", first.body.session_id]);
    expect(events).toContainEqual(["session.started", command.body.session_id]);
  });
});
