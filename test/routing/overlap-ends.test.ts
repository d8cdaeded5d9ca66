/**
 * Waiting messages when their session ends (spec "Overlapping messages", invariant
 * 11): `/new`, `/reset`, `/stop` and every other end revoke the unfinished run and
 * record what waited as not dispatched, with the reason (`new_command`, `stopped`,
 * `session_ended`); none is ever carried into the fresh session. Through the
 * worker's own fetch and the routing object's alarm, in `queue` mode (the default).
 */
import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { T0, adminFetch, alarmOf, genericKey, router, runAlarm, send, setNow, unique } from "../helpers";
import { accepted, agentApi, replyWith } from "../agent/support";
import {
  type FakeServices,
  answeredUserMessages,
  carriedBy,
  explained,
  endBySql,
  firstHandedOver,
  overlapHooks,
} from "./overlap-support";
import { injectD1Fault } from "../../src/db/client";

const fake = overlapHooks({});
let services: FakeServices;

/** "one" handed to the agent (202), "two" and "three" waiting behind it. */
async function waitingBehindAccepted(chat: string) {
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  await runAlarm(key);
  const run = services.agentCalls().at(-1)!.json;
  setNow(T0 + 1);
  await send({ chat_id: chat, text: "two" });
  setNow(T0 + 2);
  await send({ chat_id: chat, text: "three" });
  setNow(T0 + 3);
  return { key, sessionId: one.body.session_id as string, run };
}

const ends: [string, (chat: string, sessionId: string, run: any) => Promise<unknown>, string, string][] = [
  ["/new", (chat) => send({ chat_id: chat, text: "/new" }), "new_command", "superseded"],
  ["/reset", (chat) => send({ chat_id: chat, text: "/reset" }), "new_command", "superseded"],
  ["/stop", (chat) => send({ chat_id: chat, text: "/stop" }), "stopped", "stopped"],
  [
    "an operator end",
    (_chat, sessionId) => adminFetch(`/admin/sessions/${sessionId}/end`, { method: "POST" }),
    "session_ended",
    "session_ended",
  ],
  [
    "an agent end",
    (_chat, sessionId, run) => agentApi(`/v1/sessions/${sessionId}/end`, run.run_token, { reason: "agent_close" }),
    "session_ended",
    "session_ended",
  ],
];

