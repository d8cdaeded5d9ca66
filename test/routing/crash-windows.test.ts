/**
 * The windows the crash check (`npm run chaos`) found between a D1 commit and what
 * the routing object does next. A kill there is simulated with the D1 fault seam's
 * `afterCommit`: the batch commits in real D1, then the call throws, so nothing the
 * object would have done after it happens.
 * - A new session stored, its entry never adopted: the key never gets a second live
 *   row, and the platform's resend repairs the entry.
 * - A reply recorded through the run API, its delivery never staged: it is still sent.
 * - The same for the agent's 200 answer, whose run stays in the outbox until then.
 * - A batch that commits and throws while the object lives on: what was staged for
 *   it (a message's hand-off, a command's answer) stays and is still sent once.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import {
  T0,
  adminFetch,
  alarmAfterRestart,
  genericKey,
  loggedLines,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { OutboxTable as RouterStorage } from "../../src/routing/outbox-table";
import { accepted, agentApi, agentConfig, CONCURRENT, fakeServices, replyWith } from "../agent/support";
import { carriedBy, endBySql, explained, firstHandedOver } from "./overlap-support";
import { COMMAND_REPLIES } from "../../src/domain/commands";

const has = (fragment: string) => (sql: readonly string[]) => sql.some((s) => s.includes(fragment));
let services: ReturnType<typeof fakeServices> | null = null;

beforeEach(() => setNow(T0));
afterEach(() => {
  injectD1Fault(null);
  services?.restore();
  services = null;
  vi.restoreAllMocks();
  restoreClock();
  useConfig(null);
});

/**
 * A key whose entry points at an ended session, then a message whose fresh session
 * D1 stores before the object dies. Returns the key and the two sessions' ids.
 */
async function killedAfterNewSession(
  config: Record<string, string> = { HOOK_URLS: "" }, // the echo agent answers
): Promise<{ key: string; chat: string; old: string; eventId: string }> {
  useConfig(config);
  const chat = unique("chat");
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text: "one" });
  const ended = await adminFetch(`/admin/sessions/${first.body.session_id}/end`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ reason: "admin" }),
  });
  expect(ended.status).toBe(200);
  const fault = injectD1Fault({ afterCommit: true, match: has("INSERT INTO sessions") });
  const killed = await send({ chat_id: chat, text: "two" });
  expect(fault.hits()).toBe(1);
  expect(killed.status).toBeGreaterThanOrEqual(500);
  // D1 has the new session; the entry still names the ended one.
  const rows = await sessionsOfKey(key);
  expect(rows.map((r) => r.end_reason)).toEqual(["admin", null]);
  const view = (await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json()) as any;
  expect(view.entry.session_id).toBe(first.body.session_id);
  return { key, chat, old: first.body.session_id, eventId: killed.eventId };
}

