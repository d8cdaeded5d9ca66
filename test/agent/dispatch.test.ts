/**
 * Durable hand-off of each turn to AGENT_URL (spec "Agent backend"): the request
 * the agent receives, retries while it is down or failing, replies by 200 and by
 * the run API, and replies of revoked runs that must never reach the chat.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  HOUR,
  T0,
  genericKey,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { AGENT_TOKEN, accepted, agentApi, agentConfig, CONCURRENT, fakeServices, replyWith } from "./support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig());
});
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

describe("the hand-off", () => {
  it("POSTs the run to AGENT_URL with the bearer AGENT_TOKEN and the spec's body", async () => {
    services = fakeServices(() => replyWith("hi back"));
    const chat = unique("chat");
    const sent = await send({ chat_id: chat, chat_type: "group", user_id: "u7", thread_id: "t1", text: "hello" });
    const key = `generic:group:${chat}:t1:u7`;
    expect(services.agentCalls()).toHaveLength(0); // answered before the hand-off
    await runAlarm(key);
    const [call] = services.agentCalls();
    expect(call!.method).toBe("POST");
    expect(call!.headers.authorization).toBe(`Bearer ${AGENT_TOKEN}`);
    expect(call!.json).toEqual({
      run_id: expect.stringMatching(/^run_/),
      run_token: expect.any(String),
      session: { id: sent.body.session_id, key, is_new: true, parent_id: null },
      reset: null,
      message: {
        event_id: sent.eventId,
        platform: "generic",
        chat_id: chat,
        chat_type: "group",
        user_id: "u7",
        thread_id: "t1",
        text: "hello",
        attachments: [],
        received_at: T0,
      },
      // Every message the run carries, oldest first: here only `message`.
      messages: [call!.json.message],
    });
    // The token is stored only as a hash.
    const run = await env.DB.prepare(`SELECT * FROM runs WHERE id = ?`).bind(call!.json.run_id).first<any>();
    expect(run.token_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(run)).not.toContain(call!.json.run_token);
    // The reply is recorded and delivered.
    expect((await messagesOf(sent.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "hello"],
      ["assistant", "hi back"],
    ]);
    expect(services.replies()).toEqual([
      { kind: "reply", event_id: sent.eventId, session_key: key, session_id: sent.body.session_id, text: "hi back" },
    ]);
  });

  it("says is_new only for the first run, and carries the reset of a session that replaced an expired one", async () => {
    services = fakeServices(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    await runAlarm(key);
    await send({ chat_id: chat });
    await runAlarm(key);
    setNow(T0 + 2 * HOUR);
    const fresh = await send({ chat_id: chat });
    await runAlarm(key);
    const calls = services.agentCalls().map((c) => c.json);
    expect(calls.map((c) => c.session.is_new)).toEqual([true, false, true]);
    expect(calls[0].reset).toBeNull();
    expect(calls[1].reset).toBeNull();
    expect(calls[2].reset).toEqual({ reason: "idle", had_activity: true, previous_session_id: first.body.session_id });
    expect(calls[2].session.id).toBe(fresh.body.session_id);
    // The first reply in the replacement carries the reset notice.
    expect(services.replies().map((r) => r.notice)).toEqual([undefined, undefined, "idle"]);
  });

  it("hands an acknowledged message over once the agent is back: the turn arrives once, the reply once", async () => {
    let up = false;
    services = fakeServices(() => {
      if (!up) throw new TypeError("connection refused");
      return replyWith("finally");
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "are you there" });
    expect(sent.status).toBe(200);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies()).toHaveLength(0);
    // Down for the next attempt too (1 s later), then up (2 s after that).
    setNow(T0 + 1_000);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(2);
    up = true;
    setNow(T0 + 3_000);
    await runAlarm(key);
    setNow(T0 + 60_000);
    await runAlarm(key);
    const arrived = services.agentCalls().slice(2);
    expect(arrived).toHaveLength(1);
    expect(new Set(services.agentCalls().map((c) => c.json.run_id)).size).toBe(1);
    expect(services.replies().map((r) => r.text)).toEqual(["finally"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["are you there", "finally"]);
  });

  it("retries a 5xx with backoff from about 1 s, the first three attempts within 30 s", async () => {
    let failures = 3;
    services = fakeServices(() => (failures-- > 0 ? new Response("busy", { status: 503 }) : replyWith("done")));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    const attemptTimes: number[] = [];
    for (let t = T0; services.replies().length === 0 && t < T0 + 60_000; t += 250) {
      setNow(t);
      const before = services.agentCalls().length;
      await runAlarm(key);
      if (services.agentCalls().length > before) attemptTimes.push(t - T0);
    }
    expect(attemptTimes).toEqual([0, 1_000, 3_000, 7_000]);
    expect(attemptTimes[2]).toBeLessThan(30_000);
    expect(services.replies().map((r) => r.text)).toEqual(["done"]);
    expect(new Set(services.agentCalls().map((c) => c.json.run_token)).size).toBe(1);
  });

  it("does not retry an agent that refuses the run with a 4xx, and marks the run failed", async () => {
    services = fakeServices(() => new Response("no", { status: 400 }));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await runAlarm(key);
    setNow(T0 + 10 * 60_000);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    const run = await env.DB.prepare(`SELECT failed_at, last_error FROM runs WHERE id = ?`)
      .bind(services.agentCalls()[0]!.json.run_id)
      .first<any>();
    expect(run.failed_at).toBe(T0);
    expect(run.last_error).toContain("400");
    expect((await router(key).outbox()).filter((i) => i.kind === "run")).toEqual([]);
  });

  it("records a 200 with a null reply as a finished turn with nothing to say", async () => {
    services = fakeServices(() => replyWith(null));
    const chat = unique("chat");
    const sent = await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    expect((await messagesOf(sent.body.session_id)).map((m) => m.role)).toEqual(["user"]);
    expect(services.replies()).toEqual([]);
    const run = await env.DB.prepare(`SELECT finished_at FROM runs WHERE id = ?`)
      .bind(services.agentCalls()[0]!.json.run_id)
      .first<any>();
    expect(run.finished_at).toBe(T0);
  });
});

describe("replies later through the run API (202)", () => {
  it("records and delivers a reply posted to /v1/runs/{id}/reply", async () => {
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "think about it" });
    await runAlarm(key);
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    expect(services.replies()).toEqual([]);
    setNow(T0 + 5_000);
    const posted = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "thought about it" });
    expect(posted).toEqual({ status: 200, body: { recorded: true } });
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["thought about it"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => [m.role, m.text, m.created_at])).toEqual([
      ["user", "think about it", T0],
      ["assistant", "thought about it", T0 + 5_000],
    ]);
    // A second reply for the same run is refused: the first one wins.
    expect(await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "again" })).toEqual({
      status: 409,
      body: { owns: false, reason: "finished" },
    });
  });

  it("after a reset, the first reply through the run API carries the notice, and the next one does not", async () => {
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const answer = async (text: string) => {
      await runAlarm(key);
      const { run_id, run_token } = services.agentCalls().at(-1)!.json;
      expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text })).status).toBe(200);
      await runAlarm(key);
    };
    await send({ chat_id: chat, text: "yesterday" });
    await answer("re: yesterday");
    // Idle past the 60-minute policy: the next message starts a fresh session that owes the notice.
    setNow(T0 + 2 * HOUR);
    await send({ chat_id: chat, text: "one" });
    await answer("re: one");
    setNow(T0 + 2 * HOUR + 60_000);
    await send({ chat_id: chat, text: "two" });
    await answer("re: two");
    expect(services.replies().map((r) => [r.text, r.notice ?? null])).toEqual([
      ["re: yesterday", null],
      ["re: one", "idle"],
      ["re: two", null],
    ]);
  });

  it("after a reset, a run API reply whose answer was lost, then refused by the chat at first, still carries the notice when it is retried", async () => {
    let refuseNext = false;
    services = fakeServices(
      () => accepted(),
      () => {
        if (!refuseNext) return new Response("ok");
        refuseNext = false;
        return new Response("unavailable", { status: 503 });
      },
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const reply = async (text: string) => {
      await runAlarm(key);
      const { run_id, run_token } = services.agentCalls().at(-1)!.json;
      return agentApi(`/v1/runs/${run_id}/reply`, run_token, { text });
    };
    await send({ chat_id: chat, text: "yesterday" });
    expect((await reply("re: yesterday")).status).toBe(200);
    await runAlarm(key);
    // Idle past the policy: the fresh session owes the notice.
    setNow(T0 + 2 * HOUR);
    await send({ chat_id: chat, text: "one" });
    // D1 records the reply, and its answer is lost: the object knows only what it staged (no notice).
    injectD1Fault({ afterCommit: true, match: (sql) => sql.some((q) => q.includes("UPDATE runs SET finished_at")) });
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    expect((await reply("re: one")).status).toBeGreaterThanOrEqual(500);
    // The first attempt sends D1's row (with the notice), and the chat refuses it.
    refuseNext = true;
    await runAlarm(key);
    const [item] = await router(key).outbox();
    expect(item).toMatchObject({ kind: "delivery", attempts: 1 });
    setNow(item!.dueAt);
    await runAlarm(key);
    expect(services.replies().map((r) => [r.text, r.notice ?? null])).toEqual([
      ["re: yesterday", null],
      ["re: one", "idle"],
      ["re: one", "idle"],
    ]);
  });

  it("a run only superseded by a newer message still delivers its reply (concurrent mode)", async () => {
    useConfig(agentConfig(CONCURRENT));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await send({ chat_id: chat, text: "two" });
    await runAlarm(key);
    const [first, second] = services.agentCalls().map((c) => c.json);
    expect((await agentApi(`/v1/runs/${first.run_id}/heartbeat`, first.run_token)).body).toEqual({
      owns: false,
      reason: "superseded",
    });
    expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
    expect((await agentApi(`/v1/runs/${second.run_id}/reply`, second.run_token, { text: "to two" })).status).toBe(200);
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["to one", "to two"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["one", "two", "to one", "to two"]);
  });

  it("a revoked run's reply is never added to a session nor delivered; it is kept on the run", async () => {
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "question" });
    await runAlarm(key);
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    const fresh = await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    const replied = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "late answer" });
    expect(replied).toEqual({ status: 409, body: { owns: false, reason: "superseded" } });
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["Started a new session."]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["question"]);
    expect(await messagesOf(fresh.body.session_id)).toEqual([]);
  });
});

it("a session ended as compression by SQL, with no continuation, revokes its staged hand-off", async () => {
  services = fakeServices(() => replyWith("never asked"));
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "question" });
  // Out of band: no rotation, so there is no continuation to move the run to.
  await env.DB.prepare(`UPDATE sessions SET end_reason = 'compression', ended_at = ? WHERE id = ?`)
    .bind(T0 + 1, sent.body.session_id)
    .run();
  await runAlarm(key);
  expect(services.agentCalls()).toHaveLength(0);
  const run = await env.DB.prepare(`SELECT revoked_reason, dispatched_at FROM runs WHERE event_id = ?`)
    .bind(sent.eventId)
    .first<any>();
  expect(run).toEqual({ revoked_reason: "session_ended", dispatched_at: null });
});

it("a reply that comes back after /new revoked its run (a slow 200) is kept for audit but not delivered", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  services = fakeServices(async () => {
    // While the agent is thinking, the user starts over.
    await send({ chat_id: chat, text: "/new" });
    return replyWith("stale answer");
  });
  const sent = await send({ chat_id: chat, text: "slow question" });
  await runAlarm(key);
  await runAlarm(key);
  expect(services.replies().map((r) => r.text)).toEqual(["Started a new session."]);
  expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["slow question"]);
  const run = await env.DB.prepare(`SELECT reply_text, revoked_reason FROM runs WHERE id = ?`)
    .bind(services.agentCalls()[0]!.json.run_id)
    .first<any>();
  expect(run).toEqual({ reply_text: "stale answer", revoked_reason: "superseded" });
});

it("a revoked run's reply stays out even when its session was reopened meanwhile", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  services = fakeServices(async (request) => {
    if (request.json.message.text !== "first") return accepted();
    // The run releases its session (which revokes it), then the user writes again,
    // which reopens the same session, before this slow answer comes back.
    await agentApi(`/v1/sessions/${request.json.session.id}/end`, request.json.run_token, { reason: "agent_close" });
    await send({ chat_id: chat, text: "second" });
    return replyWith("answer to first");
  });
  const sent = await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  expect(await sessionRowLive(sent.body.session_id)).toBe(true);
  expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["first", "second"]);
  expect(services.replies().map((r) => r.text)).not.toContain("answer to first");
});

async function sessionRowLive(id: string): Promise<boolean> {
  const row = await env.DB.prepare(`SELECT end_reason FROM sessions WHERE id = ?`)
    .bind(id)
    .first<{ end_reason: string | null }>();
  return row !== null && row.end_reason === null;
}

it("a slow agent does not hold back the next message's hand-off, which supersedes the slow run (concurrent mode)", async () => {
  useConfig(agentConfig(CONCURRENT));
  const chat = unique("chat");
  const key = genericKey(chat);
  let releaseFirst!: () => void;
  const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve));
  let firstArrived!: () => void;
  const firstSeen = new Promise<void>((resolve) => (firstArrived = resolve));
  const order: string[] = [];
  services = fakeServices(async (request) => {
    const text = request.json.message.text;
    order.push(`start ${text}`);
    if (text === "slow") {
      firstArrived();
      await firstHeld;
    }
    order.push(`end ${text}`);
    return replyWith(`re: ${text}`);
  });
  await send({ chat_id: chat, text: "slow" });
  const alarm = runAlarm(key);
  await firstSeen;
  await send({ chat_id: chat, text: "quick" });
  // Give the woken drain a moment to hand the second message over.
  for (let i = 0; i < 50 && !order.includes("end quick"); i++) await new Promise((r) => setTimeout(r, 10));
  const [slow, quick] = services.agentCalls().map((c) => c.json);
  expect(order).toEqual(["start slow", "start quick", "end quick"]);
  expect((await agentApi(`/v1/runs/${slow.run_id}/heartbeat`, slow.run_token)).body).toEqual({
    owns: false,
    reason: "superseded",
  });
  releaseFirst();
  await alarm;
  await runAlarm(key);
  expect(quick.message.text).toBe("quick");
  // Superseded, not revoked: both replies are delivered.
  expect(
    services
      .replies()
      .map((r) => r.text)
      .sort(),
  ).toEqual(["re: quick", "re: slow"]);
});

it("a reply that arrives after its session's deadline ends the session by its policy and is not added (policy on every path)", async () => {
  services = fakeServices(() => accepted());
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "slow one" });
  await runAlarm(key);
  const { run_id, run_token } = services.agentCalls()[0]!.json;
  // 61 minutes later (idle 60), before any alarm ran, the agent answers.
  setNow(T0 + 61 * 60_000);
  const replied = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "too late" });
  expect(replied).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
  const row = await env.DB.prepare(`SELECT end_reason FROM sessions WHERE id = ?`)
    .bind(sent.body.session_id)
    .first<any>();
  expect(row.end_reason).toBe("idle");
  expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["slow one"]);
  await runAlarm(key);
  expect(services.replies()).toEqual([]);
});

it("the first run of a session started while another hand-off is in flight carries is_new and its reset", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let arrived!: () => void;
  const seen = new Promise<void>((resolve) => (arrived = resolve));
  services = fakeServices(async (request) => {
    if (request.json.message.text === "slow") {
      arrived();
      await held;
    }
    return replyWith(`re: ${request.json.message.text}`);
  });
  const first = await send({ chat_id: chat, text: "slow" });
  const alarm = runAlarm(key);
  await seen;
  await send({ chat_id: chat, text: "/stop" });
  await send({ chat_id: chat, text: "after stop" });
  for (let i = 0; i < 50 && services.agentCalls().length < 2; i++) await new Promise((r) => setTimeout(r, 10));
  release();
  await alarm;
  const second = services.agentCalls().find((c) => c.json.message.text === "after stop")!.json;
  expect(second.session.is_new).toBe(true);
  expect(second.reset).toEqual({ reason: "suspended", had_activity: true, previous_session_id: first.body.session_id });
});
