/**
 * The run API at its edges, as an agent and an operator see them: a run whose
 * session row an operator removed by hand, a reply recorded before a kill that
 * left it unsent, a run that closed its own session, progress around its run's
 * lease and when it cannot be delivered, what a rotation leaves behind, and an agent
 * that answers a run twice (through the API and in its response).
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { metrics } from "../../src/metrics";
import {
  MINUTE,
  alarmOf,
  captureFetch,
  T0,
  genericKey,
  loggedLines,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import {
  AGENT_URL,
  REPLY_URL,
  accepted,
  agentApi,
  agentConfig,
  fakeServices,
  replyWith,
  dispatchedThrough,
} from "./support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "", HOOK_SECRET: "" }));
  services = fakeServices(() => accepted());
});
afterEach(() => {
  injectD1Fault(null);
  vi.restoreAllMocks();
  services.restore();
  restoreClock();
  useConfig(null);
});

const dispatched = (chat: string, text?: string) => dispatchedThrough(services, chat, text);

const progress = (run: { runId: string; token: string }, text = "working on it") =>
  agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text });

// The worker finds the run and its session before the routing object does: a row
// removed by hand is refused there, and the object is not asked.
describe("a run whose session row was removed by hand", () => {
  it("gets 404 for its reply and its progress, not a server error, and nothing is sent", async () => {
    const run = await dispatched(unique("chat"));
    await env.DB.prepare(`DELETE FROM sessions WHERE id = ?`).bind(run.sessionId).run();
    expect(await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" })).toMatchObject({
      status: 404,
    });
    expect(await progress(run)).toMatchObject({ status: 404 });
    expect(services.replies()).toEqual([]);
  });
});

describe("a reply recorded, then the object killed before it was staged", () => {
  it("is sent as soon as the agent posts it again through the run API, not only when the hand-off is retried", async () => {
    services.restore();
    services = fakeServices(() => replyWith("answer"));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "question" });
    // The agent answers in its response; D1 records the reply, then the object dies.
    injectD1Fault({ afterCommit: true, match: (sql) => sql.some((s) => s.includes("UPDATE runs SET finished_at")) });
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    await runAlarm(key);
    await router(key).drained();
    expect(services.replies()).toEqual([]);
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    const again = await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" });
    expect(again).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
    await runAlarm(key);
    expect(services.replies().map((reply) => reply.text)).toEqual(["answer"]);
  });
});

describe("a run whose session was ended out of band (by SQL), the run left as it was", () => {
  it("may not reply into it: 409 session_ended, the run not finished, nothing sent", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    await env.DB.prepare(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`)
      .bind(T0, run.sessionId)
      .run();
    const replied = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "late" });
    expect(replied).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    await runAlarm(genericKey(chat));
    expect(services.replies()).toEqual([]);
    const runRow = await env.DB.prepare(`SELECT finished_at FROM runs WHERE id = ?`).bind(run.runId).first();
    expect(runRow).toEqual({ finished_at: null });
  });
});

describe("progress and the run's lease", () => {
  it("is sent after the lease ran out while the session is within its policy", async () => {
    const run = await dispatched(unique("chat"));
    setNow(T0 + RUN_LEASE_MS + MINUTE);
    const warnings = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    expect(await progress(run)).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(loggedLines(warnings, "progress delivery failed")).toEqual([]);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
  });

  it("is sent past the session's deadline while the lease still holds it open (invariant 6)", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 1 }) }));
    const run = await dispatched(unique("chat"));
    setNow(T0 + 2 * MINUTE);
    expect(await progress(run)).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
  });

  it("past the deadline, at the very moment the lease ends, the session ends by its policy and nothing is sent", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 1 }) }));
    const run = await dispatched(unique("chat"));
    setNow(T0 + RUN_LEASE_MS);
    expect(await progress(run)).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect(services.replies()).toEqual([]);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle" });
  });
});

describe("progress that cannot reach the chat", () => {
  it("with no reply URL configured: owns, not sent, nothing sent", async () => {
    const run = await dispatched(unique("chat"));
    useConfig(agentConfig({ HOOK_URLS: "", GENERIC_REPLY_URL: "" }));
    const warnings = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    expect(await progress(run)).toEqual({ status: 200, body: { owns: true, sent: false } });
    expect(services.calls.filter((call) => call.url !== AGENT_URL)).toEqual([]);
    // Not attempted: no failed delivery recorded, no failure logged.
    const rows = await env.DB.prepare(`SELECT id FROM deliveries WHERE session_id = ?`).bind(run.sessionId).all();
    expect(rows.results).toEqual([]);
    expect(loggedLines(warnings, "progress delivery failed")).toEqual([]);
  });

  it("that the chat refuses: owns, not sent, logged, and recorded as a failed progress delivery", async () => {
    const run = await dispatched(unique("chat"));
    services.restore();
    const chatDown = captureFetch((request) =>
      request.url === REPLY_URL ? new Response("down", { status: 502 }) : accepted(),
    );
    const warnings = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    expect(await progress(run, "still on it")).toEqual({ status: 200, body: { owns: true, sent: false } });
    expect(chatDown.calls.map((call) => call.url)).toEqual([REPLY_URL]);
    chatDown.restore();
    const [line] = loggedLines(warnings, "progress delivery failed");
    expect(line).toMatchObject({
      session_key: expect.any(String),
      session_id: run.sessionId,
      delivery_id: expect.stringMatching(/^dl_/),
      platform: "generic",
      status: 502,
    });
    const rows = await env.DB.prepare(
      `SELECT id, kind, status, attempts, last_status FROM deliveries WHERE session_id = ? AND kind = 'progress'`,
    )
      .bind(run.sessionId)
      .all();
    expect(rows.results).toEqual([
      { id: line!.delivery_id, kind: "progress", status: "failed", attempts: 1, last_status: 502 },
    ]);
  });
});

describe("what a rotation leaves", () => {
  it("the parent ended for good (nothing left for the sweep), counted once, the continuation counted as created", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    const created = metrics.sessions_created;
    const compressed = metrics.sessions_ended.compression ?? 0;
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(rotated.status).toBe(200);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "compression", sweep_at: null });
    expect(metrics.sessions_created).toBe(created + 1);
    expect(metrics.sessions_ended.compression).toBe(compressed + 1);
  });

  it("the continuation's next run is not its first: is_new false, and no reset", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat, "long conversation");
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "summary" });
    await send({ chat_id: chat, text: "and then" });
    await runAlarm(genericKey(chat));
    const next = services.agentCalls().at(-1)!.json;
    expect(next.session).toMatchObject({ id: rotated.body.session_id, is_new: false, parent_id: run.sessionId });
    expect(next.session.reset ?? null).toBeNull();
  });

  it("a hand-off refused before /new is not retried, neither in the next session nor in its continuation", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    let refuse = true;
    services.restore();
    services = fakeServices(() => (refuse ? new Response("busy", { status: 503 }) : accepted()));
    const first = await send({ chat_id: chat, text: "before /new" });
    await runAlarm(key); // refused: its retry waits in the outbox
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["run"]);
    await send({ chat_id: chat, text: "/new" });
    refuse = false;
    const run = await dispatched(chat, "after /new");
    expect(run.sessionId).not.toBe(first.body.session_id);
    expect(await router(key).outbox()).toEqual([]); // the refused hand-off went with its session
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(rotated.status).toBe(200);
    setNow(T0 + 10 * MINUTE); // past every retry's backoff
    await runAlarm(key);
    await router(key).drained();
    const handedOver = services.agentCalls().map((call) => [call.json.session.id, call.json.messages.at(-1)?.text]);
    expect(handedOver).toEqual([
      [first.body.session_id, "before /new"],
      [run.sessionId, "after /new"],
    ]);
    const continuation = await env.DB.prepare(`SELECT role, text FROM messages WHERE session_id = ?`)
      .bind(rotated.body.session_id)
      .all();
    expect(continuation.results).toEqual([]);
  });

  it("a rotation of an ended session is refused and starts nothing", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "agent_close" });
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(rotated).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    const rows = await env.DB.prepare(`SELECT id FROM sessions WHERE session_key = ?`).bind(genericKey(chat)).all();
    expect(rows.results).toEqual([{ id: run.sessionId }]);
  });
});

describe("a rotation of a session ended out of band (by SQL), its run left as it was", () => {
  it("is refused, starts nothing, and the run stays with its session", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    await env.DB.prepare(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`)
      .bind(T0, run.sessionId)
      .run();
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    expect(rotated).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    const runRow = await env.DB.prepare(`SELECT session_id FROM runs WHERE id = ?`).bind(run.runId).first();
    expect(runRow).toEqual({ session_id: run.sessionId });
    const rows = await env.DB.prepare(`SELECT id FROM sessions WHERE session_key = ?`).bind(genericKey(chat)).all();
    expect(rows.results).toEqual([{ id: run.sessionId }]);
  });
});

describe("sessions one after another", () => {
  it("a session started in the same millisecond as the one it replaces starts after it, and both ids say ses_", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "hello" });
    const fresh = await send({ chat_id: chat, text: "/new" });
    const [a, b] = [await sessionRow(first.body.session_id), await sessionRow(fresh.body.session_id)];
    expect(a!.started_at).toBe(T0);
    expect(b!.started_at).toBeGreaterThan(T0);
    expect([a!.id, b!.id]).toEqual([expect.stringMatching(/^ses_/), expect.stringMatching(/^ses_/)]);
  });

  it("a continuation rotated in the same millisecond starts after its parent, with a ses_ id", async () => {
    const run = await dispatched(unique("chat"));
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, {});
    const continuation = await sessionRow(rotated.body.session_id);
    expect(continuation!.id).toMatch(/^ses_/);
    expect(continuation!.started_at).toBeGreaterThan((await sessionRow(run.sessionId))!.started_at);
  });
});

describe("an agent that replies through the run API, then in its response as well", () => {
  it("is heard once: one reply delivered, and the session's idle deadline counts from the reply recorded", async () => {
    services.restore();
    services = fakeServices(async (request) => {
      setNow(T0 + 5 * MINUTE);
      const { run_id, run_token } = request.json;
      expect(await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "answer" })).toMatchObject({ status: 200 });
      // The response comes back a quarter of an hour later, carrying the reply again.
      setNow(T0 + 20 * MINUTE);
      return replyWith("answer, again");
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "question" });
    await runAlarm(key);
    await router(key).drained();
    // The API's reply was staged while the hand-off was in flight: the next alarm sends it.
    await runAlarm(key);
    await router(key).drained();
    expect(services.replies().map((reply) => reply.text)).toEqual(["answer"]);
    const row = await sessionRow(sent.body.session_id);
    expect(row).toMatchObject({ end_reason: null, last_active_at: T0 + 5 * MINUTE });
    // The alarm is set for the deadline of the reply D1 recorded, not the second one's.
    expect(await alarmOf(key)).toBe(T0 + 65 * MINUTE + 1);
  });
});
