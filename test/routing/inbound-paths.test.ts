/**
 * The paths of one routed message, as an operator sees them:
 * - the one log line per routed message (`message routed`) names the routing decision
 *   that took the message where it went (append, reopen, fresh, promoted, duplicate,
 *   command), and a resend counts in `duplicates` of `GET /admin/metrics`;
 * - a platform's resend leaves the route as it was, whichever session holds the
 *   message, also after the operator forgot the route, and costs only its reads;
 * - a message that waited behind a run of a session ended meanwhile starts a fresh
 *   session and goes out at once (nothing left waiting).
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { env } from "cloudflare:workers";
import { AGENT_URL, REPLY_URL, accepted, agentApi, agentConfig, fakeServices, replyWith } from "../agent/support";
import {
  MINUTE,
  T0,
  adminFetch,
  captureFetch,
  eventsOf,
  genericKey,
  loggedLines,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
  type GenericMessage,
} from "../helpers";
import { endBySql } from "./overlap-support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
  services = fakeServices(() => accepted());
});
afterEach(() => {
  injectD1Fault(null);
  vi.restoreAllMocks();
  services.restore();
  restoreClock();
  useConfig(null);
});

/** Sends `message` and returns its answer with the `message routed` lines it logged. */
async function routed(message: GenericMessage) {
  const spy = vi.spyOn(console, "log").mockImplementation(() => undefined);
  try {
    const sent = await send(message);
    return { ...sent, lines: loggedLines(spy, "message routed") };
  } finally {
    spy.mockRestore();
  }
}

const counters = async () => (await (await adminFetch("/admin/metrics")).json()) as Record<string, number>;

/** Object rows a steady append writes: its hand-off staged (the entry is written only when it changes). */
const STEADY_APPEND_OBJECT_ROWS = 1;

async function duplicatesCounted(): Promise<number> {
  return ((await (await adminFetch("/admin/metrics")).json()) as { duplicates: number }).duplicates;
}

