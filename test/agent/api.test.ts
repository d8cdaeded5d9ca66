/**
 * The agent API (spec invariant 8): run ownership through heartbeats, progress,
 * ending and rotating a session, and scheduled jobs. Bad tokens are 401, another
 * run's token 403, unknown ids 404, and none of them change anything.
 */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  ADMIN_TOKEN,
  BASE,
  T0,
  adminFetch,
  alarmAfterRestart,
  eventsOf,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { COMMAND_REPLIES } from "../../src/domain/commands";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import {
  AGENT_TOKEN,
  accepted,
  agentApi,
  agentConfig,
  CONCURRENT,
  fakeServices,
  replyWith,
  dispatchedThrough,
} from "./support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig());
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

const heartbeat = (run: { runId: string; token: string }) => agentApi(`/v1/runs/${run.runId}/heartbeat`, run.token);

describe("heartbeat", () => {
  it("answers owns: true while the run is current and unfinished, and records when it was heard", async () => {
    const run = await dispatched(unique("chat"));
    setNow(T0 + 30_000);
    expect(await heartbeat(run)).toEqual({ status: 200, body: { owns: true } });
    const row = await env.DB.prepare(`SELECT last_heartbeat_at FROM runs WHERE id = ?`).bind(run.runId).first<any>();
    expect(row.last_heartbeat_at).toBe(T0 + 30_000);
  });

  const cases: [string, (chat: string) => Promise<unknown>, string][] = [
    ["/new", (chat) => send({ chat_id: chat, text: "/new" }), "superseded"],
    ["/reset", (chat) => send({ chat_id: chat, text: "/reset" }), "superseded"],
    // In concurrent mode (in queue mode a newer message waits instead).
    [
      "a newer message",
      (chat) => {
        useConfig(agentConfig(CONCURRENT));
        return dispatched(chat, "newer");
      },
      "superseded",
    ],
    ["/stop", (chat) => send({ chat_id: chat, text: "/stop" }), "stopped"],
  ];
  for (const [what, act, reason] of cases) {
    it(`answers 409 ${reason} after ${what}`, async () => {
      const chat = unique("chat");
      const run = await dispatched(chat);
      await act(chat);
      expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason } });
    });
  }

  it("answers 409 finished once the reply is recorded", async () => {
    const run = await dispatched(unique("chat"));
    await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "done" });
    expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
  });

  it("answers 409 session_ended after an operator end or an expiry", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    await adminFetch(`/admin/sessions/${run.sessionId}/end`, { method: "POST" });
    expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    const other = unique("chat");
    const expiring = await dispatched(other);
    setNow(T0 + 61 * 60_000);
    await runAlarm(genericKey(other));
    expect(await heartbeat(expiring)).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
  });
});

it("a recoverable end written by SQL revokes the run when a message reopens the row: no rotate, no end by it", async () => {
  const chat = unique("chat");
  const run = await dispatched(chat);
  // Out of band, without the gateway: its runs are not revoked yet.
  await env.DB.prepare(`UPDATE sessions SET end_reason = 'orphan_reap', ended_at = ? WHERE id = ?`)
    .bind(T0 + 1, run.sessionId)
    .run();
  setNow(T0 + 1_000);
  const again = await send({ chat_id: chat, text: "still there?" });
  expect(again.body.session_id).toBe(run.sessionId); // reopened, same id
  expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
  const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, { reason: "compression" });
  expect(rotated.status).toBe(409);
  expect((await sessionRow(run.sessionId))!.end_reason).toBeNull();
});

