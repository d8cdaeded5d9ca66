/**
 * What lands while the routing object is between two steps, as the agent, the user
 * and the operator see it: a second reply of the same run recorded between the
 * object's read and its batch (`injectD1Fault`'s `before` runs it on the same D1), a
 * reply posted again for a run that finished with nothing to say, a run stopped
 * while its hand-off was in flight, then refused by the agent, a hand-off of an ended
 * session still staged when the live session is looked at past its deadline, and the
 * alarm a message's hand-off has set before D1 is asked to store the message.
 */
import { describe, expect, it, vi } from "vitest";
import { Database, injectD1Fault } from "../../src/db/client";
import { recordReply } from "../../src/db/runs";
import { MINUTE, alarmOf, T0, adminFetch, genericKey, messagesOf, runAlarm, send, setNow, unique } from "../helpers";
import { agentApi, agentTestHooks, dispatchedThrough, replyWith } from "./support";

const agent = agentTestHooks();

/** The session as the operator API shows it. */
const view = async (sessionId: string) => (await (await adminFetch(`/admin/sessions/${sessionId}`)).json()) as any;

/** The batch that records a run's reply. */
const recordsAReply = (sql: readonly string[]) => sql.some((s) => s.startsWith("UPDATE runs SET finished_at"));

describe("a second run API reply of the same run, recorded between the first's read and its batch", () => {
  it("answers 409 finished, and only the reply recorded first is delivered", async () => {
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat, "question");
    // Another instance records the same run's reply first, by the gateway's own statements.
    injectD1Fault({
      match: recordsAReply,
      before: (db) =>
        new Database(db, "background").batch(
          ...recordReply({
            runId: run.runId,
            sessionId: run.sessionId,
            text: "first answer",
            liveSince: T0 - 60 * MINUTE,
            held: false,
            now: T0,
            deliverable: true,
            clearNotice: true,
          }),
        ),
    });
    const second = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "second answer" });
    expect(second).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
    await runAlarm(genericKey(chat));
    expect(agent.services.replies().map((reply) => reply.text)).toEqual(["first answer"]);
    expect((await messagesOf(run.sessionId)).map((m) => m.text)).toEqual(["question", "first answer"]);
  });
});

describe("a run that finished with nothing to say (a 200 with a null reply)", () => {
  it("answers a later run API reply 409 finished, and nothing is sent", async () => {
    agent.answerWith(() => replyWith(null));
    const chat = unique("chat");
    const run = await dispatchedThrough(agent.services, chat, "question");
    const late = await agentApi(`/v1/runs/${run.runId}/reply`, run.token, { text: "after all" });
    expect(late).toEqual({ status: 409, body: { owns: false, reason: "finished" } });
    await runAlarm(genericKey(chat));
    expect(agent.services.replies()).toEqual([]);
    expect((await messagesOf(run.sessionId)).map((m) => m.text)).toEqual(["question"]);
  });
});

describe("a run stopped while its hand-off was in flight, which the agent then refused", () => {
  it("shows as revoked, and the operator's retry is 409 not_failed: nothing is handed over again", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    agent.answerWith(async () => {
      // While the agent looks at the run, the user stops it; then the agent refuses it.
      await send({ chat_id: chat, text: "/stop" });
      return new Response("bad request", { status: 400 });
    });
    vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const sent = await send({ chat_id: chat, text: "question" });
    await runAlarm(key);
    const [run] = (await view(sent.body.session_id)).runs;
    // Failed (the 400) and revoked (the /stop) both: revoked is what shows.
    expect(run).toMatchObject({ status: "revoked", revoked_reason: "stopped", last_error: "HTTP 400: bad request" });
    const retried = await adminFetch(`/admin/runs/${run.run_id}/retry`, { method: "POST" });
    expect(retried.status).toBe(409);
    expect(((await retried.json()) as any).error).toEqual({
      code: "not_failed",
      message: `run ${run.run_id} has not failed`,
    });
    await runAlarm(key);
    expect(agent.services.agentCalls()).toHaveLength(1);
  });
});

describe("a hand-off of an ended session still staged when the live session is looked at past its deadline", () => {
  it("does not hold that session open: the alarm at its deadline ends it", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    // "yesterday" is never handed over before "/new" ends its session: its hand-off stays staged.
    await send({ chat_id: chat, text: "yesterday" });
    const fresh = await send({ chat_id: chat, text: "/new" });
    // Idle past the test config's 60-minute policy, before any alarm ran.
    setNow(T0 + 61 * MINUTE);
    await runAlarm(key);
    expect((await view(fresh.body.session_id)).session).toMatchObject({ end_reason: "idle" });
    expect(agent.services.agentCalls()).toEqual([]);
  });
});

describe("a message's hand-off, while D1 stores the message", () => {
  it("already has the alarm set for it, so an object that dies during the D1 call still wakes to hand it over", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    let alarmWhileStoring: number | null | undefined;
    injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("INSERT INTO messages")),
      before: async () => {
        alarmWhileStoring = await alarmOf(key);
      },
    });
    const sent = await send({ chat_id: chat, text: "hello" });
    expect(sent.status).toBe(200);
    expect(alarmWhileStoring).toBe(T0 + 1);
  });
});
