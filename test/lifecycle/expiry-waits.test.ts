/**
 * Expiry waits for the turn in progress (spec invariant 6): while the session's
 * current run is unfinished (its hand-off still retried in the outbox, or accepted
 * with 202 within its lease), the reset policy does not end the session; once the
 * run finishes, fails for good or loses its lease, the alarm ends it if its
 * deadline passed. Commands, operator ends and agent ends still end at once.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  MINUTE,
  T0,
  alarmAfterRestart,
  alarmOf,
  eventsOf,
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
import { injectD1Fault } from "../../src/db/client";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { accepted, agentApi, agentConfig, fakeServices, replyWith } from "../agent/support";

const IDLE_1 = JSON.stringify({ mode: "idle", idle_minutes: 1 });
let services: ReturnType<typeof fakeServices>;

beforeEach(() => setNow(T0));
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

/** Fires the key's alarm at its own time, again and again, until it is due after `until`. */
async function alarmsUntil(key: string, until: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const at = await alarmOf(key);
    if (at === null || at > until) return;
    setNow(at);
    await runAlarm(key);
  }
  throw new Error("the alarm did not settle");
}

const runsOf = async (sessionId: string) =>
  (await env.DB.prepare(`SELECT * FROM runs WHERE session_id = ? ORDER BY created_at`).bind(sessionId).all<any>())
    .results;

describe("the agent down past the deadline", () => {
  it("idle: the hand-off is retried past the deadline, delivered, answered, then the session ends by idle", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    const upAt = T0 + 3 * MINUTE;
    services = fakeServices(() =>
      Date.now() >= upAt ? replyWith("sorry for the wait") : new Response("", { status: 503 }),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "anyone there?" });
    // Well past the one-minute deadline, the agent still down: the session waits.
    await alarmsUntil(key, T0 + 2 * MINUTE);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    expect((await router(key).outbox()).filter((i) => i.kind === "run")).toHaveLength(1);
    expect(services.replies()).toEqual([]);
    // The agent is back: the turn arrives once, its reply is recorded and delivered.
    await alarmsUntil(key, upAt + 3 * MINUTE);
    const calls = services.agentCalls();
    expect(new Set(calls.map((c) => c.json.run_id)).size).toBe(1);
    expect((await messagesOf(sent.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "anyone there?"],
      ["assistant", "sorry for the wait"],
    ]);
    expect(services.replies().map((r) => r.text)).toEqual(["sorry for the wait"]);
    // Then the policy ends it, one idle minute after that reply.
    const row = await sessionRow(sent.body.session_id);
    expect(row).toMatchObject({ end_reason: "idle" });
    const [reply] = (await messagesOf(sent.body.session_id)).filter((m) => m.role === "assistant");
    expect(row!.ended_at).toBe(reply!.created_at + MINUTE + 1);
  });

  it("daily: a hand-off pending across the boundary is delivered and answered, then ends at the next boundary", async () => {
    const start = Date.UTC(2031, 0, 16, 3, 59);
    setNow(start);
    useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "daily", at_hour: 4 }), HOOK_URLS: "" }));
    const upAt = start + 4 * MINUTE;
    services = fakeServices(() =>
      Date.now() >= upAt ? replyWith("late but here") : new Response("", { status: 503 }),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "before four" });
    await alarmsUntil(key, start + 2 * MINUTE); // past 04:00
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    await alarmsUntil(key, upAt + 5 * MINUTE);
    expect(services.replies().map((r) => r.text)).toEqual(["late but here"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["before four", "late but here"]);
    // The reply is activity after 04:00: the next boundary ends the session.
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    const nextBoundary = Date.UTC(2031, 0, 17, 4, 0);
    expect(await alarmOf(key)).toBe(nextBoundary);
    await alarmsUntil(key, nextBoundary);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "daily" });
    expect((await eventsOf(sent.body.session_id)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });

  it("a hand-off that fails for good past the deadline lets the alarm end the session at once", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    let refuse = false;
    services = fakeServices(() => (refuse ? new Response("no", { status: 400 }) : new Response("", { status: 503 })));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await alarmsUntil(key, T0 + 2 * MINUTE);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    refuse = true;
    await alarmsUntil(key, T0 + 10 * MINUTE);
    const [run] = await runsOf(sent.body.session_id);
    expect(run.failed_at).not.toBeNull();
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
  });

  it("a message past the deadline while the turn is in progress joins the held session", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    services = fakeServices(() => new Response("", { status: 503 }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await alarmsUntil(key, T0 + 90_000);
    setNow(T0 + 100_000);
    const lines: string[] = [];
    const spy = vi.spyOn(console, "log").mockImplementation((line: unknown) => void lines.push(String(line)));
    const second = await send({ chat_id: chat, text: "two" });
    spy.mockRestore();
    expect(second.body.session_id).toBe(first.body.session_id);
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["one", "two"]);
    // The operator's log line says what happened: appended to the held session, not a fresh one.
    const routed = lines.map((line) => JSON.parse(line)).filter((entry) => entry.msg === "message routed");
    expect(routed).toMatchObject([{ decision: "append", session_id: first.body.session_id }]);
  });
});