describe("a kill between a new session's batch and adopting it", () => {
  /** A row the agent released, then `/new` whose batch D1 committed before the object died: the entry still names the released row. */
  async function releasedThenKilledNew() {
    useConfig({ HOOK_URLS: "" });
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await endBySql(first.body.session_id, T0 + 1, "agent_close");
    setNow(T0 + 2);
    const fault = injectD1Fault({ afterCommit: true, match: has("INSERT INTO sessions") });
    const command = await send({ chat_id: chat, text: "/new" });
    expect(fault.hits()).toBe(1);
    expect(command.status).toBeGreaterThanOrEqual(500);
    const [, fresh] = await sessionsOfKey(key);
    setNow(T0 + 3);
    return { chat, key, released: first.body.session_id as string, fresh: fresh!.id };
  }

  it("after /new over a row the agent released, /stop stops /new's session", async () => {
    const { chat, key, released, fresh } = await releasedThenKilledNew();
    const stop = await send({ chat_id: chat, text: "/stop" });
    expect(stop).toMatchObject({ status: 200, body: { session_id: fresh } });
    expect((await sessionsOfKey(key)).map((r) => [r.id, r.end_reason])).toEqual([
      [released, "agent_close"],
      [fresh, "suspended"],
    ]);
  });

  it("after /new over a row the agent released, another /new replaces /new's session", async () => {
    const { chat, key, released, fresh } = await releasedThenKilledNew();
    const again = await send({ chat_id: chat, text: "/new" });
    expect(again.status).toBe(200);
    const rows = await sessionsOfKey(key);
    expect(rows.map((r) => [r.id, r.end_reason])).toEqual([
      [released, "agent_close"],
      [fresh, "new_command"],
      [again.body.session_id, null],
    ]);
  });

  it("after /new over a row the agent released: the next message joins /new's session, the released row stays ended", async () => {
    const { chat, key, released, fresh } = await releasedThenKilledNew();
    const next = await send({ chat_id: chat, text: "two" });
    expect(next).toMatchObject({ status: 200, body: { session_id: fresh } });
    expect((await sessionsOfKey(key)).map((r) => [r.id, r.end_reason])).toEqual([
      [released, "agent_close"],
      [fresh, null],
    ]);
  });

  it("the next message joins the session D1 stored: the key never has two live rows", async () => {
    const { key, chat } = await killedAfterNewSession();
    const next = await send({ chat_id: chat, text: "three" });
    expect(next.status).toBe(200);
    const rows = await sessionsOfKey(key);
    expect(rows.filter((r) => r.end_reason === null)).toHaveLength(1);
    expect(rows).toHaveLength(2);
    expect(next.body.session_id).toBe(rows[1]!.id);
    expect((await messagesOf(rows[1]!.id)).filter((m) => m.role === "user").map((m) => m.text)).toEqual([
      "two",
      "three",
    ]);
    const view = (await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json()) as any;
    expect(view.entry.session_id).toBe(rows[1]!.id);
    // Its deadline is armed like any live session's.
    expect(view.alarm_at).not.toBeNull();
  });

  it("the platform's resend is a duplicate of the new session and repairs the entry", async () => {
    const { key, chat, eventId } = await killedAfterNewSession();
    const resent = await send({ chat_id: chat, event_id: eventId, text: "two" });
    const rows = await sessionsOfKey(key);
    expect(resent).toMatchObject({ status: 200, body: { duplicate: true, session_id: rows[1]!.id } });
    const view = (await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json()) as any;
    expect(view.entry.session_id).toBe(rows[1]!.id);
    // The entry's deadline is learnt again by the alarm.
    await runAlarm(key);
    expect(await router(key).inspect()).toMatchObject({ alarm_at: expect.any(Number) });
  });

  it("the killed message's staged run, predicted for the old session, is handed over in the new one, retries too", async () => {
    let attempts = 0;
    services = fakeServices(() => (++attempts === 1 ? new Response("busy", { status: 503 }) : replyWith("answered")));
    // Concurrent: the killed message is staged as its own run (in queue mode it would wait behind "one").
    const { key, chat, old, eventId } = await killedAfterNewSession(agentConfig({ HOOK_URLS: "", ...CONCURRENT }));
    const mark = await env.DB.prepare(`SELECT session_id, run_id FROM inbound_events WHERE event_id = ?`)
      .bind(eventId)
      .first<{ session_id: string; run_id: string }>();
    // The outbox as the kill left it: the hand-off staged with the entry's (old) session.
    await runInDurableObject(router(key), async (_instance, state) => {
      new RouterStorage(state.storage.sql).put({
        id: mark!.run_id,
        kind: "run",
        payload: {
          stage: "dispatch",
          runId: mark!.run_id,
          token: `${mark!.run_id}.token`,
          sessionId: old,
          isNew: false,
          parentId: null,
          reset: null,
          message: {
            platform: "generic",
            eventId,
            chatId: chat,
            chatType: "dm",
            userId: "u1",
            threadId: null,
            text: "two",
            sentAt: null,
            replyTo: { platform: "generic" },
            sessionKey: key,
            receivedAt: T0,
          },
        },
        dueAt: T0,
        attempts: 0,
        lastError: null,
        createdAt: T0,
      });
      await state.storage.setAlarm(T0);
    });
    await runAlarm(key);
    expect(services.agentCalls().map((c) => c.json.session.id)).toEqual([mark!.session_id]);
    const [item] = await router(key).outbox();
    setNow(item!.dueAt);
    await runAlarm(key);
    expect(services.agentCalls().map((c) => c.json.session.id)).toEqual([mark!.session_id, mark!.session_id]);
    const run = await env.DB.prepare(`SELECT revoked_reason, finished_at FROM runs WHERE id = ?`)
      .bind(mark!.run_id)
      .first<any>();
    expect(run).toEqual({ revoked_reason: null, finished_at: item!.dueAt });
    expect(services.replies().map((r) => r.text)).toEqual(["answered"]);
  });
});

