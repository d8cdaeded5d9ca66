/**
 * OVERLAP `queue` (the default) through the worker's own fetch and the routing
 * object's alarm (spec "Overlapping messages", invariants 6 and 11): a message that
 * arrives while a run is unfinished is stored, acknowledged as always, and waits in
 * the object's own storage; once that run is over (reply, `{"reply": null}`, failed
 * for good, lease lapsed) one run carries every waiting message, oldest first. With
 * the agent fast, slow, down, answering 202 then through the API, and failing for good.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import {
  MINUTE,
  T0,
  adminFetch,
  alarmAfterRestart,
  alarmOf,
  genericKey,
  messagesOf,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { backoffDelay } from "../../src/http/backoff";
import { SessionRouter } from "../../src/routing/router";
import { accepted, agentApi, replyWith } from "../agent/support";
import {
  type FakeServices,
  overlapHooks,
  overlapConfig,
  carriedBy,
  explained,
  firstHandedOver,
  sessionAnswer,
} from "./overlap-support";

const fake = overlapHooks({});
let services: FakeServices;

/** Each user message's text with the texts its run carries (null while it waits). */
async function carriedTexts(sessionId: string): Promise<[string, string[] | null, string | null][]> {
  const { messages } = await sessionAnswer(sessionId);
  // Every run of the key: a rotation moves runs to the continuation.
  const runs = await env.DB.prepare(
    `SELECT id, message, messages FROM runs WHERE session_key = (SELECT session_key FROM sessions WHERE id = ?)`,
  )
    .bind(sessionId)
    .all<{ id: string; message: string; messages: string | null }>();
  const byId = new Map(runs.results.map((r) => [r.id, r]));
  return messages
    .filter((m) => m.role === "user")
    .map((m) => {
      const run = m.run_id ? byId.get(m.run_id) : undefined;
      const texts = run
        ? run.messages
          ? (JSON.parse(run.messages) as { text: string }[]).map((c) => c.text)
          : [(JSON.parse(run.message) as { text: string }).text]
        : null;
      return [m.text, texts, m.not_dispatched];
    });
}

const callTexts = () => carriedBy(services);

describe("queue: the agent answers at once (fast)", () => {
  it("one run carries every message that waited, oldest first, message the newest; every reply delivered", async () => {
    services = fake((request) => replyWith(`re: ${request.json.message.text}`));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    const two = await send({ chat_id: chat, text: "two" });
    setNow(T0 + 2);
    const three = await send({ chat_id: chat, text: "three" });
    // A message that waits is answered exactly as any other.
    for (const sent of [two, three]) {
      expect(sent).toMatchObject({
        status: 200,
        body: { accepted: true, duplicate: false, session_id: one.body.session_id },
      });
    }
    const sessionId = one.body.session_id as string;
    // "one" got its run id with the message; the two after it wait (run_id null).
    expect((await sessionAnswer(sessionId)).messages.map((m: any) => [m.text, typeof m.run_id])).toEqual([
      ["one", "string"],
      ["two", "object"],
      ["three", "object"],
    ]);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two", "three"]]);
    const second = services.agentCalls()[1]!.json;
    expect(second.message).toEqual(second.messages[1]);
    expect(second.message).toMatchObject({ event_id: three.eventId, text: "three", received_at: T0 + 2 });
    expect(second.session).toMatchObject({ id: sessionId, is_new: false });
    expect(await carriedTexts(sessionId)).toEqual([
      ["one", ["one"], null],
      ["two", ["two", "three"], null],
      ["three", ["two", "three"], null],
    ]);
    expect(services.replies().map((r) => r.text)).toEqual(["re: one", "re: three"]);
    const { runs } = await sessionAnswer(sessionId);
    expect(runs.map((r: any) => r.status)).toEqual(["finished", "finished"]);
  });

  it("a platform's resend of a waiting message is a duplicate, and the message still gets its run", async () => {
    services = fake((request) => replyWith(`re: ${request.json.message.text}`));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    const two = await send({ chat_id: chat, text: "two" });
    const resent = await send({ chat_id: chat, text: "two", event_id: two.eventId });
    expect(resent).toMatchObject({ status: 200, body: { duplicate: true, session_id: two.body.session_id } });
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two"]]);
  });

  it("at most max_batch messages a run; the rest wait for the next", async () => {
    useConfig(overlapConfig({ OVERLAP: JSON.stringify({ max_batch: 2 }) }));
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    for (const [i, text] of ["a", "b", "c", "d", "e"].entries()) {
      setNow(T0 + i);
      await send({ chat_id: chat, text });
    }
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["a"], ["b", "c"], ["d", "e"]]);
  });
});