describe("tokens", () => {
  it("401 without a token or with a wrong one, 403 with another run's token, 404 for an unknown run", async () => {
    const a = await dispatched(unique("chat"));
    const b = await dispatched(unique("chat"));
    expect((await agentApi(`/v1/runs/${a.runId}/heartbeat`, null)).status).toBe(401);
    expect((await agentApi(`/v1/runs/${a.runId}/heartbeat`, `${a.runId}.wrong`)).status).toBe(401);
    expect((await agentApi(`/v1/runs/${a.runId}/heartbeat`, "garbage")).status).toBe(401);
    // A valid token of another kind is a 403: AGENT_TOKEN here, a run token at the operator or cron API.
    expect((await agentApi(`/v1/runs/${a.runId}/heartbeat`, AGENT_TOKEN)).status).toBe(403);
    expect((await agentApi(`/v1/cron/runs`, a.token, { job_id: "j", text: "t" })).status).toBe(403);
    expect(
      (
        await exports.default.fetch(
          new Request(`${BASE}/admin/metrics`, { headers: { authorization: `Bearer ${a.token}` } }),
        )
      ).status,
    ).toBe(403);
    expect((await agentApi(`/v1/runs/${a.runId}/heartbeat`, b.token)).status).toBe(403);
    expect((await agentApi(`/v1/runs/run_unknown/heartbeat`, a.token)).status).toBe(404);
    // The token is checked before the id: an unknown run with a bad token is a 401.
    expect((await agentApi(`/v1/runs/run_unknown/heartbeat`, "run_unknown.guess")).status).toBe(401);
    expect((await agentApi(`/v1/runs/run_unknown/heartbeat`, null)).status).toBe(401);
    expect((await agentApi(`/v1/runs/${a.runId}/reply`, b.token, { text: "not mine" })).status).toBe(403);
    expect((await agentApi(`/v1/sessions/${a.sessionId}/end`, b.token, {})).status).toBe(403);
    expect((await agentApi(`/v1/sessions/${a.sessionId}/end`, `${a.runId}.wrong`, {})).status).toBe(401);
    expect((await agentApi(`/v1/sessions/ses_unknown/end`, a.token, {})).status).toBe(404);
    // Nothing changed.
    expect(await sessionRow(a.sessionId)).toMatchObject({ end_reason: null });
    expect((await messagesOf(a.sessionId)).map((m) => m.role)).toEqual(["user"]);
    expect(await heartbeat(a)).toEqual({ status: 200, body: { owns: true } });
  });

  it("400 for a malformed body, and nothing changes", async () => {
    const run = await dispatched(unique("chat"));
    expect((await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { texte: "typo" })).status).toBe(400);
    expect((await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "   " })).status).toBe(400);
    expect((await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "" })).status).toBe(400);
    expect((await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "bored" })).status).toBe(400);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null, message_count: 1 });
  });
});

describe("progress", () => {
  it("sends progress to the chat while the run owns its session", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    const posted = await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "working on it" });
    expect(posted).toEqual({ status: 200, body: { owns: true, sent: true } });
    expect(services.replies()).toEqual([
      {
        kind: "progress",
        event_id: expect.any(String),
        session_key: genericKey(chat),
        session_id: run.sessionId,
        text: "working on it",
      },
    ]);
    const detail = (await (await adminFetch(`/admin/sessions/${run.sessionId}`)).json()) as any;
    expect(detail.deliveries.map((d: any) => [d.kind, d.status])).toEqual([["progress", "sent"]]);
    // Progress is not a message and not activity.
    expect((await messagesOf(run.sessionId)).map((m) => m.role)).toEqual(["user"]);
  });

  it("sends nothing and answers 409 once /new took the run's place", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    await send({ chat_id: chat, text: "/new" });
    await runAlarm(genericKey(chat));
    const before = services.replies().length;
    const posted = await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "still working" });
    expect(posted).toEqual({ status: 409, body: { owns: false, reason: "superseded" } });
    expect(services.replies()).toHaveLength(before);
  });

  it("past the session's deadline, before its alarm ran: 409 session_ended, nothing sent, and the session ends by its policy once", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat);
    setNow(T0 + 61 * 60_000); // idle_minutes is 60; the alarm has not run
    expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null }); // the heartbeat only reads
    const posted = await agentApi(`/v1/runs/${run.runId}/progress`, run.token, { text: "still working" });
    expect(posted).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect(services.replies()).toEqual([]);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle" });
    await runAlarm(genericKey(chat));
    expect((await eventsOf(run.sessionId)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });
});