describe("a message that waits (queue mode), its batch failing", () => {
  /** "one" accepted by the agent (202), then "two", which waits behind it, sent with a D1 fault. */
  async function waitingWithFault(afterCommit: boolean) {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices((request) =>
      request.json.message.text === "one" ? accepted() : replyWith(`re: ${request.json.message.text}`),
    );
    const chat = unique("chat");
    const { key, sessionId, run: first } = await firstHandedOver(services, chat);
    setNow(T0 + 1);
    const fault = injectD1Fault({ afterCommit, match: has("INSERT INTO messages") });
    const failed = await send({ chat_id: chat, text: "two" });
    expect(fault.hits()).toBe(1);
    expect(failed.status).toBeGreaterThanOrEqual(500);
    /** The agent replies to "one" through the run API; what waited gets its run. */
    const replyToOne = async () => {
      setNow(T0 + 2);
      expect((await agentApi(`/v1/runs/${first.run_id}/reply`, first.run_token, { text: "to one" })).status).toBe(200);
      await runAlarm(key);
      await router(key).drained();
      await runAlarm(key);
    };
    return { chat, key, sessionId, eventId: failed.eventId, replyToOne };
  }
  const carried = () => carriedBy(services!);

  it("committed before the kill: the platform's retry is a duplicate, and the message is still carried", async () => {
    const { chat, sessionId, eventId, replyToOne } = await waitingWithFault(true);
    const retried = await send({ chat_id: chat, text: "two", event_id: eventId });
    expect(retried).toMatchObject({ status: 200, body: { duplicate: true, session_id: sessionId } });
    await replyToOne();
    expect(carried()).toEqual([["one"], ["two"]]);
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["one", "two", "to one", "re: two"]);
  });

  it("committed, and never retried: the message is still carried", async () => {
    const { sessionId, replyToOne } = await waitingWithFault(true);
    await replyToOne();
    expect(carried()).toEqual([["one"], ["two"]]);
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["one", "two", "to one", "re: two"]);
  });

  it("never stored, and never retried: nothing is handed over for it, and the next message is not held back", async () => {
    const { chat, key, sessionId, replyToOne } = await waitingWithFault(false);
    await replyToOne();
    expect(carried()).toEqual([["one"]]);
    expect((await explained(key)).waiting).toBe(0);
    setNow(T0 + 3);
    await send({ chat_id: chat, text: "three" });
    await runAlarm(key);
    expect(carried()).toEqual([["one"], ["three"]]);
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["one", "to one", "three", "re: three"]);
  });
});

describe("a platform's resend of a message already handed over, waiting behind that run (queue mode), its read failing", () => {
  it("is dropped once D1's mark names the run that carried it: the agent never gets it twice", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const one = await send({ chat_id: chat, text: "one" });
    const key = genericKey(chat);
    const sessionId = one.body.session_id as string;
    await runAlarm(key);
    const run = services.agentCalls().at(-1)!.json;
    // The resend waits behind its own run (still unfinished); the batch that finds its mark dies after D1 answered.
    setNow(T0 + 1);
    const fault = injectD1Fault({ afterCommit: true, match: has("inbound_events") });
    const resend = await send({ chat_id: chat, text: "one", event_id: one.eventId });
    expect(fault.hits()).toBe(1);
    expect(resend.status).toBeGreaterThanOrEqual(500);
    // The agent answers "one": what waits behind its run would go now.
    setNow(T0 + 2);
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "to one" })).status).toBe(200);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(carriedBy(services!)).toEqual([["one"]]);
    expect((await messagesOf(sessionId)).map((m) => m.text)).toEqual(["one", "to one"]);
    expect((await explained(key)).waiting).toBe(0);
  });
});

describe("a kill between recording a run API reply and staging its delivery", () => {
  it("the delivery is still sent once, although the agent's retried reply gets 409 finished", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "slow question" });
    await runAlarm(key);
    const run = services.agentCalls()[0]!.json;
    const fault = injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
    const killed = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late answer" });
    expect(fault.hits()).toBe(1);
    expect(killed.status).toBeGreaterThanOrEqual(500);
    const retried = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late answer" });
    expect(retried).toMatchObject({ status: 409, body: { reason: "finished" } });
    await router(key).drained();
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["late answer"]);
    const delivery = await env.DB.prepare(`SELECT status, attempts FROM deliveries WHERE session_id = ?`)
      .bind(sent.body.session_id)
      .first<any>();
    expect(delivery).toEqual({ status: "sent", attempts: 1 });
    expect(await router(key).outbox()).toEqual([]);
  });

  it("a message waiting behind that run goes with the delivery's alarm, not at the run's lease end", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices((request) =>
      request.json.message.text === "slow question" ? accepted() : replyWith("ok"),
    );
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "slow question" });
    await runAlarm(key);
    const run = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "next" });
    injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" })).status).toBe(503);
    // The object never heard that the run finished; D1 says so, and the alarm asks D1.
    setNow(T0 + 2);
    await runAlarm(key);
    await router(key).drained();
    expect(services.agentCalls().map((c) => c.json.message.text)).toEqual(["slow question", "next"]);
    expect(services.replies().map((r) => r.text)).toEqual(["late", "ok"]);
  });

  it("a delivery left pending with nothing staged (an older build's kill) is staged by the agent's retried reply", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "slow question" });
    await runAlarm(key);
    const run = services.agentCalls()[0]!.json;
    injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" })).status).toBe(503);
    // What a kill before this fix left: the row pending, the outbox without it.
    await runInDurableObject(router(key), (_instance, state) => {
      const store = new RouterStorage(state.storage.sql);
      for (const item of store.all()) store.delete(item.id);
    });
    expect(await router(key).outbox()).toEqual([]);
    const retried = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" });
    expect(retried).toMatchObject({ status: 409, body: { reason: "finished" } });
    await router(key).drained();
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["late"]);
  });
});