describe("queue: the agent is slow (a hand-off in flight)", () => {
  it("a message sent meanwhile is not handed over until the slow run's reply is recorded", async () => {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let reached!: () => void;
    const called = new Promise<void>((resolve) => (reached = resolve));
    services = fake(async (request) => {
      if (request.json.message.text === "slow") {
        reached();
        await released;
      }
      return replyWith(`re: ${request.json.message.text}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "slow" });
    const alarm = runAlarm(key);
    await called;
    const quick = await send({ chat_id: chat, text: "quick" });
    expect(quick.status).toBe(200);
    for (let i = 0; i < 20; i++) await new Promise((r) => setTimeout(r, 5));
    expect(callTexts()).toEqual([["slow"]]);
    release();
    await alarm;
    await router(key).drained();
    expect(callTexts()).toEqual([["slow"], ["quick"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["re: slow", "re: quick"]);
  });
});

describe("queue: the agent is down (503), then up", () => {
  it("waiting messages stay behind the retried run, and the session is held past its deadline (invariant 6)", async () => {
    let up = false;
    services = fake((request) =>
      up ? replyWith(`re: ${request.json.message.text}`) : new Response("down", { status: 503 }),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"]]);
    // Past the idle deadline (60 minutes): the retried run and the waiting message hold it.
    setNow(T0 + 61 * MINUTE);
    await runAlarm(key);
    expect(await sessionRow(one.body.session_id)).toMatchObject({ end_reason: null });
    up = true;
    setNow(T0 + 62 * MINUTE);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts().slice(-2)).toEqual([["one"], ["two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["re: one", "re: two"]);
    // Both turns over: the alarm ends the session once idle again after the late reply.
    setNow(T0 + 123 * MINUTE);
    await runAlarm(key);
    expect(await sessionRow(one.body.session_id)).toMatchObject({ end_reason: "idle" });
  });
});

describe("queue: the agent refuses the hand-off (503) while a message waits behind it", () => {
  it("the alarm comes back for the retry, not sooner: the waiting message adds no wake-up of its own", async () => {
    services = fake(() => new Response("down", { status: 503 }));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"]]);
    // The hand-off's outcome is what lets "two" go: nothing to do before its retry.
    expect(await alarmOf(key)).toBe(T0 + 1 + backoffDelay(1));
  });
});

describe("queue: the agent accepts (202) and replies through the run API", () => {
  it("messages wait until the accepted run's reply; then one run carries them", async () => {
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    setNow(T0 + 2);
    await send({ chat_id: chat, text: "three" });
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"]]);
    // The accepted run is not superseded by messages that wait behind it.
    expect(await agentApi(`/v1/runs/${first.run_id}/heartbeat`, first.run_token)).toEqual({
      status: 200,
      body: { owns: true },
    });
    setNow(T0 + 3);
    expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["two", "three"]]);
    const second = services.agentCalls()[1]!.json;
    setNow(T0 + 4);
    expect(
      await agentApi(`/v1/runs/${second.run_id}/reply`, second.run_token, { text: "to two and three" }),
    ).toMatchObject({ status: 200 });
    await router(key).drained();
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["to one", "to two and three"]);
    expect((await messagesOf(one.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "one"],
      ["user", "two"],
      ["user", "three"],
      ["assistant", "to one"],
      ["assistant", "to two and three"],
    ]);
  });

  it("a 202 that comes after the run already finished changes nothing: the next message is not held behind it", async () => {
    // A hand-off repeated after a restart: the agent replied to the first attempt
    // through the API, then answers the repeat with 202.
    services = fake(async (request) => {
      if (request.json.message.text !== "one") return replyWith(`re: ${request.json.message.text}`);
      await agentApi(`/v1/runs/${request.json.run_id}/reply`, request.json.run_token, { text: "to one" });
      return accepted();
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await router(key).drained();
    const runs = await env.DB.prepare(`SELECT accepted_at, finished_at FROM runs WHERE session_id = ?`)
      .bind(one.body.session_id)
      .all();
    expect(runs.results).toEqual([{ accepted_at: null, finished_at: T0 }]);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    // "two" got its own run at once (a run id with the message), instead of waiting
    // behind the finished run until its lease ran out.
    expect((await sessionAnswer(one.body.session_id)).messages.map((m: any) => [m.text, typeof m.run_id])).toEqual([
      ["one", "string"],
      ["to one", "string"],
      ["two", "string"],
    ]);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["to one", "re: two"]);
  });

  it("a reply through the API while the run's hand-off is being retried ends that hand-off: the next message gets its own run", async () => {
    // The agent took the hand-off but answered 503; it then replies through the run API.
    services = fake((request) =>
      request.json.message.text === "one" ? new Response("busy", { status: 503 }) : replyWith("re: two"),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
    setNow(T0 + 2);
    await send({ chat_id: chat, text: "two" });
    // "two" got a run of its own at once: nothing of the session is unfinished.
    expect((await sessionAnswer(one.body.session_id)).messages.map((m: any) => [m.text, typeof m.run_id])).toEqual([
      ["one", "string"],
      ["to one", "string"],
      ["two", "string"],
    ]);
    setNow(T0 + 10 * MINUTE);
    await runAlarm(key);
    await router(key).drained();
    // The retried hand-off of "one" is not made again.
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["to one", "re: two"]);
  });

  it("an accepted run whose lease lapses hands the waiting messages on; the session is not reaped", async () => {
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    setNow(T0 + RUN_LEASE_MS + 1);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(await sessionRow(one.body.session_id)).toMatchObject({ end_reason: null });
  });
});

describe("queue: the inline drain (the default), the agent replying through the run API", () => {
  it("the reply hands the waiting messages over at once, not at the next alarm", async () => {
    useConfig(overlapConfig({ OUTBOX_DRAIN: "inline" }));
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    await router(key).drained();
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    await router(key).drained();
    expect(callTexts()).toEqual([["one"]]);
    setNow(T0 + 2);
    expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["to one"]);
  });
});

describe("queue: expiry waits for the waiting messages too (invariant 6)", () => {
  it("an accepted run gone silent past the deadline: the message behind it is handed over, not dropped", async () => {
    useConfig(overlapConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 5 }) }));
    services = fake((request) =>
      request.json.message.text === "one" ? accepted() : replyWith(`re: ${request.json.message.text}`),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    // Past the idle deadline (5 minutes) and past run one's lease (10 minutes).
    setNow(T0 + RUN_LEASE_MS + 1);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["re: two"]);
    expect((await messagesOf(one.body.session_id)).map((m) => m.text)).toEqual(["one", "two", "re: two"]);
  });
});

describe("queue: a rotation while messages wait", () => {
  it("a message that waited in the parent and then the continuation ended is recorded not dispatched, where it is stored", async () => {
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    const rotated = await agentApi(`/v1/sessions/${one.body.session_id}/rotate`, first.run_token, {
      reason: "compression",
    });
    expect(rotated.status).toBe(200);
    setNow(T0 + 2);
    await send({ chat_id: chat, text: "/reset" });
    await runAlarm(key);
    await router(key).drained();
    // "two" is stored in the parent (its row stays there); the continuation's end leaves it behind.
    const { messages } = await sessionAnswer(one.body.session_id);
    expect(
      messages.filter((m: any) => m.role === "user").map((m: any) => [m.text, m.run_id === null, m.not_dispatched]),
    ).toEqual([
      ["one", false, null],
      ["two", true, "new_command"],
    ]);
    expect(callTexts()).toEqual([["one"]]);
  });

  it("what waited in the parent is carried by the continuation's next run", async () => {
    services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("re: two")));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    const rotated = await agentApi(`/v1/sessions/${one.body.session_id}/rotate`, first.run_token, {
      reason: "compression",
    });
    const continuation = rotated.body.session_id as string;
    setNow(T0 + 2);
    await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" });
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(services.agentCalls()[1]!.json.session).toMatchObject({ id: continuation, parent_id: one.body.session_id });
    expect(await carriedTexts(one.body.session_id)).toEqual([
      ["one", ["one"], null],
      ["two", ["two"], null],
    ]);
    expect(services.replies().map((r) => r.text)).toEqual(["to one", "re: two"]);
  });
});

describe("queue: the agent fails for good (4xx)", () => {
  it("the failed run is over: what waited gets its run", async () => {
    services = fake((request) =>
      request.json.message.text === "bad" ? new Response("no", { status: 400 }) : replyWith("fine"),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const bad = await send({ chat_id: chat, text: "bad" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "good" });
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["bad"], ["good"]]);
    const { runs } = await sessionAnswer(bad.body.session_id);
    expect(runs.map((r: any) => r.status)).toEqual(["failed", "finished"]);
    expect(services.replies().map((r) => r.text)).toEqual(["fine"]);
  });

  it("an operator retry of a failed run that carried several messages hands all of them over again", async () => {
    let failing = true;
    services = fake((request) =>
      failing && request.json.messages.length > 1 ? new Response("no", { status: 400 }) : replyWith("ok"),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    setNow(T0 + 2);
    await send({ chat_id: chat, text: "three" });
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two", "three"]]);
    const failed = services.agentCalls()[1]!.json.run_id as string;
    failing = false;
    const retried = await adminFetch(`/admin/runs/${failed}/retry`, { method: "POST" });
    expect(retried.status).toBe(200);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["two", "three"], ["two", "three"]]);
    expect(services.agentCalls()[2]!.json.run_id).toBe(failed);
    expect(await carriedTexts(one.body.session_id)).toEqual([
      ["one", ["one"], null],
      ["two", ["two", "three"], null],
      ["three", ["two", "three"], null],
    ]);
  });
});

describe("waiting messages survive a restart of the routing object", () => {
  it("a fresh instance over the same storage hands them over, in one run", async () => {
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    setNow(T0 + 2);
    await send({ chat_id: chat, text: "three" });
    // A new instance of the class over the same durable storage: nothing kept in memory.
    await runInDurableObject(router(key), async (_instance, state) => {
      const fresh = new SessionRouter(state, env);
      await fresh.alarm();
      await fresh.drained();
    });
    expect(callTexts()).toEqual([["one"], ["two", "three"]]);
    expect(await carriedTexts(one.body.session_id)).toEqual([
      ["one", ["one"], null],
      ["two", ["two", "three"], null],
      ["three", ["two", "three"], null],
    ]);
  });

  it("a message waiting behind an accepted run, its lease still running: a fresh instance's alarm leaves the session and the run as they are", async () => {
    services = fake(() => accepted());
    const chat = unique("chat");
    const { key, sessionId, run } = await firstHandedOver(services, chat);
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "two" });
    // The fresh instance knows no deadline: it reads the row, within its policy, held by the run.
    setNow(T0 + 2 * MINUTE);
    await alarmAfterRestart(key);
    expect(await sessionRow(sessionId)).toMatchObject({ end_reason: null });
    expect(callTexts()).toEqual([["one"]]);
    expect(await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).toEqual({
      status: 200,
      body: { owns: true },
    });
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "to one" })).status).toBe(200);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["two"]]);
  });

  it("a run staged for waiting messages before the restart is handed over by the fresh instance", async () => {
    services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("ok")));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    // The reply through the API stages the run that carries "two"; then the object restarts.
    await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" });
    expect((await router(key).outbox()).filter((item) => item.kind === "run")).toHaveLength(1);
    await runInDurableObject(router(key), async (_instance, state) => {
      const fresh = new SessionRouter(state, env);
      await fresh.alarm();
      await fresh.drained();
    });
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect(await carriedTexts(one.body.session_id)).toEqual([
      ["one", ["one"], null],
      ["two", ["two"], null],
    ]);
  });

  it("a stored message left unconfirmed is still carried when the alarm comes two calendar days later", async () => {
    useConfig(overlapConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("ok")));
    const storedAt = Date.UTC(2031, 0, 15, 23, 50);
    setNow(storedAt);
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(storedAt + 1);
    await send({ chat_id: chat, text: "two" });
    // What a kill between the batch and its confirmation leaves: D1 stored "two", the row is unconfirmed.
    await runInDurableObject(router(key), (_instance, state) => {
      state.storage.sql.exec(`UPDATE overlap_waiting SET confirmed = 0`);
    });
    // Run one's owner went silent; the alarm comes late, at 00:05 on the 17th.
    setNow(storedAt + 24 * 60 * MINUTE + 15 * MINUTE);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"], ["two"]]);
    expect((await carriedTexts(one.body.session_id)).find(([text]) => text === "two")).toEqual(["two", ["two"], null]);
  });

  it("a message staged to wait whose batch never reached D1 is dropped, not handed over", async () => {
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    // What a kill before the batch leaves: a waiting row, unconfirmed, with no message in D1.
    await runInDurableObject(router(key), (_instance, state) => {
      state.storage.sql.exec(
        `INSERT INTO overlap_waiting (event_id, session_id, stored_in, received_at, message, confirmed)
          VALUES (?, ?, ?, ?, ?, 0)`,
        "evt-never-stored",
        one.body.session_id,
        one.body.session_id,
        T0,
        JSON.stringify({ eventId: "evt-never-stored", platform: "generic", text: "ghost", sessionKey: key }),
      );
    });
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["one"]]);
    expect(await router(key).outbox()).toEqual([]);
  });
});

describe("explain", () => {
  it("counts the messages waiting", async () => {
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    await send({ chat_id: chat, text: "two" });
    await send({ chat_id: chat, text: "three" });
    const explanation = await explained(key);
    expect(explanation.waiting).toBe(2);
    expect(explanation.overlap).toMatchObject({ mode: "queue", source: "default" });
  });

  it("a platform's resend of the message in flight is a duplicate, and nothing more waits", async () => {
    services = fake(() => accepted());
    const chat = unique("chat");
    const { key, sessionId, run } = await firstHandedOver(services, chat);
    const resent = await send({ chat_id: chat, text: "one", event_id: run.message.event_id });
    expect(resent.body).toMatchObject({ duplicate: true, session_id: sessionId });
    expect((await explained(key)).waiting).toBe(0);
  });
});
