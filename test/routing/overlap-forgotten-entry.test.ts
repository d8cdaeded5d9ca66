/**
 * OVERLAP `queue` after the routing entry is forgotten (`DELETE /admin/routes/{key}`,
 * spec "Overlapping messages", invariant 11): the next message resolves its session
 * from D1, and while a run of that session is still unfinished it waits, as with the
 * entry; a session never gets a second unfinished run. And a run accepted (202) that
 * falls silent still lets what waits behind it go once its lease lapses, with no
 * entry left to wake the object. Found by the model-based test.
 */
import { env } from "cloudflare:test";
import { expect, it } from "vitest";
import {
  MINUTE,
  T0,
  adminFetch,
  alarmOf,
  genericKey,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { backoffDelay } from "../../src/http/backoff";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { accepted, agentApi, echoConfig, replyWith } from "../agent/support";
import {
  type FakeServices,
  carriedBy,
  endBySql,
  firstHandedOver,
  overlapHooks,
  userMessages,
  forget,
} from "./overlap-support";

const fake = overlapHooks({});
let services: FakeServices;

it("a message after a forgotten entry waits behind the run still in the outbox, then one run carries it", async () => {
  services = fake((request) => replyWith(`re ${request.json.messages.length}`));
  const chat = unique("chat");
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  const forgot = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
  expect(forgot.status).toBe(200);
  const two = await send({ chat_id: chat, text: "two" });
  expect(two.body.session_id).toBe(one.body.session_id);
  const { results } = await env.DB.prepare(
    `SELECT text, run_id FROM messages WHERE session_id = ? AND role = 'user' ORDER BY seq`,
  )
    .bind(one.body.session_id)
    .all<{ text: string; run_id: string | null }>();
  // "two" waits (no run of its own beside the unfinished one).
  expect(results[1]).toMatchObject({ text: "two", run_id: null });
  await runAlarm(key);
  await router(key).drained();
  await runAlarm(key);
  const carried = services.agentCalls().map((c) => (c.json.messages as { text: string }[]).map((m) => m.text));
  expect(carried).toEqual([["one"], ["two"]]);
});

/** "one" handed over and accepted (202), "two" waiting behind it, then the entry forgotten. */
async function waitingBehindAcceptedThenForgotten() {
  services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("re: two")));
  const chat = unique("chat");
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  await runAlarm(key);
  const run = services.agentCalls()[0]!.json;
  setNow(T0 + 1);
  await send({ chat_id: chat, text: "two" });
  await forget(key);
  return { chat, key, sessionId: one.body.session_id as string, run };
}

it("a message waiting behind an accepted run that falls silent is carried when the lease lapses, the entry forgotten", async () => {
  const { key, sessionId } = await waitingBehindAcceptedThenForgotten();
  // Nothing but the lease can end the run: the alarm must come by its end.
  expect(await alarmOf(key)).toBe(T0 + RUN_LEASE_MS);
  // The alarm on time, at the lease's end: the run holds nothing from then on (as the reset policy counts it).
  setNow(T0 + RUN_LEASE_MS);
  expect(await runAlarm(key)).toBe(true);
  await router(key).drained();
  expect(carriedBy(services)).toEqual([["one"], ["two"]]);
  const messages = await userMessages(sessionId);
  expect(messages[1]).toMatchObject({ text: "two", not_dispatched: null });
  expect(messages[1]!.run_id).toBe(services.agentCalls()[1]!.json.run_id);
});

it("a heartbeat extends that wait: the alarm looks again at the lease's new end, then carries the message", async () => {
  const { key, run } = await waitingBehindAcceptedThenForgotten();
  setNow(T0 + 5 * MINUTE);
  expect((await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).status).toBe(200);
  // At the first lease's end the run is still heard from: "two" keeps waiting.
  setNow(T0 + RUN_LEASE_MS + 1);
  await runAlarm(key);
  await router(key).drained();
  expect(carriedBy(services)).toEqual([["one"]]);
  // Not sooner (the alarm would spin on a run still heard from), not later.
  expect(await alarmOf(key)).toBe(T0 + 5 * MINUTE + RUN_LEASE_MS);
  setNow(T0 + 5 * MINUTE + RUN_LEASE_MS + 1);
  expect(await runAlarm(key)).toBe(true);
  await router(key).drained();
  expect(carriedBy(services)).toEqual([["one"], ["two"]]);
});