/** A session answered at T0 and closed by its agent (agent_close), with the clock half an hour on. */
async function closedByAgentHalfAnHourAgo() {
  useConfig(agentConfig({ HOOK_URLS: "", HOOK_SECRET: "" }));
  const chat = unique("chat");
  const run = await dispatched(chat, "first");
  await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
  await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "agent_close" });
  setNow(T0 + 30 * 60_000);
  return { chat, run };
}

describe("ending a session through the agent API", () => {
  it("the current run may end it; agent_close leaves it recoverable and the next message resumes it without finalizing", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", HOOK_SECRET: "" }));
    const chat = unique("chat");
    const run = await dispatched(chat, "first");
    const ended = await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token, { reason: "agent_close" });
    expect(ended.status).toBe(200);
    expect(ended.body).toMatchObject({ changed: true, session: { id: run.sessionId, end_reason: "agent_close" } });
    const next = await send({ chat_id: chat, text: "second" });
    expect(next.body.session_id).toBe(run.sessionId);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
    expect((await messagesOf(run.sessionId)).map((m) => m.text)).toEqual(["first", "second"]);
    const types = (await eventsOf(run.sessionId)).map((e) => e.type);
    expect(types).toContain("session.ended");
    expect(types).not.toContain("session.finalized");
  });

  it("a session the agent closed, then replaced by /new, is still finalized at its own deadline", async () => {
    const { chat, run } = await closedByAgentHalfAnHourAgo();
    const fresh = await send({ chat_id: chat, text: "/new" });
    expect(fresh.body.session_id).not.toBe(run.sessionId);
    await runAlarm(genericKey(chat));
    expect((await eventsOf(run.sessionId)).map((e) => e.type)).not.toContain("session.finalized");
    // Idle 60 minutes from its last activity at T0: the old row's deadline, not the fresh one's.
    setNow(T0 + 61 * 60_000);
    await runAlarm(genericKey(chat));
    expect((await eventsOf(run.sessionId)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
    // A recoverable row past its deadline is no longer recoverable: the policy's reason replaces it.
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "idle" });
    expect(await sessionRow(fresh.body.session_id)).toMatchObject({ end_reason: null });
  });

  it("a /stop over a session the agent closed stops nothing, and the session is still finalized at its deadline", async () => {
    const { chat, run } = await closedByAgentHalfAnHourAgo();
    const stop = await send({ chat_id: chat, text: "/stop" });
    expect(stop.body.session_id).toBe(run.sessionId);
    await runAlarm(genericKey(chat));
    expect(services.replies().map((reply) => reply.text)).toEqual(["answer", COMMAND_REPLIES.nothingToStop]);
    setNow(T0 + 61 * 60_000);
    await runAlarm(genericKey(chat));
    expect((await eventsOf(run.sessionId)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });

  it("defaults to agent_close, and a finished current run may still end it", async () => {
    const run = await dispatched(unique("chat"));
    await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    const ended = await agentApi(`/v1/sessions/${run.sessionId}/end`, run.token);
    expect(ended.body).toMatchObject({ changed: true, session: { end_reason: "agent_close" } });
  });

  it("a run that is not current gets 409 and nothing changes", async () => {
    useConfig(agentConfig(CONCURRENT));
    const chat = unique("chat");
    const old = await dispatched(chat, "one");
    await dispatched(chat, "two");
    const ended = await agentApi(`/v1/sessions/${old.sessionId}/end`, old.token, { reason: "agent_close" });
    expect(ended).toEqual({ status: 409, body: { owns: false, reason: "superseded" } });
    expect(await sessionRow(old.sessionId)).toMatchObject({ end_reason: null, ended_at: null });
  });

  it("an already ended row answers 200 unchanged to any run of it: first reason wins, no second event", async () => {
    const chat = unique("chat");
    const old = await dispatched(chat, "one");
    const current = await dispatched(chat, "two");
    await agentApi(`/v1/sessions/${current.sessionId}/end`, current.token, { reason: "admin" });
    const eventsBefore = await eventsOf(old.sessionId);
    const again = await agentApi(`/v1/sessions/${old.sessionId}/end`, old.token, { reason: "agent_close" });
    expect(again.status).toBe(200);
    expect(again.body).toMatchObject({ changed: false, session: { end_reason: "admin" } });
    expect(await eventsOf(old.sessionId)).toEqual(eventsBefore);
  });
});