describe("a run accepted with 202", () => {
  async function acceptedRun(chat: string) {
    const sent = await send({ chat_id: chat, text: "take your time" });
    await runAlarm(genericKey(chat));
    const call = services.agentCalls().at(-1)!.json;
    return { sessionId: sent.body.session_id as string, runId: call.run_id as string, token: call.run_token as string };
  }

  it("that replies after the deadline: the reply is recorded and delivered, then the session ends by idle", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await acceptedRun(chat);
    await alarmsUntil(key, T0 + 2 * MINUTE);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
    setNow(T0 + 3 * MINUTE);
    expect(await agentApi(`/v1/runs/${run.runId}/heartbeat`, run.token)).toEqual({
      status: 200,
      body: { owns: true },
    });
    expect(await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "still on it" })).toMatchObject({
      status: 200,
    });
    setNow(T0 + 4 * MINUTE);
    expect(await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "done" })).toEqual({
      status: 200,
      body: { recorded: true },
    });
    await alarmsUntil(key, T0 + 4 * MINUTE + 1_000);
    expect(services.replies().map((r) => r.text)).toEqual(["still on it", "done"]);
    expect((await messagesOf(run.sessionId)).map((m) => m.text)).toEqual(["take your time", "done"]);
    await alarmsUntil(key, T0 + 10 * MINUTE);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle", ended_at: T0 + 5 * MINUTE + 1 });
  });

  it("accepted in an alarm whose look at the session failed (D1): the session's next look is still the lease's end", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    let answer = () => new Response("unavailable", { status: 503 });
    services = fakeServices(() => answer());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "take your time" });
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    const retryAt = (await alarmOf(key))!;
    // A fresh instance knows no deadline; its read of the session fails, and the pass goes on to the hand-off.
    answer = () => accepted();
    setNow(retryAt);
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    injectD1Fault({ match: () => true });
    await alarmAfterRestart(key);
    expect(services.agentCalls()).toHaveLength(2);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({
      end_reason: null,
      sweep_at: retryAt + RUN_LEASE_MS,
    });
  });

  it("that goes silent: the session ends by its policy when the lease runs out, not before", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await acceptedRun(chat);
    await alarmsUntil(key, T0 + RUN_LEASE_MS - 1);
    // Held past its deadline: the cron sweep's next look is the lease's end, not every minute from the deadline on.
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null, sweep_at: T0 + RUN_LEASE_MS });
    await alarmsUntil(key, T0 + RUN_LEASE_MS);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle", ended_at: T0 + RUN_LEASE_MS });
    expect(await agentApi(`/v1/runs/${run.runId}/heartbeat`, run.token)).toEqual({
      status: 409,
      body: { owns: false, reason: "session_ended" },
    });
  });

  it("with no reset policy (mode none), a heartbeat moves the next look to the lease's new end, then the silent run is reaped", async () => {
    useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }), HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await acceptedRun(chat);
    expect(await alarmOf(key)).toBe(T0 + RUN_LEASE_MS);
    setNow(T0 + 5 * MINUTE);
    expect((await agentApi(`/v1/runs/${run.runId}/heartbeat`, run.token)).status).toBe(200);
    setNow(T0 + RUN_LEASE_MS);
    await runAlarm(key);
    // Still heard from: the alarm and the sweep look again when the extended lease ends.
    expect(await alarmOf(key)).toBe(T0 + 5 * MINUTE + RUN_LEASE_MS);
    expect(await sessionRow(run.sessionId)).toMatchObject({
      end_reason: null,
      sweep_at: T0 + 5 * MINUTE + RUN_LEASE_MS,
    });
    setNow(T0 + 5 * MINUTE + RUN_LEASE_MS);
    await runAlarm(key);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "orphan_reap" });
  });

  it("/new past the deadline still ends the session at once and revokes the run", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await acceptedRun(chat);
    await alarmsUntil(key, T0 + 2 * MINUTE);
    setNow(T0 + 3 * MINUTE);
    const fresh = await send({ chat_id: chat, text: "/new" });
    expect(fresh.body.session_id).not.toBe(run.sessionId);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "new_command", ended_at: T0 + 3 * MINUTE });
    const [row] = await runsOf(run.sessionId);
    expect(row.revoked_reason).toBe("superseded");
    expect(await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "too late" })).toEqual({
      status: 409,
      body: { owns: false, reason: "superseded" },
    });
    expect(services.replies()).toEqual([]);
  });

  it("/stop past the deadline ends the session at once too, and revokes the run", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const stopChat = unique("chat");
    const stopped = await acceptedRun(stopChat);
    await alarmsUntil(genericKey(stopChat), T0 + 2 * MINUTE);
    const answer = await send({ chat_id: stopChat, text: "/stop" });
    expect(answer.status).toBe(200);
    expect(await sessionRow(stopped.sessionId)).toMatchObject({ end_reason: "suspended" });
    expect((await runsOf(stopped.sessionId))[0].revoked_reason).toBe("stopped");
  });
});
