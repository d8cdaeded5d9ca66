/**
 * Nothing hidden from the operator (spec invariant 12): a run whose hand-off failed
 * for good and a reply delivery dead-lettered show in `GET /admin/sessions/{id}`
 * (`runs`, `deliveries`), are counted (`runs_failed`, `deliveries_failed`), and can
 * be retried: `POST /admin/runs/{id}/retry`, `POST /admin/deliveries/{event_id}/retry`,
 * each 200 with the item as it now stands, 404 unknown, 409 not failed.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  MINUTE,
  T0,
  adminFetch,
  captureFetch,
  genericKey,
  loggedLines,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { AGENT_URL, REPLY_URL, accepted, agentApi, agentConfig, replyWith } from "../agent/support";

let agentAnswer: (request: Captured) => Response;
let replyAnswer: () => Response;
let outbound: ReturnType<typeof captureFetch>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
  agentAnswer = () => replyWith("hi");
  replyAnswer = () => new Response("ok");
  outbound = captureFetch((request) => {
    if (request.url === AGENT_URL) return agentAnswer(request);
    if (request.url === REPLY_URL) return replyAnswer();
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
});
afterEach(() => {
  vi.restoreAllMocks();
  injectD1Fault(null);
  outbound.restore();
  restoreClock();
  useConfig(null);
});

const agentCalls = () => outbound.calls.filter((c) => c.url === AGENT_URL);
const replies = () => outbound.calls.filter((c) => c.url === REPLY_URL).map((c) => c.json);
const view = async (sessionId: string) => (await (await adminFetch(`/admin/sessions/${sessionId}`)).json()) as any;
const metrics = async () => (await (await adminFetch(`/admin/metrics`)).json()) as any;
const post = (path: string) => adminFetch(path, { method: "POST" });

describe("runs in the session answer", () => {
  it("lists each run with its status, attempts, last error and times", async () => {
    let status = 503;
    agentAnswer = () => (status === 202 ? accepted() : new Response("busy", { status }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1_000);
    await runAlarm(key);
    const [retrying] = (await view(sent.body.session_id)).runs;
    expect(retrying).toEqual({
      run_id: expect.stringMatching(/^run_/),
      status: "dispatching",
      attempts: 2,
      last_error: "HTTP 503: busy",
      revoked_reason: null,
      created_at: T0,
      finished_at: null,
      event_id: sent.eventId,
    });
    status = 202;
    setNow(T0 + 3_000);
    await runAlarm(key);
    expect((await view(sent.body.session_id)).runs).toMatchObject([{ status: "running", attempts: 3 }]);
    await send({ chat_id: chat, text: "/new" });
    expect((await view(sent.body.session_id)).runs).toMatchObject([
      { status: "revoked", revoked_reason: "superseded" },
    ]);
  });

  it("shows a finished run and a failed one", async () => {
    agentAnswer = (request) =>
      request.json.message.text === "refused" ? new Response("no", { status: 422 }) : replyWith("fine");
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "ok" });
    await runAlarm(key);
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "refused" });
    await runAlarm(key);
    expect((await view(sent.body.session_id)).runs).toMatchObject([
      { status: "finished", attempts: 1, finished_at: T0, last_error: null },
      { status: "failed", attempts: 1, finished_at: T0 + MINUTE, last_error: "HTTP 422: no" },
    ]);
  });
});

describe("runs_failed and POST /admin/runs/{id}/retry", () => {
  it("counts a run refused with a 4xx; the retry hands it over again, same run id, and the reply lands", async () => {
    let refuse = true;
    agentAnswer = () => (refuse ? new Response("bad", { status: 400 }) : replyWith("second time lucky"));
    const before = (await metrics()).runs_failed;
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "please" });
    await runAlarm(key);
    expect((await metrics()).runs_failed).toBe(before + 1);
    const [failed] = (await view(sent.body.session_id)).runs;
    expect(failed).toMatchObject({ status: "failed" });

    refuse = false;
    setNow(T0 + MINUTE);
    const retried = await post(`/admin/runs/${failed.run_id}/retry`);
    expect(retried.status).toBe(200);
    expect(((await retried.json()) as any).run).toMatchObject({
      run_id: failed.run_id,
      status: "dispatching",
      attempts: 0,
      last_error: null,
    });
    await runAlarm(key);
    const calls = agentCalls();
    expect(calls).toHaveLength(2);
    expect(calls[1]!.json.run_id).toBe(failed.run_id);
    expect(calls[1]!.json.message.text).toBe("please");
    expect(calls[1]!.json.run_token).not.toBe(calls[0]!.json.run_token);
    expect(replies().map((r) => r.text)).toEqual(["second time lucky"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["please", "second time lucky"]);
    expect((await view(sent.body.session_id)).runs).toMatchObject([
      { run_id: failed.run_id, status: "finished", attempts: 1 },
    ]);
    // Finished now: retrying it again is a 409, and nothing is handed over.
    const again = await post(`/admin/runs/${failed.run_id}/retry`);
    expect(again.status).toBe(409);
    expect(((await again.json()) as any).error.code).toBe("not_failed");
    await runAlarm(key);
    expect(agentCalls()).toHaveLength(2);
  });

  it("the retry hands a run over as it first went: a session's first run is still is_new with its reset, a later run is not", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) }));
    agentAnswer = (request) =>
      ["refused", "also refused"].includes(request.json.message.text)
        ? new Response("bad", { status: 400 })
        : replyWith("fine");
    const chat = unique("chat");
    const key = genericKey(chat);
    const old = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    // Two hours on, the idle reset: the fresh session's first run is refused, and so is its second.
    setNow(T0 + 120 * MINUTE);
    const fresh = await send({ chat_id: chat, text: "refused" });
    await runAlarm(key);
    setNow(T0 + 121 * MINUTE);
    await send({ chat_id: chat, text: "also refused" });
    await runAlarm(key);
    const [first, second] = (await view(fresh.body.session_id)).runs;
    expect([first.status, second.status]).toEqual(["failed", "failed"]);
    const handedFirst = agentCalls().find((c) => c.json.run_id === first.run_id)!.json;
    const reset = { reason: "idle", had_activity: true, previous_session_id: old.body.session_id };
    expect([handedFirst.session.is_new, handedFirst.reset]).toEqual([true, reset]);

    setNow(T0 + 122 * MINUTE);
    for (const run of [first, second]) expect((await post(`/admin/runs/${run.run_id}/retry`)).status).toBe(200);
    await runAlarm(key);
    const retried = agentCalls().slice(-2);
    expect(retried.map((c) => [c.json.run_id, c.json.session.is_new, c.json.reset])).toEqual([
      [first.run_id, true, reset],
      [second.run_id, false, null],
    ]);
  });

  it("a failed first run a rotation moved on is retried in the continuation, which has no first run: not is_new", async () => {
    agentAnswer = (request) =>
      request.json.message.text === "refused" ? new Response("bad", { status: 400 }) : accepted();
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "refused" });
    await runAlarm(key);
    const first = agentCalls()[0]!.json;
    expect(first.session.is_new).toBe(true);
    await send({ chat_id: chat, text: "two" });
    await runAlarm(key);
    const second = agentCalls()[1]!.json;
    const rotated = await agentApi(`/v1/sessions/${sent.body.session_id}/rotate`, second.run_token, {
      reason: "compression",
    });
    expect(rotated.status).toBe(200);
    expect((await post(`/admin/runs/${first.run_id}/retry`)).status).toBe(200);
    await runAlarm(key);
    const retried = agentCalls().at(-1)!.json;
    expect([retried.run_id, retried.session, retried.reset]).toEqual([
      first.run_id,
      { id: rotated.body.session_id, key, is_new: false, parent_id: sent.body.session_id },
      null,
    ]);
  });

  it("404 for an unknown run, 409 for one still running", async () => {
    agentAnswer = () => accepted();
    expect((await post(`/admin/runs/run_${unique("nope")}/retry`)).status).toBe(404);
    const chat = unique("chat");
    const sent = await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    const [run] = (await view(sent.body.session_id)).runs;
    expect((await post(`/admin/runs/${run.run_id}/retry`)).status).toBe(409);
    expect(agentCalls()).toHaveLength(1);
  });

  it("409 for a failed run whose session has ended (its reply could land nowhere)", async () => {
    agentAnswer = () => new Response("bad", { status: 400 });
    const chat = unique("chat");
    const sent = await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    const [run] = (await view(sent.body.session_id)).runs;
    await post(`/admin/sessions/${sent.body.session_id}/end`);
    const retried = await post(`/admin/runs/${run.run_id}/retry`);
    expect(retried.status).toBe(409);
    expect(((await retried.json()) as any).error).toEqual({
      code: "session_ended",
      message: `the session of run ${run.run_id} has ended: its reply could land nowhere`,
    });
  });
});

describe("deliveries_failed and POST /admin/deliveries/{event_id}/retry", () => {
  it("counts a dead-lettered reply; the retry sends it again with a fresh attempt count", async () => {
    let refuse = true;
    replyAnswer = () => (refuse ? new Response("gone", { status: 410 }) : new Response("ok"));
    const before = (await metrics()).deliveries_failed;
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    expect((await metrics()).deliveries_failed).toBe(before + 1);
    expect((await view(sent.body.session_id)).deliveries).toMatchObject([
      { event_id: sent.eventId, kind: "reply", status: "failed", attempts: 1, last_status: 410 },
    ]);

    refuse = false;
    const retried = await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`);
    expect(retried.status).toBe(200);
    expect(((await retried.json()) as any).delivery).toMatchObject({
      event_id: sent.eventId,
      status: "pending",
      attempts: 0,
    });
    await runAlarm(key);
    expect(replies().map((r) => r.text)).toEqual(["hi", "hi"]);
    expect((await view(sent.body.session_id)).deliveries).toMatchObject([{ status: "sent", attempts: 1 }]);
    // A delivery that went through is not counted as failed.
    expect((await metrics()).deliveries_failed).toBe(before + 1);
    // Sent now: a second retry is a 409 and sends nothing.
    expect((await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`)).status).toBe(409);
    await runAlarm(key);
    expect(replies()).toHaveLength(2);
  });

  it("logs each failed attempt with its delivery, status and whether it will be retried", async () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    let calls = 0;
    const answers = [503, 410, 200];
    replyAnswer = () => new Response("no", { status: answers[calls++]! });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    const [item] = await router(key).outbox();
    setNow(item!.dueAt);
    await runAlarm(key);
    // The operator's retry goes through: a delivery that worked is not logged as failed.
    expect((await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`)).status).toBe(200);
    await runAlarm(key);
    expect(replies()).toHaveLength(3);
    const failures = loggedLines(warn, "reply delivery failed");
    const [delivery] = (await view(sent.body.session_id)).deliveries;
    const expected = {
      session_key: key,
      session_id: sent.body.session_id,
      delivery_id: delivery.id,
      platform: "generic",
      kind: "reply",
    };
    expect(failures).toEqual([
      expect.objectContaining({ ...expected, attempt: 1, status: 503, will_retry: true }),
      expect.objectContaining({ ...expected, attempt: 2, status: 410, will_retry: false }),
    ]);
  });

  it("404 for an event nothing was delivered for", async () => {
    expect((await post(`/admin/deliveries/${unique("evt_nope")}/retry`)).status).toBe(404);
  });
});

describe("another writer between the object's read and its retry's batch", () => {
  it("a run finished meanwhile (by SQL) is 409 not_failed, as a moment later, and not handed over again", async () => {
    agentAnswer = () => new Response("bad", { status: 400 });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await runAlarm(key);
    const { run_id } = agentCalls()[0]!.json;
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("SET failed_at = NULL")),
      before: (db) => db.prepare(`UPDATE runs SET finished_at = ? WHERE id = ?`).bind(T0, run_id).run(),
    });
    const retried = await post(`/admin/runs/${run_id}/retry`);
    expect(slipped.hits()).toBe(1);
    expect({ status: retried.status, body: await retried.json() }).toEqual({
      status: 409,
      body: { error: { code: "not_failed", message: `run ${run_id} has not failed` } },
    });
    expect(await router(key).outbox()).toEqual([]);
    await runAlarm(key);
    expect(agentCalls()).toHaveLength(1);
  });

  it("a dead letter marked sent meanwhile (by SQL) is 409 not_failed and sent no more", async () => {
    replyAnswer = () => new Response("gone", { status: 410 });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    const slipped = injectD1Fault({
      match: (sql) => sql.some((s) => s.includes("SET status = 'pending'")),
      before: (db) => db.prepare(`UPDATE deliveries SET status = 'sent' WHERE event_id = ?`).bind(sent.eventId).run(),
    });
    const retried = await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`);
    expect(slipped.hits()).toBe(1);
    expect({ status: retried.status, body: await retried.json() }).toEqual({
      status: 409,
      body: {
        error: { code: "not_failed", message: `delivery dl_${agentCalls()[0]!.json.run_id}_reply has not failed` },
      },
    });
    expect(await router(key).outbox()).toEqual([]);
    await runAlarm(key);
    expect(replies()).toHaveLength(1);
  });
});

describe("retries the routing object refuses itself", () => {
  it("409 for a failed run the agent answered later through the run API: it is finished", async () => {
    agentAnswer = () => new Response("bad", { status: 400 });
    const chat = unique("chat");
    const sent = await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    const { run_id, run_token } = agentCalls()[0]!.json;
    expect((await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "late after all" })).status).toBe(200);
    const retried = await post(`/admin/runs/${run_id}/retry`);
    expect(retried.status).toBe(409);
    expect(((await retried.json()) as any).error).toEqual({
      code: "not_failed",
      message: `run ${run_id} has not failed`,
    });
    expect(agentCalls()).toHaveLength(1);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["hello", "late after all"]);
  });

  it("a retry over a dead letter whose batch committed but did not answer replaces the hand-off left behind", async () => {
    let refuse = true;
    agentAnswer = () => (refuse ? new Response("bad", { status: 400 }) : replyWith("second time"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "please" });
    injectD1Fault({ afterCommit: true, match: (sql) => sql.some((s) => s.includes("SET failed_at = ?")) });
    await runAlarm(key);
    injectD1Fault(null);
    // The failed run's item is still in the outbox when the operator retries it.
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["run"]);
    refuse = false;
    setNow(T0 + MINUTE);
    expect((await post(`/admin/runs/${agentCalls()[0]!.json.run_id}/retry`)).status).toBe(200);
    await runAlarm(key);
    expect(agentCalls()).toHaveLength(2);
    // The hand-off carries the retry's fresh token, not the one left behind.
    expect(agentCalls()[1]!.json.run_token).not.toBe(agentCalls()[0]!.json.run_token);
    expect(replies().map((r) => r.text)).toEqual(["second time"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["please", "second time"]);
  });

  it("409 not_retryable for a failed run written before runs kept their message", async () => {
    agentAnswer = () => new Response("bad", { status: 400 });
    const chat = unique("chat");
    await send({ chat_id: chat });
    await runAlarm(genericKey(chat));
    const { run_id } = agentCalls()[0]!.json;
    // As a row from before the `message` column was filled.
    await env.DB.prepare(`UPDATE runs SET message = NULL WHERE id = ?`).bind(run_id).run();
    const retried = await post(`/admin/runs/${run_id}/retry`);
    expect(retried.status).toBe(409);
    expect(((await retried.json()) as any).error).toEqual({
      code: "not_retryable",
      message: `run ${run_id} predates retries (no message kept)`,
    });
    expect(agentCalls()).toHaveLength(1);
  });

  /** A run the agent refused for good, then its retry's D1 batch failing (`afterCommit`: it commits first). */
  async function retryFailing(afterCommit: boolean) {
    let refuse = true;
    agentAnswer = () => (refuse ? new Response("bad", { status: 400 }) : replyWith("at last"));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "please" });
    await runAlarm(key);
    const { run_id } = agentCalls()[0]!.json;
    const fault = injectD1Fault({ afterCommit, match: (sql) => sql.some((s) => s.includes("SET failed_at = NULL")) });
    const failed = await post(`/admin/runs/${run_id}/retry`);
    injectD1Fault(null);
    expect(fault.hits()).toBe(1);
    expect(failed.status).toBeGreaterThanOrEqual(500);
    return { key, runId: run_id as string, agentAnswers: () => (refuse = false) };
  }

  it("D1 failing while a run's retry is written leaves nothing staged; the retry can be asked again", async () => {
    const { key, runId, agentAnswers } = await retryFailing(false);
    // Nothing was staged for a retry D1 never recorded.
    expect(await router(key).outbox()).toEqual([]);
    agentAnswers();
    expect((await post(`/admin/runs/${runId}/retry`)).status).toBe(200);
    await runAlarm(key);
    expect(replies().map((r) => r.text)).toEqual(["at last"]);
  });

  it("a run's retry whose batch committed but did not answer is still handed over; asking again is 409", async () => {
    const { key, runId, agentAnswers } = await retryFailing(true);
    // D1 has the run requeued: the operator asking again finds it no longer failed.
    expect((await post(`/admin/runs/${runId}/retry`)).status).toBe(409);
    agentAnswers();
    await runAlarm(key);
    expect(agentCalls().map((c) => c.json.run_id)).toEqual([runId, runId]);
    expect(replies().map((r) => r.text)).toEqual(["at last"]);
  });

  it("a delivery retry over a dead letter whose batch committed but did not answer replaces the item left behind", async () => {
    let refuse = true;
    replyAnswer = () => (refuse ? new Response("gone", { status: 410 }) : new Response("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    injectD1Fault({
      afterCommit: true,
      match: (sql) => sql.some((s) => s.includes("UPDATE deliveries SET status = ?")),
    });
    await runAlarm(key);
    injectD1Fault(null);
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["delivery"]);
    refuse = false;
    const retried = await post(`/admin/deliveries/${encodeURIComponent(sent.eventId)}/retry`);
    expect(retried.status).toBe(200);
    await runAlarm(key);
    expect((await view(sent.body.session_id)).deliveries).toMatchObject([{ status: "sent" }]);
    expect(replies().map((r) => r.text)).toEqual(["hi", "hi"]);
  });

  it("a failed run that carried several waiting messages is handed over again with all of them", async () => {
    let refuse = true;
    agentAnswer = (request) => {
      if (request.json.message.text === "one") return accepted();
      return refuse ? new Response("bad", { status: 400 }) : replyWith("both answered");
    };
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const first = agentCalls()[0]!.json;
    // Queue mode: these two wait behind the accepted run, then go as one run.
    await send({ chat_id: chat, text: "two" });
    await send({ chat_id: chat, text: "three" });
    expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "re: one" })).status).toBe(200);
    await runAlarm(key);
    const batched = agentCalls()[1]!.json;
    expect(batched.messages.map((m: { text: string }) => m.text)).toEqual(["two", "three"]);
    refuse = false;
    setNow(T0 + MINUTE);
    expect((await post(`/admin/runs/${batched.run_id}/retry`)).status).toBe(200);
    await runAlarm(key);
    const again = agentCalls()[2]!.json;
    expect(again.run_id).toBe(batched.run_id);
    expect(again.messages.map((m: { text: string }) => m.text)).toEqual(["two", "three"]);
    expect(replies().map((r) => r.text)).toEqual(["re: one", "both answered"]);
  });

  it("the object's own 404 for a run, delivery or session it does not have (reached only if one vanishes after the admin route read it), and 409 for a sent delivery", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    const object = router(key);
    expect(await object.retryRun("run_gone")).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "no run run_gone" } },
    });
    expect(await object.retryDelivery("dl_gone", key)).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "no delivery dl_gone" } },
    });
    expect(await object.endSession("ses_gone", "admin")).toEqual({
      status: 404,
      body: { error: { code: "not_found", message: "no session ses_gone" } },
    });
    const [delivery] = (await view(sent.body.session_id)).deliveries;
    expect(delivery).toMatchObject({ status: "sent" });
    expect(await object.retryDelivery(delivery.id, key)).toEqual({
      status: 409,
      body: { error: { code: "not_failed", message: `delivery ${delivery.id} has not failed` } },
    });
  });
});

it("a reply waiting to be retried when GENERIC_REPLY_URL is removed fails for good, saying why", async () => {
  replyAnswer = () => new Response("busy", { status: 503 });
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "hello" });
  await runAlarm(key);
  expect((await view(sent.body.session_id)).deliveries).toMatchObject([{ status: "pending", attempts: 1 }]);
  const { GENERIC_REPLY_URL: _removed, ...withoutReplyUrl } = agentConfig({ HOOK_URLS: "" });
  useConfig(withoutReplyUrl);
  const [item] = await router(key).outbox();
  setNow(item!.dueAt);
  await runAlarm(key);
  expect((await view(sent.body.session_id)).deliveries).toMatchObject([
    { status: "failed", attempts: 2, last_error: expect.stringContaining("GENERIC_REPLY_URL") },
  ]);
  // Failed for good: no later attempt.
  setNow(item!.dueAt + 60 * MINUTE);
  await runAlarm(key);
  expect(replies()).toHaveLength(1);
});