describe("the end of a session with messages waiting", () => {
  for (const [what, end, reason, revoked] of ends) {
    it(`${what}: the waiting messages are recorded not dispatched (${reason}), never carried on`, async () => {
      services = fake(() => accepted());
      const chat = unique("chat");
      const { key, sessionId, run } = await waitingBehindAccepted(chat);
      await end(chat, sessionId, run);
      expect(await answeredUserMessages(sessionId)).toEqual([
        { text: "one", run_id: run.run_id, not_dispatched: null },
        { text: "two", run_id: null, not_dispatched: reason },
        { text: "three", run_id: null, not_dispatched: reason },
      ]);
      // The unfinished run is revoked: its heartbeat says so, its reply is never delivered.
      expect(await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).toEqual({
        status: 409,
        body: { owns: false, reason: revoked },
      });
      await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" });
      // The next message starts fresh and its run carries only itself.
      setNow(T0 + 4);
      const next = await send({ chat_id: chat, text: "four" });
      await runAlarm(key);
      await router(key).drained();
      const calls = services.agentCalls().map((c) => (c.json.messages as any[]).map((m) => m.text));
      expect(calls).toEqual([["one"], ["four"]]);
      expect(services.agentCalls().at(-1)!.json.session.id).toBe(next.body.session_id);
      // agent_close is recoverable: the same row reopens, and what was not dispatched stays so.
      if (what === "an agent end") expect(next.body.session_id).toBe(sessionId);
      else expect(next.body.session_id).not.toBe(sessionId);
      expect(services.replies().map((r) => r.text)).not.toContain("late");
      expect((await explained(key)).waiting).toBe(0);
    });
  }

  it("a run staged for waiting messages whose session ended before its hand-off is revoked, its messages not dispatched", async () => {
    // "one" is retried (agent down); "two" waits; /stop ends the session before any run carries "two".
    services = fake(() => new Response("down", { status: 503 }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    await send({ chat_id: chat, text: "/stop" });
    services.restore();
    services = fake(() => replyWith("answer"));
    setNow(T0 + 60_000);
    await runAlarm(key);
    await router(key).drained();
    expect(services.agentCalls()).toEqual([]);
    const messages = await answeredUserMessages(one.body.session_id);
    expect(messages.map((m) => [m.text, m.not_dispatched])).toEqual([
      ["one", null],
      ["two", "stopped"],
    ]);
    const runs = await env.DB.prepare(`SELECT revoked_reason FROM runs WHERE session_id = ?`)
      .bind(one.body.session_id)
      .all<{ revoked_reason: string }>();
    expect(runs.results.map((r) => r.revoked_reason)).toEqual(["stopped"]);
  });

  it("an end written by SQL: the waiting messages are recorded session_ended when the object next looks", async () => {
    services = fake(() => new Response("down", { status: 503 }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    await env.DB.prepare(`UPDATE sessions SET end_reason = 'admin', ended_at = ? WHERE id = ?`)
      .bind(T0 + 2, one.body.session_id)
      .run();
    services.restore();
    services = fake(() => replyWith("answer"));
    setNow(T0 + 60_000);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(services.agentCalls()).toEqual([]);
    expect((await answeredUserMessages(one.body.session_id)).map((m) => [m.text, m.not_dispatched])).toEqual([
      ["one", null],
      ["two", "session_ended"],
    ]);
  });
});

describe("a row ended by SQL while a run waited for the agent, then reopened by a message", () => {
  it("the reopen revokes that run, so the message is not held behind it: the alarm carries it at once", async () => {
    services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("re: two")));
    const chat = unique("chat");
    const { key, sessionId, run } = await firstHandedOver(services, chat);
    await endBySql(sessionId, T0 + 1);
    setNow(T0 + 2);
    const two = await send({ chat_id: chat, text: "two" });
    expect(two.body.session_id).toBe(sessionId);
    // The accepted run of "one" was revoked by the reopen: nothing holds "two" back.
    expect((await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).status).toBe(409);
    expect(await alarmOf(key)).toBe(T0 + 3);
    setNow(T0 + 3);
    await runAlarm(key);
    await router(key).drained();
    expect(services.agentCalls().map((c) => (c.json.messages as { text: string }[]).map((m) => m.text))).toEqual([
      ["one"],
      ["two"],
    ]);
    expect(await answeredUserMessages(sessionId)).toMatchObject([
      { text: "one", run_id: run.run_id },
      { text: "two", run_id: services.agentCalls()[1]!.json.run_id, not_dispatched: null },
    ]);
  });
});

it("a reopen keeps a hand-off whose first attempt failed before D1 had its run, and hands it over at once", async () => {
  services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("ok")));
  const chat = unique("chat");
  const { key, sessionId, run } = await firstHandedOver(services, chat);
  setNow(T0 + 1);
  await send({ chat_id: chat, text: "two" });
  // "one" is answered through the API: a run for "two" is staged; its first attempt fails in D1.
  setNow(T0 + 2);
  expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "answer one" })).status).toBe(200);
  const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.startsWith("INSERT INTO runs")) });
  await runAlarm(key);
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  expect(services.agentCalls()).toHaveLength(1);
  // An SQL end the object is not told of, then a message that reopens the row.
  await endBySql(sessionId, T0 + 3);
  setNow(T0 + 4);
  expect((await send({ chat_id: chat, text: "three" })).body.session_id).toBe(sessionId);
  // The failed hand-off alone carries "two": it is retried at once, not dropped.
  expect(await alarmOf(key)).toBe(T0 + 5);
  for (let i = 0; i < 3; i++) {
    setNow(T0 + 5 + i);
    await runAlarm(key);
    await router(key).drained();
  }
  expect(carriedBy(services)).toEqual([["one"], ["two"], ["three"]]);
  expect((await answeredUserMessages(sessionId)).map((m) => m.not_dispatched)).toEqual([null, null, null]);
});