describe("rotation", () => {
  it("ends the session as compression and the next message lands in the continuation", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await dispatched(chat, "long conversation");
    setNow(T0 + 60_000);
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, { reason: "compression" });
    expect(rotated.status).toBe(200);
    const continuation = rotated.body.session_id as string;
    expect(continuation).not.toBe(run.sessionId);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: "compression" });
    expect(await sessionRow(continuation)).toMatchObject({
      end_reason: null,
      parent_session_id: run.sessionId,
      session_key: key,
      last_active_at: T0, // the idle clock carries over
    });
    // The run moved, still current, to the continuation.
    expect(await heartbeat(run)).toEqual({ status: 200, body: { owns: true } });
    const next = await send({ chat_id: chat, text: "and then" });
    expect(next.body.session_id).toBe(continuation);
    // Only session.started (with its parent) for the continuation; no reset, no finalized.
    const events = await eventsOf(continuation);
    expect(events.map((e) => e.type)).toEqual(["session.started"]);
    expect(JSON.parse(events[0]!.payload)).toMatchObject({ parent_session_id: run.sessionId });
    expect((await eventsOf(run.sessionId)).map((e) => e.type)).not.toContain("session.finalized");
    // The moved run's reply lands in the continuation.
    await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "summary so far" });
    expect((await messagesOf(continuation)).map((m) => m.text)).toEqual(["and then", "summary so far"]);
  });

  it("a session ended by SQL between the rotation's read and its batch: 409 session_ended, no continuation, the run stays", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const run = await dispatched(chat, "long conversation");
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("UPDATE runs SET session_id")),
      before: (db) =>
        db
          .prepare(`UPDATE sessions SET end_reason = 'agent_close', ended_at = ? WHERE id = ?`)
          .bind(T0, run.sessionId)
          .run(),
    });
    setNow(T0 + 60_000);
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, { reason: "compression" });
    expect(slipped.hits()).toBe(1);
    expect(rotated).toEqual({ status: 409, body: { owns: false, reason: "session_ended" } });
    expect((await sessionsOfKey(key)).map((row) => row.id)).toEqual([run.sessionId]);
    const moved = await env.DB.prepare(`SELECT session_id FROM runs WHERE id = ?`).bind(run.runId).first<any>();
    expect(moved.session_id).toBe(run.sessionId);
    // The next message lands in no continuation: it reopens the session (agent_close is recoverable).
    const next = await send({ chat_id: chat, text: "and then" });
    expect(next.body.session_id).toBe(run.sessionId);
    expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null });
  });

  it("only the current run may rotate", async () => {
    useConfig(agentConfig(CONCURRENT));
    const chat = unique("chat");
    const old = await dispatched(chat, "one");
    await dispatched(chat, "two");
    expect(await agentApi(`/v1/sessions/${old.sessionId}/rotate`, old.token, {})).toEqual({
      status: 409,
      body: { owns: false, reason: "superseded" },
    });
    expect(await sessionRow(old.sessionId)).toMatchObject({ end_reason: null });
  });
});

