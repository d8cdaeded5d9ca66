/**
 * OVERLAP `interrupt` through the worker's own fetch and the routing object's alarm
 * (spec "Overlapping messages", invariant 11): a message that arrives while a run is
 * unfinished revokes that run as `superseded` (its heartbeat says so; its reply, even
 * a 200 already on its way, is never recorded nor delivered), and one new run
 * carries the revoked run's messages and the new one. The webhook only stores the
 * message (as in `queue` mode); the alarm carries the interrupt out.
 */
import { env } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { backoffDelay } from "../../src/http/backoff";
import { T0, adminFetch, alarmOf, genericKey, messagesOf, router, runAlarm, send, setNow, unique } from "../helpers";
import { accepted, agentApi, replyWith } from "../agent/support";
import { type FakeServices, overlapHooks, carriedBy, firstHandedOver } from "./overlap-support";

const fake = overlapHooks({ OVERLAP: JSON.stringify({ mode: "interrupt" }) });
let services: FakeServices;

const callTexts = () => carriedBy(services);

async function runOf(runId: string) {
  return env.DB.prepare(`SELECT revoked_reason, finished_at FROM runs WHERE id = ?`).bind(runId).first<any>();
}

describe("interrupt: the agent accepted the run (202)", () => {
  it("revokes it as superseded; one new run carries its message and the new one; its late reply gets 409", async () => {
    services = fake((request) => (request.json.messages.length === 1 ? accepted() : replyWith("to both")));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    const two = await send({ chat_id: chat, text: "two" });
    // The interrupt is the alarm's to carry out, at once (the run's lease alone would wait 10 minutes).
    expect(await alarmOf(key)).toBeLessThanOrEqual(T0 + 2);
    expect(two).toMatchObject({
      status: 200,
      body: { accepted: true, duplicate: false, session_id: one.body.session_id },
    });
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["one", "two"]]);
    const second = services.agentCalls()[1]!.json;
    expect(second.message).toMatchObject({ text: "two" });
    expect(await agentApi(`/v1/runs/${first.run_id}/heartbeat`, first.run_token)).toEqual({
      status: 409,
      body: { owns: false, reason: "superseded" },
    });
    const late = await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "stale answer" });
    expect(late.status).toBe(409);
    await router(key).drained();
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["to both"]);
    expect((await messagesOf(one.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "one"],
      ["user", "two"],
      ["assistant", "to both"],
    ]);
    // Both messages are carried by the new run; the old one shows revoked.
    const body = (await (await adminFetch(`/admin/sessions/${one.body.session_id}`)).json()) as any;
    const users = body.messages.filter((m: any) => m.role === "user");
    expect(users.map((m: any) => m.run_id)).toEqual([second.run_id, second.run_id]);
    // The revoked run carries no message any more; D1 keeps it, revoked, its reply never added.
    expect(body.runs.map((r: any) => [r.run_id, r.status])).toEqual([[second.run_id, "finished"]]);
    expect(await runOf(first.run_id)).toMatchObject({ revoked_reason: "superseded" });
  });
});

describe("interrupt: the agent is slow (a 200 already on its way)", () => {
  it("the revoked run's 200 is never recorded nor delivered", async () => {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let reached!: () => void;
    const called = new Promise<void>((resolve) => (reached = resolve));
    services = fake(async (request) => {
      if (request.json.messages.length === 1) {
        reached();
        await released;
        return replyWith("stale answer");
      }
      return replyWith("to both");
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    const slow = runAlarm(key);
    await called;
    const first = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    // This alarm revokes the slow run, then waits for the drain the slow hand-off holds.
    const interrupting = runAlarm(key);
    for (let i = 0; i < 100 && (await runOf(first.run_id))?.revoked_reason !== "superseded"; i++)
      await new Promise((r) => setTimeout(r, 10));
    expect(await runOf(first.run_id)).toMatchObject({ revoked_reason: "superseded", finished_at: null });
    release();
    await slow;
    await interrupting;
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["one", "two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["to both"]);
    expect((await messagesOf(one.body.session_id)).map((m) => m.text)).toEqual(["one", "two", "to both"]);
  });
});

describe("interrupt: the agent is down (503), then up", () => {
  it("the retried run is replaced by one carrying both messages", async () => {
    let up = false;
    services = fake(() => (up ? replyWith("to both") : new Response("down", { status: 503 })));
    const chat = unique("chat");
    const key = genericKey(chat);
    const one = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    up = true;
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["one", "two"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["to both"]);
    expect((await messagesOf(one.body.session_id)).map((m) => m.text)).toEqual(["one", "two", "to both"]);
  });
});

describe("interrupt: nothing unfinished", () => {
  it("a run that failed for good (4xx) is not revoked: the next message gets its own run", async () => {
    services = fake((request) =>
      request.json.message.text === "bad" ? new Response("no", { status: 400 }) : replyWith("fine"),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "bad" });
    await runAlarm(key);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "good" });
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["bad"], ["good"]]);
    expect(services.replies().map((r) => r.text)).toEqual(["fine"]);
  });
});

describe("interrupt: D1 refuses the interrupt's batch", () => {
  it("nothing is handed over beside the run it could not revoke; the alarm backs off, longer each time, then the interrupt lands", async () => {
    services = fake((request) => (request.json.messages.length === 1 ? accepted() : replyWith("to both")));
    const chat = unique("chat");
    const { key } = await firstHandedOver(services, chat);
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    const revoking = (sql: readonly string[]) => sql.some((s) => s.includes("revoked_reason = 'superseded'"));
    injectD1Fault({ match: revoking, times: 4 });
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    let at = T0 + 1;
    for (const failure of [1, 2, 3, 4]) {
      await runAlarm(key);
      expect(await alarmOf(key)).toBe(at + backoffDelay(failure));
      at += backoffDelay(failure);
      setNow(at);
    }
    expect(callTexts()).toEqual([["one"]]);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(callTexts()).toEqual([["one"], ["one", "two"]]);
  });
});