it("D1 failing between the lapsed run's end and the next run's staging strands nothing: the alarm comes back for them", async () => {
  const { key } = await waitingBehindAcceptedThenForgotten();
  setNow(T0 + RUN_LEASE_MS + 1);
  // The pump ends the lapsed run, then reads the session for the next run's context: that read fails.
  const fault = injectD1Fault({
    match: (sql) => sql.length === 1 && sql[0]!.includes('from "sessions" where "sessions"."id" = ?'),
  });
  await runAlarm(key);
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  expect(carriedBy(services)).toEqual([["one"]]);
  // Nothing holds "two" back any more: the alarm comes again after the failure's backoff.
  expect(await alarmOf(key)).toBe(T0 + RUN_LEASE_MS + 1 + backoffDelay(1));
  setNow(T0 + RUN_LEASE_MS + 1 + backoffDelay(1));
  expect(await runAlarm(key)).toBe(true);
  await router(key).drained();
  expect(carriedBy(services)).toEqual([["one"], ["two"]]);
});

it("a message that comes while the failed pump's messages still wait joins them: one run carries both, oldest first", async () => {
  const { chat, key } = await waitingBehindAcceptedThenForgotten();
  setNow(T0 + RUN_LEASE_MS + 1);
  injectD1Fault({ match: (sql) => sql.length === 1 && sql[0]!.includes('from "sessions" where "sessions"."id" = ?') });
  await runAlarm(key);
  injectD1Fault(null);
  // No run is unfinished and no entry names the session: only "two" waiting tells this
  // object which session "three" lands in, and that it must wait with "two".
  setNow(T0 + RUN_LEASE_MS + 2);
  await send({ chat_id: chat, text: "three" });
  setNow(T0 + RUN_LEASE_MS + 1 + backoffDelay(1));
  await runAlarm(key);
  await router(key).drained();
  await runAlarm(key);
  expect(carriedBy(services)).toEqual([["one"], ["two", "three"]]);
});

/** A chat whose first message ("yesterday") was answered; the fake agent echoes "re: …". */
async function answeredChat(agent = (request: { json: any }) => replyWith(`re: ${request.json.message.text}`)) {
  services = fake(agent);
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "yesterday" });
  await drain(key);
  return { chat, key };
}

/** Runs the key's alarm `passes` times, each time letting what it started finish. */
async function drain(key: string, passes = 1): Promise<void> {
  for (let pass = 0; pass < passes; pass++) {
    await runAlarm(key);
    await router(key).drained();
  }
}

/** The session, is_new and reset each hand-off after the first one told the agent. */
const laterHandoffs = () =>
  services
    .agentCalls()
    .slice(1)
    .map((c) => ({
      texts: (c.json.messages as { text: string }[]).map((m) => m.text),
      isNew: c.json.session.is_new as boolean,
      reset: (c.json.reset as { reason: string } | null)?.reason ?? null,
    }));

it("a fresh session's first run still staged when the entry is forgotten: only that run says is_new", async () => {
  const { chat, key } = await answeredChat();
  // Idle past the test config's 60-minute policy: "one" starts a fresh session; its hand-off waits in the outbox.
  setNow(T0 + 2 * 24 * 60 * MINUTE);
  const one = await send({ chat_id: chat, text: "one" });
  await forget(key);
  const two = await send({ chat_id: chat, text: "two" });
  expect(two.body.session_id).toBe(one.body.session_id);
  await drain(key, 3);
  expect(laterHandoffs()).toEqual([
    { texts: ["one"], isNew: true, reset: "idle" },
    { texts: ["two"], isNew: false, reset: null },
  ]);
  // The reset notice rides on the session's first reply only.
  expect(
    services
      .replies()
      .slice(1)
      .map((r) => r.notice ?? null),
  ).toEqual(["idle", null]);
});