describe("scheduled jobs", () => {
  it("runs the text in a session of its own, which ends as cron_complete when the run finishes", async () => {
    services.restore();
    services = fakeServices(() => replyWith("report ready"));
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "nightly", text: "summarise the day" });
    expect(response.status).toBe(200);
    const { run_id, session_id, session_key } = response.body;
    expect(session_key).toBe(`cron:nightly:${run_id}`);
    await runAlarm(session_key);
    const [call] = services.agentCalls();
    expect(call!.json).toMatchObject({ run_id, session: { id: session_id, key: session_key, is_new: true } });
    expect(call!.json.message).toMatchObject({ platform: "cron", text: "summarise the day" });
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: "cron_complete" });
    expect((await messagesOf(session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "summarise the day"],
      ["assistant", "report ready"],
    ]);
    expect(services.replies()).toEqual([]);
  });

  it("is handed over at once even with a debounce window set: a job's one message waits for no other", async () => {
    useConfig(agentConfig({ OVERLAP: JSON.stringify({ debounce_ms: 60_000 }) }));
    services.restore();
    services = fakeServices(() => replyWith("report ready"));
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "nightly", text: "summarise the day" });
    await runAlarm(response.body.session_key);
    expect(services.agentCalls().map((call) => call.json.message.text)).toEqual(["summarise the day"]);
    expect(await sessionRow(response.body.session_id)).toMatchObject({ end_reason: "cron_complete" });
  });

  it("ends as cron_complete when the agent ends the session itself", async () => {
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "weekly", text: "clean up" });
    await runAlarm(response.body.session_key);
    const token = services.agentCalls()[0]!.json.run_token;
    const ended = await agentApi(`/v1/sessions/${response.body.session_id}/end`, token, { reason: "agent_close" });
    expect(ended.body).toMatchObject({ changed: true, session: { end_reason: "cron_complete" } });
  });

  it("ends as cron_complete, finalized once, when the agent refuses the run for good", async () => {
    services.restore();
    services = fakeServices(() => new Response("bad request", { status: 400 }));
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "broken", text: "do it" });
    const { run_id, session_id, session_key } = response.body;
    await runAlarm(session_key);
    expect(services.agentCalls()).toHaveLength(1);
    const run = await env.DB.prepare(`SELECT failed_at FROM runs WHERE id = ?`).bind(run_id).first<any>();
    expect(run.failed_at).toBe(T0);
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: "cron_complete" });
    expect((await eventsOf(session_id)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });

  it("an accepted job's session is held by its run: a fresh instance's alarm does not end it while the lease runs", async () => {
    services.restore();
    services = fakeServices(() => accepted());
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "slow", text: "take your time" });
    const { session_id, session_key } = response.body;
    await runAlarm(session_key);
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    setNow(T0 + 60_000);
    await alarmAfterRestart(session_key);
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: null });
    expect(await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "done" })).toMatchObject({ status: 200 });
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: "cron_complete" });
  });

  it("a job whose reply D1 recorded, the object killed before it ended the session, still ends as cron_complete", async () => {
    services.restore();
    services = fakeServices(() => accepted());
    const response = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "killed", text: "do it" });
    const { session_id, session_key } = response.body;
    await runAlarm(session_key);
    const { run_id, run_token } = services.agentCalls()[0]!.json;
    // The reply's batch commits; the object dies before it ends the job's session.
    injectD1Fault({ afterCommit: true, match: (sql) => sql.some((s) => s.includes("UPDATE runs SET finished_at")) });
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "done" })).status).toBeGreaterThanOrEqual(
      500,
    );
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: null });
    // The job has no run left: the next look (at the run's lease end) finds it over.
    setNow(T0 + RUN_LEASE_MS + 1);
    await runAlarm(session_key);
    expect(await sessionRow(session_id)).toMatchObject({ end_reason: "cron_complete" });
    expect((await eventsOf(session_id)).filter((e) => e.type === "session.finalized")).toHaveLength(1);
  });

  it("is authorised by AGENT_TOKEN only", async () => {
    expect((await agentApi(`/v1/cron/runs`, null, { job_id: "j", text: "t" })).status).toBe(401);
    expect((await agentApi(`/v1/cron/runs`, "nope", { job_id: "j", text: "t" })).status).toBe(401);
    expect((await agentApi(`/v1/cron/runs`, ADMIN_TOKEN, { job_id: "j", text: "t" })).status).toBe(403);
    expect((await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "j" })).status).toBe(400);
    const count = await env.DB.prepare(
      `SELECT COUNT(*) AS n FROM sessions WHERE session_key LIKE 'cron:j:%'`,
    ).first<any>();
    expect(count.n).toBe(0);
  });
});