describe("the decision each routed message is logged with", () => {
  it("a new key's first message is fresh, the next one appends", async () => {
    const chat = unique("chat");
    const first = await routed({ chat_id: chat, text: "one" });
    expect(first.body).toEqual({ accepted: true, session_id: expect.any(String), duplicate: false });
    expect(first.lines).toMatchObject([
      { decision: "fresh", session_id: first.body.session_id, session_key: genericKey(chat) },
    ]);
    const second = await routed({ chat_id: chat, text: "two" });
    expect(second.lines).toMatchObject([{ decision: "append", session_id: first.body.session_id }]);
  });

  it("a message to a row the agent released within its policy reopens it", async () => {
    services.restore();
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    // Answered: nothing is unfinished, so "two" is handed over as soon as it is stored.
    await runAlarm(genericKey(chat));
    await endBySql(first.body.session_id, T0 + MINUTE);
    setNow(T0 + 2 * MINUTE);
    const before = await counters();
    const next = await routed({ chat_id: chat, text: "two" });
    const after = await counters();
    expect(next.body.session_id).toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "reopen", session_id: first.body.session_id }]);
    // Object rows: the hand-off staged and the entry adopted from the reopened row, then
    // the hand-off's payload rewritten for it; nothing more.
    expect(after.do_rows_written! - before.do_rows_written!).toBe(3);
  });

  it("a message past the deadline, before the alarm ran, is promoted: it ended the old session", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    // The agent's reply lands so nothing holds the session open past its deadline.
    await runAlarm(genericKey(chat));
    setNow(T0 + 61 * MINUTE);
    const before = await counters();
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "promoted", session_id: next.body.session_id }]);
    // The end this message made is counted once, under its reason.
    const ended = (counts: Record<string, any>) => counts.sessions_ended.idle ?? 0;
    expect(ended(await counters()) - ended(before)).toBe(1);
  });

  it("a message after an operator's end starts a fresh session, and says fresh", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await endBySql(first.body.session_id, T0 + MINUTE, "admin");
    setNow(T0 + 2 * MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "fresh", session_id: next.body.session_id }]);
  });

  it("a platform's resend is a duplicate, counted once in the metrics", async () => {
    services.restore();
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    // Answered: nothing is unfinished, so the resend is not judged as a waiting message.
    await runAlarm(genericKey(chat));
    const before = await duplicatesCounted();
    const resend = await routed({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(resend.lines).toMatchObject([{ decision: "duplicate", session_id: first.body.session_id }]);
    expect(await duplicatesCounted()).toBe(before + 1);
  });

  it("a reused event id of a /stop on a key never seen, sent again as a message, is a duplicate that names and starts no session", async () => {
    const chat = unique("chat");
    const stop = await send({ chat_id: chat, text: "/stop" });
    expect(stop.body).toEqual({ accepted: true, session_id: null, duplicate: false });
    const before = await duplicatesCounted();
    const reused = await routed({ chat_id: chat, text: "hello", event_id: stop.eventId });
    expect(reused.status).toBe(200);
    expect(reused.body).toMatchObject({ accepted: true, duplicate: true });
    // No session is named (the mark of a /stop that found nothing holds none): "" on this path.
    expect(["", null]).toContain(reused.body.session_id);
    expect(reused.lines).toMatchObject([{ decision: "duplicate" }]);
    expect(await sessionsOfKey(genericKey(chat))).toEqual([]);
    expect(await duplicatesCounted()).toBe(before + 1);
  });

  it("a command D1 refuses is answered 503 with the error alone, and logged as not routed", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "one" });
    const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("INSERT INTO deliveries")), index: -1 });
    const warned = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const command = await routed({ chat_id: chat, text: "/new" });
    expect(fault.hits()).toBe(1);
    expect(command.status).toBe(503);
    expect(Object.keys(command.body)).toEqual(["error"]);
    expect(command.lines).toEqual([]);
    expect(loggedLines(warned, "message not routed")).toMatchObject([{ status: 503, session_key: genericKey(chat) }]);
  });

  it("a command is logged as a command", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "one" });
    const command = await routed({ chat_id: chat, text: "/new" });
    expect(command.status).toBe(200);
    expect(command.lines).toMatchObject([{ decision: "command", session_id: command.body.session_id }]);
  });
});

describe("a message that waits behind an unfinished run (queue mode)", () => {
  it("is logged as appended to the session it waits in", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(genericKey(chat));
    const waiting = await routed({ chat_id: chat, text: "two" });
    expect(waiting.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: false });
    expect(waiting.lines).toMatchObject([{ decision: "append", session_id: first.body.session_id }]);
  });

  it("resent, is a duplicate, counted once in the metrics", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(genericKey(chat));
    const waiting = await send({ chat_id: chat, text: "two" });
    const before = await duplicatesCounted();
    const resend = await routed({ chat_id: chat, text: "two", event_id: waiting.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(resend.lines).toMatchObject([{ decision: "duplicate", session_id: first.body.session_id }]);
    expect(await duplicatesCounted()).toBe(before + 1);
  });
});