describe("a delivery left pending with nothing staged, its session ended since", () => {
  it("is staged by the agent's retried reply, which gets 409 session_ended", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "slow question" });
    await runAlarm(key);
    const run = services.agentCalls()[0]!.json;
    injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" })).status).toBe(503);
    await runInDurableObject(router(key), (_instance, state) => {
      const store = new RouterStorage(state.storage.sql);
      for (const item of store.all()) store.delete(item.id);
    });
    const ended = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ reason: "admin" }),
    });
    expect(ended.status).toBe(200);
    const retried = await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "late" });
    expect(retried).toMatchObject({ status: 409, body: { reason: "session_ended" } });
    await router(key).drained();
    await runAlarm(key);
    expect(services.replies().map((r) => r.text)).toEqual(["late"]);
  });
});

describe("a kill between recording the agent's 200 answer and staging its delivery", () => {
  it("the run stays in the outbox: replayed, it stages the delivery, sent once, the agent asked once", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => replyWith("quick answer"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "quick question" });
    await router(key).drained();
    const fault = injectD1Fault({ afterCommit: true, match: has("UPDATE runs SET finished_at") });
    await runAlarm(key);
    expect(fault.hits()).toBe(1);
    expect(services.replies()).toEqual([]);
    expect((await router(key).outbox()).map((item) => item.kind)).toEqual(["run"]);
    const [item] = await router(key).outbox();
    setNow(item!.dueAt);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies().map((r) => r.text)).toEqual(["quick answer"]);
    const delivery = await env.DB.prepare(`SELECT status, attempts FROM deliveries WHERE session_id = ?`)
      .bind(sent.body.session_id)
      .first<any>();
    expect(delivery).toEqual({ status: "sent", attempts: 1 });
  });
});

describe("an answer staged before a batch D1 never stored (a kill between them)", () => {
  /** A delivery item as a kill leaves it: staged, its D1 row never written. */
  async function stageOrphanAnswer(key: string, chat: string, work: { kind: "command" | "reply"; beforeBatch?: true }) {
    const sent = await send({ chat_id: chat, text: "hello" });
    await runAlarm(key);
    const deliveryId = `dl_${unique("orphan")}`;
    await runInDurableObject(router(key), async (_instance, state) => {
      new RouterStorage(state.storage.sql).put({
        id: deliveryId,
        kind: "delivery",
        payload: {
          deliveryId,
          sessionId: sent.body.session_id,
          sessionKey: key,
          platform: "generic",
          text: "never stored",
          notice: null,
          eventId: null,
          target: { platform: "generic" },
          ...work,
        },
        dueAt: T0,
        attempts: 0,
        lastError: null,
        createdAt: T0,
      });
      await state.storage.setAlarm(T0);
    });
    return deliveryId;
  }

  for (const [what, work] of [
    ["a command's answer", { kind: "command" }],
    ["a run API reply", { kind: "reply", beforeBatch: true }],
  ] as const) {
    it(`${what} is never sent, and leaves the outbox`, async () => {
      useConfig(agentConfig({ HOOK_URLS: "" }));
      services = fakeServices(() => replyWith("answered"));
      const chat = unique("chat");
      const key = genericKey(chat);
      const deliveryId = await stageOrphanAnswer(key, chat, work);
      const errors = vi.spyOn(console, "error");
      await runAlarm(key);
      expect(services.replies().map((r) => r.text)).toEqual(["answered"]);
      expect((await router(key).outbox()).map((item) => item.id)).not.toContain(deliveryId);
      // Dropped as owed no more, not as an item that failed.
      expect(loggedLines(errors, "outbox item failed")).toEqual([]);
    });
  }
});