it("a fresh session with no run yet, its entry forgotten: the next message's run is still its first (is_new)", async () => {
  const { chat, key } = await answeredChat();
  setNow(T0 + MINUTE);
  // "/new" starts the fresh session with no run of its own.
  const fresh = await send({ chat_id: chat, text: "/new" });
  await forget(key);
  const next = await send({ chat_id: chat, text: "hello" });
  expect(next.body.session_id).toBe(fresh.body.session_id);
  await drain(key);
  expect(laterHandoffs()).toEqual([{ texts: ["hello"], isNew: true, reset: "new_command" }]);
});

it("a fresh session ended by SQL before its first run, then reopened: that run is still its first (is_new)", async () => {
  const { chat, key } = await answeredChat();
  setNow(T0 + MINUTE);
  const fresh = await send({ chat_id: chat, text: "/new" });
  // An operator's tool ends it (recoverable) behind the object's back; the entry still names it.
  await endBySql(fresh.body.session_id, T0 + 2 * MINUTE);
  setNow(T0 + 3 * MINUTE);
  const next = await send({ chat_id: chat, text: "hello" });
  // It reopens the same session (a recoverable end).
  expect(next.body.session_id).toBe(fresh.body.session_id);
  await drain(key);
  expect(laterHandoffs()).toEqual([{ texts: ["hello"], isNew: true, reset: "new_command" }]);
});

it("a hand-off of the ended session still staged does not count as the fresh session's first run", async () => {
  services = fake((request) => replyWith(`re: ${request.json.message.text}`));
  const chat = unique("chat");
  const key = genericKey(chat);
  // "yesterday" is never handed over before "/new" ends its session: its hand-off stays staged.
  await send({ chat_id: chat, text: "yesterday" });
  setNow(T0 + MINUTE);
  const fresh = await send({ chat_id: chat, text: "/new" });
  await forget(key);
  await send({ chat_id: chat, text: "hello" });
  await drain(key, 2);
  const inFresh = services.agentCalls().filter((c) => c.json.session.id === fresh.body.session_id);
  expect(inFresh.map((c) => [c.json.message.text, c.json.session.is_new, c.json.reset?.reason ?? null])).toEqual([
    ["hello", true, "new_command"],
  ]);
});

it("the built-in echo agent, its entry rebuilt while the reset notice is owed: only the first reply carries it", async () => {
  useConfig(echoConfig({ HOOK_URLS: "" }));
  const { chat, key } = await answeredChat(() => replyWith("unused"));
  setNow(T0 + 2 * 24 * 60 * MINUTE);
  await send({ chat_id: chat, text: "one" });
  await forget(key);
  await send({ chat_id: chat, text: "two" });
  await drain(key, 3);
  expect(services.agentCalls()).toEqual([]);
  expect(services.replies().map((r) => [r.text, r.notice ?? null])).toEqual([
    [expect.stringContaining("yesterday"), null],
    [expect.stringContaining("one"), "idle"],
    [expect.stringContaining("two"), null],
  ]);
});

it("a message after a forgotten entry waits behind a run the agent accepted, with nothing else waiting", async () => {
  services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("re: two")));
  const chat = unique("chat");
  const { key, sessionId, run: first } = await firstHandedOver(services, chat);
  await forget(key);
  setNow(T0 + 1);
  await send({ chat_id: chat, text: "two" });
  await runAlarm(key);
  // Only the accepted run tells this object that "one" is unfinished: "two" waits behind it.
  expect(carriedBy(services)).toEqual([["one"]]);
  expect((await userMessages(sessionId)).map((m) => [m.text, m.run_id === null])).toEqual([
    ["one", false],
    ["two", true],
  ]);
  setNow(T0 + 2);
  expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
  await runAlarm(key);
  expect(carriedBy(services)).toEqual([["one"], ["two"]]);
});