describe("a platform's resend", () => {
  const routeView = async (key: string) =>
    (await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json()) as any;
  it("of a message the live session holds costs two ingress batches, every read on the webhook's path", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    const before = await counters();
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    const after = await counters();
    expect(resend.body).toMatchObject({ duplicate: true, session_id: first.body.session_id });
    // The append that finds the dedupe mark, then the reread of the row and the mark.
    expect(after.d1_batches_ingress! - before.d1_batches_ingress!).toBe(2);
    expect(after.d1_rows_read_ingress! - before.d1_rows_read_ingress!).toBe(after.d1_rows_read! - before.d1_rows_read!);
  });

  it("of a message an earlier session holds answers that session and leaves the route on the live one", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await send({ chat_id: chat, text: "/new" });
    setNow(T0 + MINUTE);
    const live = await send({ chat_id: chat, text: "two" });
    expect(live.body.session_id).not.toBe(first.body.session_id);
    const before = await routeView(key);
    expect(before.alarm_at).toBe(T0 + 61 * MINUTE + 1);
    const counted = await counters();
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(await routeView(key)).toEqual(before);
    // Only the newest row of the key is read to tell the entry is right, on the webhook's path.
    const after = await counters();
    expect(after.d1_batches_ingress! - counted.d1_batches_ingress!).toBe(3);
    expect(after.d1_rows_read_ingress! - counted.d1_rows_read_ingress!).toBe(6);
    // The routing object's own storage: the resend waits behind the live session's run
    // (a row added and removed, with its index), and the entry stands as it was.
    expect(after.do_rows_written! - counted.do_rows_written!).toBe(4);
  });

  it("a new message after the operator forgot the route joins the live session in two ingress batches", async () => {
    services.restore();
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const forgotten = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
    expect(forgotten.status).toBe(200);
    const before = await counters();
    const next = await routed({ chat_id: chat, text: "two" });
    const after = await counters();
    expect(next.body.session_id).toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "append" }]);
    // The brand-new-key batch that finds the key's newest row, then the append: the
    // row within its policy is not asked whether a run holds it open.
    expect(after.d1_batches_ingress! - before.d1_batches_ingress!).toBe(2);
  });

  it("after the operator forgot the route is still a duplicate of the session that holds it", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    const forgotten = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
    expect(forgotten.status).toBe(200);
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend).toMatchObject({
      status: 200,
      body: { accepted: true, session_id: first.body.session_id, duplicate: true },
    });
    expect((await sessionsOfKey(key)).map((row) => row.id)).toEqual([first.body.session_id]);
  });
});

