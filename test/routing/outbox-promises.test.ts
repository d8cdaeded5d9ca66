/**
 * The outbox's own promises, each pinned by a test that fails when it is broken:
 * a platform delivery is given up after 10 attempts; a hand-off after a day of
 * retries; an outbox item that throws is retried (kept, its attempt counted), never
 * deleted; a run staged before a restart is handed over only with its D1 dedupe mark.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  HOUR,
  alarmAfterRestart,
  T0,
  adminFetch,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { OutboxTable as RouterStorage } from "../../src/routing/outbox-table";
import { sweep } from "../../src/sweep";
import type { RunWork } from "../../src/routing/work";
import { AGENT_URL, REPLY_URL, agentConfig, replyWith } from "../agent/support";
import { captureFetch } from "../helpers";

const DAY = 24 * HOUR;
let outbound: ReturnType<typeof captureFetch> | null = null;

beforeEach(() => setNow(T0));
afterEach(() => {
  outbound?.restore();
  outbound = null;
  restoreClock();
  useConfig(null);
});

const metrics = async () => (await (await adminFetch(`/admin/metrics`)).json()) as any;
const calls = (url: string) => outbound!.calls.filter((c) => c.url === url);

/** Fires the alarm at its own time until the outbox is empty (or `max` alarms ran). */
async function untilEmpty(key: string, max = 40): Promise<void> {
  for (let i = 0; i < max && (await router(key).outbox()).length > 0; i++) {
    const at = Math.min(...(await router(key).outbox()).map((item) => item.dueAt));
    setNow(Math.max(Date.now(), at));
    await runAlarm(key);
  }
}

describe("delivery give-up", () => {
  it("a reply the platform keeps refusing with 5xx is tried 10 times, then failed and counted", async () => {
    useConfig({ ...agentConfig({ HOOK_URLS: "" }), AGENT_URL: "" }); // the echo agent answers
    outbound = captureFetch((request) => {
      if (request.url === REPLY_URL) return new Response("down", { status: 503 });
      throw new Error(`unexpected ${request.url}`);
    });
    const before = (await metrics()).deliveries_failed;
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await untilEmpty(key);
    expect(calls(REPLY_URL)).toHaveLength(10);
    const view = (await (await adminFetch(`/admin/sessions/${sent.body.session_id}`)).json()) as any;
    expect(view.deliveries).toMatchObject([{ kind: "reply", status: "failed", attempts: 10, last_status: 503 }]);
    expect(await router(key).outbox()).toEqual([]);
    expect((await metrics()).deliveries_failed).toBe(before + 1);
  });
});

describe("run give-up", () => {
  it("a hand-off retried for a day is marked failed, leaves the outbox, and is counted", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return new Response("down", { status: 503 });
      throw new Error(`unexpected ${request.url}`);
    });
    const before = (await metrics()).runs_failed;
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await runAlarm(key);
    // Just under a day: still retried.
    setNow(T0 + DAY - 1_000);
    await runAlarm(key);
    expect((await router(key).outbox()).filter((i) => i.kind === "run")).toMatchObject([{ attempts: 2 }]);
    // Past a day: the next attempt is the last.
    setNow(T0 + DAY + 1_000);
    await runAlarm(key);
    expect(calls(AGENT_URL)).toHaveLength(3);
    expect((await router(key).outbox()).filter((i) => i.kind === "run")).toEqual([]);
    const run = await env.DB.prepare(`SELECT failed_at, last_error FROM runs WHERE id = ?`)
      .bind(calls(AGENT_URL)[0]!.json.run_id)
      .first<any>();
    expect(run).toMatchObject({ failed_at: T0 + DAY + 1_000, last_error: expect.stringContaining("503") });
    expect((await metrics()).runs_failed).toBe(before + 1);
  });
});

describe("an item that throws", () => {
  it("is kept and retried with its attempt counted (D1 refused the hand-off's batch), then handed over once", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return replyWith("at last");
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected ${request.url}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await env.DB.exec("ALTER TABLE runs RENAME TO runs_away");
    try {
      await runAlarm(key);
    } finally {
      await env.DB.exec("ALTER TABLE runs_away RENAME TO runs");
    }
    const [item] = await router(key).outbox();
    expect(item).toMatchObject({ kind: "run", attempts: 1, dueAt: T0 + 1_000 });
    expect(item!.lastError).toContain("runs");
    expect(calls(AGENT_URL)).toHaveLength(0);
    setNow(T0 + 1_000);
    await runAlarm(key);
    expect(calls(AGENT_URL)).toHaveLength(1);
    expect(calls(REPLY_URL).map((c) => c.json.text)).toEqual(["at last"]);
  });
});