/**
 * A batch that commits and then throws while the object lives on (D1's answer lost on
 * the way back): the webhook is answered 5xx, and the platform's resend finds the
 * message stored (a duplicate). What was staged before the batch must still go out.
 */
describe("a batch that committed, its answer lost (the object lives on)", () => {
  async function answeredThenLost(match: string, text: string) {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices((request) => replyWith(`re: ${request.json.message.text}`));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    setNow(T0 + 1);
    const fault = injectD1Fault({ afterCommit: true, match: has(match) });
    const lost = await send({ chat_id: chat, text });
    expect(fault.hits()).toBe(1);
    expect(lost.status).toBeGreaterThanOrEqual(500);
    return { chat, key, sessionId: first.body.session_id as string, eventId: lost.eventId };
  }
  const handedOver = () => services!.agentCalls().map((c) => c.json.message.text);

  it("a message: the resend is a duplicate, and the message is handed to the agent once", async () => {
    const { chat, key, sessionId, eventId } = await answeredThenLost("INSERT INTO messages", "two");
    const resent = await send({ chat_id: chat, text: "two", event_id: eventId });
    expect(resent).toMatchObject({ status: 200, body: { duplicate: true, session_id: sessionId } });
    await runAlarm(key);
    await router(key).drained();
    expect(handedOver()).toEqual(["one", "two"]);
    expect(services!.replies().map((r) => r.text)).toEqual(["re: one", "re: two"]);
    expect(await router(key).outbox()).toEqual([]);
  });

  it("a message never resent is handed over too", async () => {
    const { key } = await answeredThenLost("INSERT INTO messages", "two");
    await runAlarm(key);
    await router(key).drained();
    expect(handedOver()).toEqual(["one", "two"]);
  });

  it("a new key's first message: its hand-off says is_new for the session D1 stored, as it would have", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const fault = injectD1Fault({ afterCommit: true, match: has("INSERT INTO sessions") });
    const lost = await send({ chat_id: chat, text: "one" });
    expect(fault.hits()).toBe(1);
    expect(lost.status).toBeGreaterThanOrEqual(500);
    const [row] = await sessionsOfKey(key);
    await runAlarm(key);
    await router(key).drained();
    const calls = services!.agentCalls().map((c) => c.json);
    expect(calls).toHaveLength(1);
    expect(calls[0].session).toEqual({ id: row!.id, key, is_new: true, parent_id: null });
    expect(calls[0].reset).toBeNull();
  });

  it("a command: /new's answer is sent once, and the resend answers nothing more", async () => {
    const { chat, key, eventId } = await answeredThenLost("INSERT INTO deliveries", "/new");
    const rows = await sessionsOfKey(key);
    expect(rows.map((r) => r.end_reason)).toEqual(["new_command", null]);
    const resent = await send({ chat_id: chat, text: "/new", event_id: eventId });
    expect(resent).toMatchObject({ status: 200, body: { duplicate: true } });
    await runAlarm(key);
    await router(key).drained();
    const answers = services!.replies().filter((r) => r.text === COMMAND_REPLIES.started);
    expect(answers).toHaveLength(1);
    expect(await router(key).outbox()).toEqual([]);
  });
});

describe("a delivery sent and recorded, the object killed before it forgot the item", () => {
  it("a command's answer: a fresh instance asks D1, finds it sent, and does not send it again", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "one" });
    await runAlarm(key);
    await router(key).drained();
    // The chat took the answer and D1 recorded it as sent; the object died right after.
    const fault = injectD1Fault({ afterCommit: true, match: has("UPDATE deliveries SET status") });
    vi.spyOn(console, "error").mockImplementation(() => undefined);
    await send({ chat_id: chat, text: "/new" });
    await runAlarm(key);
    await router(key).drained();
    expect(fault.hits()).toBe(1);
    const started = () => services!.replies().filter((r) => r.text === COMMAND_REPLIES.started);
    expect(started()).toHaveLength(1);
    const [item] = await router(key).outbox();
    expect(item).toMatchObject({ kind: "delivery" });
    // A new instance remembers nothing: D1 says the answer went out, so it is not sent twice.
    setNow(item!.dueAt);
    await alarmAfterRestart(key);
    expect(started()).toHaveLength(1);
    expect(await router(key).outbox()).toEqual([]);
  });
});
