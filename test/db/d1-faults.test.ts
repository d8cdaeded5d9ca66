/**
 * D1 faults mid-batch (through the test seam `injectD1Fault` of src/db/client.ts,
 * which makes real D1 fail a batch at its Nth statement): the webhook answers 5xx
 * and nothing is half stored, and the platform's retry lands once; the alarm's
 * expiry batch and the drain's reply batch likewise leave nothing half done and
 * land once when retried. Every statement position of each batch is tried.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Database, exec, injectD1Fault, mayHaveCommitted } from "../../src/db/client";
import { backoffDelay } from "../../src/http/backoff";
import {
  MINUTE,
  T0,
  alarmOf,
  captureFetch,
  eventsOf,
  genericKey,
  loggedLines,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  tableCounts,
  unique,
  useConfig,
} from "../helpers";
import { AGENT_URL, REPLY_URL, agentConfig, replyWith } from "../agent/support";

const has = (fragment: string) => (sql: readonly string[]) => sql.some((s) => s.includes(fragment));

beforeEach(() => setNow(T0));
afterEach(() => {
  vi.restoreAllMocks();
  injectD1Fault(null);
  restoreClock();
  useConfig(null);
});

describe("the webhook's batch", () => {
  it("a new key: at every statement, 5xx and nothing stored; the retry stores the message once", async () => {
    let positions = 0;
    for (let index = 0; ; index++) {
      const chat = unique("chat");
      const eventId = unique("evt");
      const before = await tableCounts();
      const fault = injectD1Fault({ index, match: has("INSERT INTO messages") });
      const failed = await send({ chat_id: chat, event_id: eventId, text: "first" });
      if (fault.hits() === 0) break; // past the batch's last statement
      positions += 1;
      expect(failed.status).toBeGreaterThanOrEqual(500);
      expect(await tableCounts()).toEqual(before);
      const retried = await send({ chat_id: chat, event_id: eventId, text: "first" });
      expect(retried).toMatchObject({ status: 200, body: { duplicate: false } });
      expect((await send({ chat_id: chat, event_id: eventId, text: "first" })).body.duplicate).toBe(true);
      const sessions = await sessionsOfKey(genericKey(chat));
      expect(sessions).toHaveLength(1);
      expect((await messagesOf(sessions[0]!.id)).map((m) => m.text)).toEqual(["first"]);
    }
    expect(positions).toBeGreaterThanOrEqual(5);
  });

  it("a live session: at every statement of the append, 5xx and nothing stored; the retry lands once", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    let positions = 0;
    for (let index = 0; ; index++) {
      const eventId = unique("evt");
      const before = await tableCounts();
      const fault = injectD1Fault({ index, match: has("INSERT INTO messages") });
      const failed = await send({ chat_id: chat, event_id: eventId, text: `two-${index}` });
      if (fault.hits() === 0) break;
      positions += 1;
      expect(failed.status).toBeGreaterThanOrEqual(500);
      expect(await tableCounts()).toEqual(before);
      expect(await sessionRow(first.body.session_id)).toMatchObject({ message_count: index + 1 });
      expect((await send({ chat_id: chat, event_id: eventId, text: `two-${index}` })).status).toBe(200);
      expect((await send({ chat_id: chat, event_id: eventId, text: `two-${index}` })).body.duplicate).toBe(true);
    }
    expect(positions).toBe(3);
    const texts = (await messagesOf(first.body.session_id)).map((m) => m.text);
    // "two-3" is the probe past the batch's end, stored at once.
    expect(texts).toEqual(["one", "two-0", "two-1", "two-2", "two-3"]);
  });

  it("failing, answers 503 unavailable naming the cause and logs the key it could not route", async () => {
    const chat = unique("chat");
    injectD1Fault({ match: has("INSERT INTO messages") });
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const failed = await send({ chat_id: chat, text: "lost?" });
    expect(failed).toMatchObject({
      status: 503,
      body: { error: { code: "unavailable", message: expect.stringContaining("d1_fault_injected_by_test") } },
    });
    expect(loggedLines(errors, "route failed")).toEqual([
      expect.objectContaining({
        session_key: genericKey(chat),
        error: expect.stringContaining("d1_fault_injected_by_test"),
      }),
    ]);
  });
});

describe("the alarm's expiry batch", () => {
  it("at every statement: the session stays live with no events; the next alarm ends and finalizes it once", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }), HOOK_URLS: "" });
    let positions = 0;
    for (let index = 0; ; index++) {
      setNow(T0);
      const chat = unique("chat");
      const key = genericKey(chat);
      const sent = await send({ chat_id: chat });
      await runAlarm(key); // the hand-off (echo)
      setNow(T0 + 61 * MINUTE);
      const fault = injectD1Fault({ index, match: has("SET end_reason") });
      await runAlarm(key);
      if (fault.hits() === 0) break;
      positions += 1;
      expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null, ended_at: null });
      expect((await eventsOf(sent.body.session_id)).map((e) => e.type)).toEqual(["session.started"]);
      setNow(T0 + 62 * MINUTE);
      await runAlarm(key);
      await runAlarm(key);
      expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
      const events = (await eventsOf(sent.body.session_id)).map((e) => e.type);
      expect(events.filter((t) => t === "session.ended")).toHaveLength(1);
      expect(events.filter((t) => t === "session.finalized")).toHaveLength(1);
    }
    // promote, revoke runs, record waiting messages not dispatched, and the events.
    expect(positions).toBe(6);
  });

  it("failing, is logged with its key and looked at again after a backoff, not at once, and the session ends then", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }), HOOK_URLS: "" });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    setNow(T0 + 61 * MINUTE);
    injectD1Fault({ match: has("SET end_reason") });
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    await runAlarm(key);
    expect(loggedLines(errors, "alarm: could not check the live session")).toEqual([
      expect.objectContaining({ session_key: key, error: expect.stringContaining("d1_fault_injected_by_test") }),
    ]);
    // D1 down: the next look backs off (the first failure's wait), it does not fire again at once.
    expect(await alarmOf(key)).toBe(T0 + 61 * MINUTE + backoffDelay(2));
    setNow(T0 + 61 * MINUTE + backoffDelay(2));
    await runAlarm(key);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
  });
});

describe("the drain's reply batch", () => {
  it("at every statement: no half-recorded reply; the retry records and delivers it once, the agent asked once", async () => {
    useConfig(agentConfig({ HOOK_URLS: "" }));
    const outbound = captureFetch((request) => {
      if (request.url === AGENT_URL) return replyWith("the answer");
      if (request.url === REPLY_URL) return new Response("ok");
      throw new Error(`unexpected ${request.url}`);
    });
    try {
      let positions = 0;
      for (let index = 0; ; index++) {
        setNow(T0);
        const chat = unique("chat");
        const key = genericKey(chat);
        const sent = await send({ chat_id: chat, text: "question" });
        const calls = () =>
          outbound.calls.filter(
            (c) => c.json?.session_id === sent.body.session_id || c.json?.session?.id === sent.body.session_id,
          );
        const fault = injectD1Fault({ index, match: has("UPDATE runs SET finished_at") });
        await runAlarm(key);
        if (fault.hits() === 0) break;
        positions += 1;
        const runId = calls()[0]!.json.run_id;
        const run = await env.DB.prepare(`SELECT finished_at FROM runs WHERE id = ?`).bind(runId).first<any>();
        expect(run.finished_at).toBeNull();
        expect((await messagesOf(sent.body.session_id)).map((m) => m.role)).toEqual(["user"]);
        const deliveries = await env.DB.prepare(`SELECT id FROM deliveries WHERE session_id = ?`)
          .bind(sent.body.session_id)
          .all();
        expect(deliveries.results).toEqual([]);
        setNow(T0 + 1_000);
        await runAlarm(key);
        await runAlarm(key);
        expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["question", "the answer"]);
        expect(calls().filter((c) => c.url === AGENT_URL)).toHaveLength(1);
        expect(
          calls()
            .filter((c) => c.url === REPLY_URL)
            .map((c) => c.json.text),
        ).toEqual(["the answer"]);
      }
      expect(positions).toBeGreaterThanOrEqual(5);
    } finally {
      outbound.restore();
    }
  });
});

describe("a batch that threw: rolled back, or perhaps committed", () => {
  const failureOf = async (run: () => Promise<unknown>) => {
    try {
      await run();
    } catch (error) {
      return error;
    }
    throw new Error("the batch did not throw");
  };
  const db = () => new Database(env.DB, "ingress");

  it("a statement SQLite refused rolled the whole batch back", async () => {
    const chat = unique("chat");
    const error = await failureOf(() =>
      db().batch(
        exec(
          "INSERT INTO inbound_events (day, platform, event_id, session_key, received_at) VALUES (0, 'generic', ?, 'k', 0)",
          chat,
        ),
        exec("SELECT * FROM no_such_table"),
      ),
    );
    expect(mayHaveCommitted(error)).toBe(false);
    expect(await env.DB.prepare("SELECT * FROM inbound_events WHERE event_id = ?").bind(chat).first()).toBeNull();
  });

  it("a constraint SQLite enforced is a refusal too", async () => {
    const error = await failureOf(() => env.DB.batch([env.DB.prepare("INSERT INTO sessions (id) VALUES (NULL)")]));
    expect(mayHaveCommitted(error)).toBe(false);
  });

  it("a failure D1 gives no SQLite code for (the connection lost, the object reset) may have committed", async () => {
    expect(mayHaveCommitted(new Error("D1_ERROR: Network connection lost."))).toBe(true);
    expect(
      mayHaveCommitted(new Error("D1 DB storage operation exceeded timeout which caused object to be reset.")),
    ).toBe(true);
    const injected = await failureOf(() => {
      injectD1Fault({ afterCommit: true });
      return db().batch(exec("SELECT 1"));
    });
    expect(mayHaveCommitted(injected)).toBe(true);
  });
});