describe("a run staged before a restart", () => {
  /** Writes a run item into the object's outbox as a restart leaves it (staged, never confirmed). */
  async function stageUnconfirmed(key: string, work: RunWork): Promise<void> {
    await runInDurableObject(router(key), async (_instance, state) => {
      new RouterStorage(state.storage.sql).add({
        id: work.runId,
        kind: "run",
        payload: work,
        dueAt: T0,
        attempts: 0,
        lastError: null,
        createdAt: T0,
      });
      // As the restarted object finds it: its alarm still set for that work.
      await state.storage.setAlarm(T0);
    });
  }

  it("is dropped, never handed over, when D1 has no dedupe mark for it", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    outbound = captureFetch((request) => {
      throw new Error(`unexpected ${request.url}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const runId = `run_${unique("never")}`;
    const eventId = unique("evt_never_stored");
    await stageUnconfirmed(key, {
      stage: "dispatch",
      runId,
      token: "run_x.token",
      sessionId: "ses_never_stored",
      isNew: true,
      parentId: null,
      reset: null,
      message: {
        platform: "generic",
        eventId,
        chatId: chat,
        chatType: "dm",
        userId: "u1",
        threadId: null,
        text: "never stored",
        sentAt: null,
        replyTo: { platform: "generic" },
        sessionKey: key,
        receivedAt: T0,
      },
    });
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    try {
      await runAlarm(key);
      // The operator's log says which hand-off was dropped, and why.
      const lines = warn.mock.calls.map(([line]) => JSON.parse(String(line)) as Record<string, unknown>);
      expect(lines).toContainEqual(
        expect.objectContaining({
          msg: "hand-off dropped: D1 has no stored message for it",
          session_key: key,
          run_id: runId,
          event_id: eventId,
        }),
      );
    } finally {
      warn.mockRestore();
    }
    expect(outbound.calls).toEqual([]);
    expect(await router(key).outbox()).toEqual([]);
  });

  it("is dropped when the dedupe mark names another run (the message went out with that one)", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return replyWith("once");
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected ${request.url}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "real" });
    await runAlarm(key);
    expect(calls(AGENT_URL)).toHaveLength(1);
    const real = calls(AGENT_URL)[0]!.json;
    await stageUnconfirmed(key, {
      stage: "dispatch",
      runId: `run_${unique("ghost")}`,
      token: "run_ghost.token",
      sessionId: sent.body.session_id,
      isNew: false,
      parentId: null,
      reset: null,
      message: {
        platform: "generic",
        eventId: sent.eventId,
        chatId: chat,
        chatType: "dm",
        userId: "u1",
        threadId: null,
        text: "real",
        sentAt: null,
        replyTo: { platform: "generic" },
        sessionKey: key,
        receivedAt: T0,
      },
    });
    await runAlarm(key);
    expect(calls(AGENT_URL).map((c) => c.json.run_id)).toEqual([real.run_id]);
    expect(await router(key).outbox()).toEqual([]);
  });
});

describe("a hand-off retried by a restarted object", () => {
  it("first tried by a late alarm two calendar days on, it finds its message's dedupe mark on the day it was written", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return replyWith("sorry for the wait");
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected ${request.url}`);
    });
    const storedAt = Date.UTC(2031, 0, 15, 23, 50);
    setNow(storedAt);
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "anyone?" });
    // The alarm comes late (00:05 on the 17th), and to an object that restarted meanwhile.
    setNow(storedAt + DAY + 15 * 60_000);
    await alarmAfterRestart(key);
    expect(calls(AGENT_URL).map((c) => c.json.message.text)).toEqual(["anyone?"]);
    expect(calls(REPLY_URL).map((c) => c.json.text)).toEqual(["sorry for the wait"]);
    expect(await router(key).outbox()).toEqual([]);
  });

  it("left behind by a crash after its dead letter, it is not handed over again: the run stays failed for the operator", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return new Response("down", { status: 503 });
      throw new Error(`unexpected ${request.url}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await runAlarm(key);
    const staged = await runInDurableObject(router(key), (_instance, state) =>
      new RouterStorage(state.storage.sql).all().find((item) => item.kind === "run"),
    );
    setNow(T0 + DAY + 1_000);
    await runAlarm(key);
    expect(calls(AGENT_URL)).toHaveLength(2);
    // The object died after the dead letter's batch and before the item left the outbox.
    await runInDurableObject(router(key), (_instance, state) => new RouterStorage(state.storage.sql).add(staged!));
    setNow(T0 + DAY + 60_000);
    await alarmAfterRestart(key);
    expect(calls(AGENT_URL)).toHaveLength(2);
    expect((await router(key).outbox()).filter((item) => item.kind === "run")).toEqual([]);
    const run = await env.DB.prepare(`SELECT failed_at FROM runs WHERE id = ?`).bind(staged!.id).first<any>();
    expect(run).toEqual({ failed_at: T0 + DAY + 1_000 });
  });

  it("an operator's retry is handed over after a restart even once the sweep removed the message's dedupe mark", async () => {
    useConfig(agentConfig({ HOOK_URLS: "", SESSION_RESET: JSON.stringify({ mode: "none" }) }));
    let agentUp = false;
    outbound = captureFetch((request) => {
      if (request.url === AGENT_URL)
        return agentUp ? replyWith("late, but here") : new Response("down", { status: 503 });
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected ${request.url}`);
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "still there?" });
    await runAlarm(key);
    setNow(T0 + DAY + 1_000);
    await runAlarm(key);
    const runId = calls(AGENT_URL)[0]!.json.run_id as string;
    expect(await env.DB.prepare(`SELECT failed_at FROM runs WHERE id = ?`).bind(runId).first<any>()).toEqual({
      failed_at: T0 + DAY + 1_000,
    });
    // Five days on, the sweep has removed the dedupe marks of the message's day.
    setNow(T0 + 5 * DAY);
    await sweep(env);
    expect(
      await env.DB.prepare(`SELECT COUNT(*) AS n FROM inbound_events WHERE run_id = ?`).bind(runId).first<any>(),
    ).toEqual({
      n: 0,
    });
    const retried = await adminFetch(`/admin/runs/${runId}/retry`, { method: "POST" });
    expect(retried.status).toBe(200);
    await router(key).drained();
    await runAlarm(key);
    const attemptsBefore = calls(AGENT_URL).length;
    agentUp = true;
    setNow(T0 + 5 * DAY + HOUR);
    await alarmAfterRestart(key);
    expect(calls(AGENT_URL)).toHaveLength(attemptsBefore + 1);
    expect(calls(AGENT_URL).at(-1)!.json).toMatchObject({ run_id: runId, message: { text: "still there?" } });
    expect(calls(REPLY_URL).map((c) => c.json.text)).toEqual(["late, but here"]);
  });
});
