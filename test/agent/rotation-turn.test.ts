/**
 * A rotation moves the turn, still current, to the continuation (spec "run",
 * rotate): hand-offs still in the routing object's outbox move with it, and the
 * continuation keeps watching the lease of a run the agent accepted with 202.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  T0,
  alarmAfterRestart,
  adminFetch,
  alarmOf,
  genericKey,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentApi, agentConfig, CONCURRENT, fakeServices, replyWith } from "./support";

const MINUTE = 60_000;
const LEASE_MS = 10 * MINUTE;

/** What the fake agent answers next; a test switches it between steps. */
let answer: () => Response;
let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  answer = accepted;
  services = fakeServices(() => answer());
});
afterEach(() => {
  services.restore();
  restoreClock();
  useConfig(null);
});

/** Sends "one" and hands it to the agent (202), sends "two" (left staged), and rotates with run one. */
async function rotateWithTwoStaged(chat: string) {
  const key = genericKey(chat);
  const parent = (await send({ chat_id: chat, text: "one" })).body.session_id as string;
  await runAlarm(key);
  const first = services.agentCalls().at(-1)!.json;
  await send({ chat_id: chat, text: "two" });
  const rotated = await agentApi(`/v1/sessions/${parent}/rotate`, first.run_token, { reason: "compression" });
  expect(rotated.status).toBe(200);
  return { key, parent, continuation: rotated.body.session_id as string };
}

const callFor = (text: string) => services.agentCalls().find((call) => call.json.message.text === text)?.json;

describe("a hand-off staged before a rotation", () => {
  it("is handed over naming the continuation, and its reply lands there and is delivered", async () => {
    // A second message staged while run one is unfinished: concurrent mode.
    useConfig(agentConfig(CONCURRENT));
    const { key, parent, continuation } = await rotateWithTwoStaged(unique("chat"));
    answer = () => replyWith("answer to two");
    await runAlarm(key);

    expect(callFor("two")?.session).toMatchObject({ id: continuation, parent_id: parent });
    expect((await messagesOf(continuation)).map((m) => [m.role, m.text])).toEqual([["assistant", "answer to two"]]);
    expect(services.replies()).toEqual([
      expect.objectContaining({ kind: "reply", session_id: continuation, text: "answer to two" }),
    ]);
  });

  it("keeps naming the continuation after the object restarts (confirmed against its dedupe mark)", async () => {
    // A second message staged while run one is unfinished: concurrent mode.
    useConfig(agentConfig(CONCURRENT));
    const { key, parent, continuation } = await rotateWithTwoStaged(unique("chat"));
    // A restart forgets which staged runs were confirmed: the next hand-off checks D1's
    // dedupe mark, which names the parent, where the message is stored.
    answer = () => replyWith("answer to two");
    await alarmAfterRestart(key);
    expect(callFor("two")?.session).toMatchObject({ id: continuation, parent_id: parent });
    expect((await messagesOf(continuation)).map((m) => m.text)).toEqual(["answer to two"]);
  });

  it("retried by the operator after failing there, it still names the continuation after a restart", async () => {
    useConfig(agentConfig({ ...CONCURRENT, SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    const { key, parent, continuation } = await rotateWithTwoStaged(unique("chat"));
    const one = services.agentCalls()[0]!.json;
    expect((await agentApi(`/v1/runs/${one.run_id}/reply`, one.run_token, { text: "to one" })).status).toBe(200);
    answer = () => new Response("down", { status: 503 });
    await runAlarm(key);
    setNow(T0 + 24 * 60 * MINUTE + 1_000);
    await runAlarm(key);
    const two = callFor("two")!;
    const failed = await env.DB.prepare(`SELECT session_id, failed_at FROM runs WHERE id = ?`)
      .bind(two.run_id)
      .first<any>();
    expect(failed).toEqual({ session_id: continuation, failed_at: T0 + 24 * 60 * MINUTE + 1_000 });
    // The retry's first attempt fails too; then the object restarts. The dedupe mark
    // names the parent, where "two" is stored; the run belongs to the continuation.
    expect((await adminFetch(`/admin/runs/${two.run_id}/retry`, { method: "POST" })).status).toBe(200);
    await router(key).drained();
    answer = () => replyWith("answer to two");
    setNow(T0 + 24 * 60 * MINUTE + 10 * MINUTE);
    await alarmAfterRestart(key);
    const retried = services.agentCalls().at(-1)!.json;
    expect(retried).toMatchObject({ run_id: two.run_id, session: { id: continuation, parent_id: parent } });
    expect((await messagesOf(continuation)).map((m) => m.text)).toContain("answer to two");
  });

  it("holds the continuation open past its deadline while it is retried (invariant 6)", async () => {
    // A second message staged while run one is unfinished: concurrent mode.
    useConfig(agentConfig(CONCURRENT));
    const { key, continuation } = await rotateWithTwoStaged(unique("chat"));
    answer = () => new Response("down", { status: 503 });
    await runAlarm(key);
    expect(callFor("two")?.session.id).toBe(continuation);
    // Past the idle deadline (60 minutes) and past run one's lease: the retried hand-off holds.
    setNow(T0 + 61 * MINUTE);
    await runAlarm(key);
    expect(await sessionRow(continuation)).toMatchObject({ end_reason: null });
    // Once it is answered, the reply lands in the continuation; then expiry ends it.
    answer = () => replyWith("late answer");
    setNow(T0 + 120 * MINUTE);
    await runAlarm(key);
    expect((await messagesOf(continuation)).map((m) => m.text)).toEqual(["late answer"]);
    expect(services.replies()).toEqual([expect.objectContaining({ session_id: continuation, text: "late answer" })]);
  });
});

describe("the lease of a run moved by a rotation", () => {
  it("is watched by the continuation's alarm: a vanished owner is reaped (mode none)", async () => {
    useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const parent = (await send({ chat_id: chat, text: "one" })).body.session_id as string;
    await runAlarm(key);
    const run = services.agentCalls().at(-1)!.json;
    setNow(T0 + MINUTE);
    const rotated = await agentApi(`/v1/sessions/${parent}/rotate`, run.run_token, { reason: "compression" });
    const continuation = rotated.body.session_id as string;
    // Accepted at T0: the lease runs out at T0 + 10 minutes, and the alarm comes then.
    expect(await alarmOf(key)).toBe(T0 + LEASE_MS);
    expect(await sessionRow(continuation)).toMatchObject({ sweep_at: T0 + LEASE_MS });
    setNow(T0 + 11 * MINUTE);
    await runAlarm(key);
    expect(await sessionRow(continuation)).toMatchObject({ end_reason: "orphan_reap" });
  });

  it("is watched before the idle deadline too: the alarm comes at the earlier of the two", async () => {
    useConfig(agentConfig());
    const chat = unique("chat");
    const key = genericKey(chat);
    const parent = (await send({ chat_id: chat, text: "one" })).body.session_id as string;
    await runAlarm(key);
    const run = services.agentCalls().at(-1)!.json;
    const rotated = await agentApi(`/v1/sessions/${parent}/rotate`, run.run_token, { reason: "compression" });
    const continuation = rotated.body.session_id as string;
    expect(await alarmOf(key)).toBe(T0 + LEASE_MS);
    setNow(T0 + 11 * MINUTE);
    await runAlarm(key);
    expect(await sessionRow(continuation)).toMatchObject({ end_reason: "orphan_reap" });
  });
});