describe("runs acting on sessions", () => {
  it("an old run ending the key's new session gets 409 superseded; a run of another conversation gets 403", async () => {
    const chat = unique("chat");
    const old = await dispatched(chat, "one");
    const command = await send({ chat_id: chat, text: "/new" });
    const fresh = command.body.session_id as string;
    expect(await agentApi(`/v1/sessions/${fresh}/end`, old.token, { reason: "agent_close" })).toEqual({
      status: 409,
      body: { owns: false, reason: "superseded" },
    });
    expect(await agentApi(`/v1/sessions/${fresh}/rotate`, old.token, {})).toEqual({
      status: 409,
      body: { owns: false, reason: "superseded" },
    });
    const stranger = await dispatched(unique("other"), "elsewhere");
    expect((await agentApi(`/v1/sessions/${fresh}/end`, stranger.token, {})).status).toBe(403);
    expect(await sessionRow(fresh)).toMatchObject({ end_reason: null });
  });

  it("a rotation after the run replied keeps it current in the continuation: finished, and it may end it", async () => {
    const chat = unique("chat");
    const run = await dispatched(chat, "question");
    await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "answer" });
    const rotated = await agentApi(`/v1/sessions/${run.sessionId}/rotate`, run.token, { reason: "compression" });
    expect(rotated.status).toBe(200);
    expect(await heartbeat(run)).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
    const ended = await agentApi(`/v1/sessions/${rotated.body.session_id}/end`, run.token, { reason: "agent_close" });
    expect(ended.status).toBe(200);
    expect(ended.body).toMatchObject({ changed: true, session: { end_reason: "agent_close" } });
  });
});

it("answers 500 naming the key on every agent route while the configuration is invalid, and changes nothing", async () => {
  const run = await dispatched(unique("chat"));
  useConfig(agentConfig({ SESSION_RESET: `{"mode": "sometimes"}` }));
  const calls: [string, unknown][] = [
    [`/v1/runs/${run.runId}/heartbeat`, undefined],
    [`/v1/runs/${run.runId}/progress`, { text: "working" }],
    [`/v1/runs/${run.runId}/reply`, { text: "done" }],
    [`/v1/sessions/${run.sessionId}/end`, { reason: "agent_close" }],
    [`/v1/sessions/${run.sessionId}/rotate`, {}],
  ];
  for (const [path, body] of calls) {
    const answer = await agentApi(path, run.token, body);
    expect(answer.status, path).toBe(500);
    expect(answer.body.error.code, path).toBe("invalid_config");
    expect(answer.body.error.message, path).toContain("SESSION_RESET.mode");
  }
  const cron = await agentApi(`/v1/cron/runs`, AGENT_TOKEN, { job_id: "j", text: "t" });
  expect(cron.status).toBe(500);
  expect(await sessionRow(run.sessionId)).toMatchObject({ end_reason: null, message_count: 1 });
  const stored = await env.DB.prepare(`SELECT finished_at FROM runs WHERE id = ?`).bind(run.runId).first<any>();
  expect(stored.finished_at).toBeNull();
});