describe("a message that waited behind a run of a session ended meanwhile", () => {
  /** "one" handed over and accepted (202), then its session ended by an operator's SQL: "two" comes next. */
  async function behindAnEndedSession(overlap: Record<string, unknown>) {
    useConfig(agentConfig({ HOOK_URLS: "", OVERLAP: JSON.stringify(overlap) }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await endBySql(first.body.session_id, T0 + 100, "admin");
    setNow(T0 + 200);
    const second = await send({ chat_id: chat, text: "two" });
    expect(second.body.session_id).not.toBe(first.body.session_id);
    return { key, first: first.body.session_id as string, second: second.body.session_id as string };
  }
  const waitingCount = async (key: string) =>
    ((await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}/explain`)).json()) as any).waiting;

  it("starts a fresh session and is handed over at once, its first run, with the reset", async () => {
    const { key, first, second } = await behindAnEndedSession({ mode: "queue" });
    // Nothing waits: its run is staged, and the next alarm hands it over.
    expect(await waitingCount(key)).toBe(0);
    await runAlarm(key);
    const call = services.agentCalls().at(-1)!.json;
    expect(call.messages.map((m: { text: string }) => m.text)).toEqual(["two"]);
    expect(call.session).toMatchObject({ id: second, is_new: true });
    expect(call.reset).toEqual({ reason: "admin", had_activity: true, previous_session_id: first });
  });

  it("with a debounce window, waits for the window in the fresh session, then its first run carries it", async () => {
    const { key, first, second } = await behindAnEndedSession({ mode: "queue", debounce_ms: 2000 });
    expect(await waitingCount(key)).toBe(1);
    const handedOver = services.agentCalls().length;
    setNow(T0 + 1000);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(handedOver);
    setNow(T0 + 2200);
    await runAlarm(key);
    const call = services.agentCalls().at(-1)!.json;
    expect(call.messages.map((m: { text: string }) => m.text)).toEqual(["two"]);
    expect(call.session).toMatchObject({ id: second, is_new: true });
    expect(call.reset).toEqual({ reason: "admin", had_activity: true, previous_session_id: first });
  });
});

describe("a new key's messages (concurrent: each its own run)", () => {
  it("only the first run says is_new", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", OVERLAP: JSON.stringify({ mode: "concurrent" }) }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await send({ chat_id: chat, text: "two" });
    await runAlarm(key);
    const calls = services.agentCalls().map((c) => c.json);
    expect(calls.map((c) => [c.message.text, c.session.id, c.session.is_new])).toEqual([
      ["one", first.body.session_id, true],
      ["two", first.body.session_id, false],
    ]);
  });
});

describe("the first message after /new", () => {
  it("is the fresh session's first run; the next one is not (concurrent: each its own run)", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", OVERLAP: JSON.stringify({ mode: "concurrent" }) }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const old = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const fresh = await send({ chat_id: chat, text: "/new" });
    setNow(T0 + MINUTE);
    await send({ chat_id: chat, text: "two" });
    const before = await counters();
    await send({ chat_id: chat, text: "three" });
    const after = await counters();
    // A steady append: the hand-off staged, nothing more.
    expect(after.do_rows_written! - before.do_rows_written!).toBe(STEADY_APPEND_OBJECT_ROWS);
    await runAlarm(key);
    const calls = services.agentCalls().map((c) => c.json);
    expect(calls.map((c) => [c.message.text, c.session.id, c.session.is_new])).toEqual([
      ["one", old.body.session_id, true],
      ["two", fresh.body.session_id, true],
      ["three", fresh.body.session_id, false],
    ]);
    expect(calls[1].reset).toEqual({
      reason: "new_command",
      had_activity: true,
      previous_session_id: old.body.session_id,
    });
    expect(calls[2].reset).toBeNull();
  });
});

describe("a message that ends the old session itself", () => {
  const HOOK_URL = "https://hooks.test/sessions";

  it("past the deadline: the old session's end and finalize are in D1 at once, and go out with the next alarm", async () => {
    services.restore();
    const captured = captureFetch((request) => {
      if (request.url === HOOK_URL) return new Response("ok");
      if (request.url === AGENT_URL) return replyWith("answered");
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected outbound request to ${request.url}`);
    });
    services = { ...services, restore: captured.restore };
    useConfig(agentConfig({ HOOK_URLS: HOOK_URL, HOOK_SECRET: "hook-secret" }));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await router(key).drained();
    setNow(T0 + 61 * MINUTE);
    const next = await send({ chat_id: chat, text: "two" });
    const old = first.body.session_id as string;
    expect(next.body.session_id).not.toBe(old);
    expect((await eventsOf(old)).map((e) => [e.type, e.reason])).toEqual([
      ["session.started", null],
      ["session.ended", "idle"],
      ["session.finalized", "idle"],
    ]);
    await runAlarm(key);
    await router(key).drained();
    const hooked = captured.calls.filter((c) => c.url === HOOK_URL).map((c) => [c.json.type, c.json.session_id]);
    expect(hooked).toEqual(
      expect.arrayContaining([
        ["session.ended", old],
        ["session.finalized", old],
      ]),
    );
  });

  it("a row the agent released, past its deadline while its run's lease still holds: promoted, and a fresh session starts", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    const run = services.agentCalls().at(-1)!.json;
    // The agent keeps its lease alive; an operator's tool releases the row by SQL.
    setNow(T0 + 55 * MINUTE);
    expect((await agentApi(`/v1/runs/${run.run_id}/heartbeat`, run.run_token)).status).toBe(200);
    await endBySql(first.body.session_id, T0 + 56 * MINUTE, "agent_close");
    setNow(T0 + 61 * MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.status).toBe(200);
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "promoted" }]);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
  });

  it("whose row was deleted by SQL: a fresh session starts for the key", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await env.DB.prepare(`DELETE FROM sessions WHERE id = ?`).bind(first.body.session_id).run();
    setNow(T0 + MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.status).toBe(200);
    expect(next.lines).toMatchObject([{ decision: "fresh", session_id: next.body.session_id }]);
    expect((await sessionsOfKey(key)).map((row) => [row.id, row.end_reason])).toEqual([[next.body.session_id, null]]);
  });
});
