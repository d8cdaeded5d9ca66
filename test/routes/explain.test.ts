/** `GET /admin/routes/{key}/explain` and keys holding encoded ids, through the worker's own fetch. */
import { runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  BASE,
  MINUTE,
  T0,
  adminFetch,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentConfig, fakeServices } from "../agent/support";

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) });
});
afterEach(() => {
  restoreClock();
  useConfig(null);
});

const routePath = (key: string) => `/admin/routes/${encodeURIComponent(key)}`;
const explainOf = async (key: string) => {
  const response = await adminFetch(`${routePath(key)}/explain`);
  expect(response.status).toBe(200);
  return (await response.json()) as any;
};

/** Everything explain could touch: the key's D1 rows and the routing object's own storage. */
async function stateOf(key: string) {
  const all = async (sql: string) => (await env.DB.prepare(sql).bind(key).all()).results;
  return {
    sessions: await all(`SELECT * FROM sessions WHERE session_key = ? ORDER BY id`),
    messages: await all(
      `SELECT * FROM messages WHERE session_id IN (SELECT id FROM sessions WHERE session_key = ?) ORDER BY session_id, seq`,
    ),
    runs: await all(`SELECT * FROM runs WHERE session_key = ? ORDER BY id`),
    events: await all(`SELECT * FROM events WHERE session_key = ? ORDER BY id`),
    object: await runInDurableObject(router(key), async (_instance, state) => ({
      entry: state.storage.sql.exec(`SELECT * FROM entry`).toArray(),
      outbox: state.storage.sql.exec(`SELECT * FROM outbox ORDER BY id`).toArray(),
      alarm: await state.storage.getAlarm(),
    })),
  };
}

describe("explain", () => {
  it("a key never seen: 200, no session, a fresh one would start", async () => {
    const body = await explainOf(genericKey(unique("nobody")));
    expect(body).toMatchObject({
      session: null,
      last_active_at: null,
      would: { action: "fresh", reason: "no_session" },
      open_run: null,
      waiting: 0,
      policy: { mode: "idle", idle_minutes: 60, source: "default" },
      overlap: { mode: "queue", debounce_ms: 0, max_batch: 20, source: "default" },
      deadline: { at: null, reason: null, timezone: "UTC" },
    });
  });

  it("a live session: append, its deadline, the alarm, the policy's layer", async () => {
    useConfig({
      SESSION_RESET: JSON.stringify({
        mode: "idle",
        idle_minutes: 60,
        by_platform: { generic: { idle_minutes: 1.5 } },
      }),
    });
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key); // the echo agent answers; the alarm is then the deadline
    const body = await explainOf(key);
    expect(body.key).toBe(key);
    expect(body.entry_session_id).toBe(sent.body.session_id);
    expect(body.session).toMatchObject({ id: sent.body.session_id, session_key: key, end_reason: null });
    expect(body.policy).toMatchObject({ mode: "idle", idle_minutes: 1.5, source: "by_platform" });
    expect(body.last_active_at).toBe(T0);
    expect(body.deadline).toMatchObject({ at: T0 + 90_001, reason: "idle", idle_at: T0 + 90_001, daily_at: null });
    expect(body.alarm_at).toBe(T0 + 90_001);
    expect(body.would).toMatchObject({ action: "append", reason: "live" });
    expect(body.open_run).toBeNull(); // the echo agent's run finished at once
  });

  it("shows the effective OVERLAP settings and the layer they came from", async () => {
    useConfig({
      SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
      OVERLAP: JSON.stringify({
        debounce_ms: 1500,
        by_chat_type: { group: { mode: "interrupt", max_batch: 5 } },
        by_platform: { telegram: { mode: "concurrent" } },
      }),
    });
    const dm = await explainOf(genericKey(unique("dm")));
    expect(dm.overlap).toEqual({ mode: "queue", debounce_ms: 1500, max_batch: 20, source: "default" });
    const group = await explainOf(`generic:group:${unique("g")}`);
    expect(group.overlap).toEqual({ mode: "interrupt", debounce_ms: 1500, max_batch: 5, source: "by_chat_type" });
    const telegram = await explainOf(`telegram:group:${unique("t")}`);
    expect(telegram.overlap).toEqual({ mode: "concurrent", debounce_ms: 1500, max_batch: 5, source: "by_platform" });
  });

  it("shows a row changed by SQL at once, and a message then does what it said", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    await env.DB.prepare(`UPDATE sessions SET last_active_at = ? WHERE id = ?`)
      .bind(T0 - 61 * MINUTE, sent.body.session_id)
      .run();
    const body = await explainOf(key);
    expect(body.last_active_at).toBe(T0 - 61 * MINUTE);
    expect(body.would).toMatchObject({
      action: "fresh",
      reason: "expired",
      expire: { session_id: sent.body.session_id, reason: "idle" },
    });
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(sent.body.session_id);
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: "idle" });
  });

  it("changes nothing: D1 rows, the entry, the outbox and the alarm are identical before and after", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat }); // its hand-off is still in the outbox
    setNow(T0 + 61 * MINUTE); // past the deadline: explain says it would end, and must not
    const before = await stateOf(key);
    const body = await explainOf(key);
    expect(body.would.action).toBe("fresh");
    expect(await stateOf(key)).toEqual(before);
  });

  it("without a routing entry reads the key's newest row, as a message would", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat });
    await runAlarm(key); // the first turn is answered, so nothing holds the session past its deadline
    setNow(T0 + 2 * 60 * MINUTE);
    const newest = await send({ chat_id: chat });
    await adminFetch(routePath(key), { method: "DELETE" });
    const body = await explainOf(key);
    expect(body.entry_session_id).toBeNull();
    expect(body.session.id).toBe(newest.body.session_id);
    expect(body.would).toMatchObject({ action: "append", reason: "live" });
    expect((await sessionsOfKey(key)).length).toBe(2);
  });

  it("with a routing entry reads the entry's row, not a newer row of the key, as a message would", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await env.DB.prepare(
      `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at) VALUES (?, ?, 'generic', 'dm', ?, ?)`,
    )
      .bind(unique("ses_sql"), key, T0 + 1, T0 + 1)
      .run();
    const body = await explainOf(key);
    expect(body.entry_session_id).toBe(sent.body.session_id);
    expect(body.session.id).toBe(sent.body.session_id);
    expect((await send({ chat_id: chat })).body.session_id).toBe(sent.body.session_id);
  });

  it("a durable boundary: fresh, naming the session it replaces", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, { method: "POST" });
    const body = await explainOf(key);
    expect(body.would).toMatchObject({
      action: "fresh",
      reason: "ended",
      replaces: { session_id: sent.body.session_id, reason: "admin" },
    });
    expect(body.would.expire).toBeUndefined();
  });

  /** One message handed to a fake agent answering `answer`: its key and the calls made. */
  async function handedOnce(answer: () => Response) {
    useConfig(agentConfig());
    const services = fakeServices(answer);
    const chat = unique("chat");
    const key = genericKey(chat);
    try {
      await send({ chat_id: chat });
      await runAlarm(key);
    } finally {
      services.restore();
    }
    return { key, services };
  }

  it("shows an accepted run as open until its lease lapses", async () => {
    const { key, services } = await handedOnce(accepted);
    expect(services.agentCalls()).toHaveLength(1);
    const body = await explainOf(key);
    expect(body.open_run).toMatchObject({ status: "running", lease_until: T0 + 10 * MINUTE, finished_at: null });
    expect(body.open_run.run_id).toBe(body.session.current_run_id);
    setNow(T0 + 10 * MINUTE);
    expect((await explainOf(key)).open_run).toBeNull();
  });

  it("shows a hand-off being retried as dispatching, with its attempts and last error", async () => {
    const { key, services } = await handedOnce(() => new Response("busy", { status: 503 }));
    const body = await explainOf(key);
    expect(body.open_run).toMatchObject({ status: "dispatching", attempts: 1, lease_until: null });
    expect(body.open_run.last_error).toContain("503");
    expect(body.open_run.run_id).toBe(services.agentCalls()[0]!.json.run_id);
  });

  it("needs the admin token", async () => {
    const response = await exports.default.fetch(new Request(`${BASE}${routePath("generic:dm:x")}/explain`));
    expect(response.status).toBe(401);
  });
});

describe("a key holding a percent-encoded id, URL-encoded once in the path", () => {
  // Chat id "a:b" gives the key generic:dm:a%3Ab, sent as generic%3Adm%3Aa%253Ab.
  it("GET, explain and DELETE find it; the twice-decoded key is another key", async () => {
    const chat = `${unique("a")}:b`;
    const key = genericKey(chat.replace(":", "%3A"));
    const sent = await send({ chat_id: chat });
    expect(routePath(key)).toContain("%253A");
    const route = (await (await adminFetch(routePath(key))).json()) as any;
    expect(route.entry?.session_id).toBe(sent.body.session_id);
    expect((await explainOf(key)).session?.id).toBe(sent.body.session_id);
    // Decoded twice, the path would name generic:dm:…:b, a key with no session.
    const twice = genericKey(chat);
    expect((await (await adminFetch(routePath(twice))).json()) as any).toMatchObject({ entry: null });
    const deleted = await adminFetch(routePath(key), { method: "DELETE" });
    expect(await deleted.json()).toEqual({ forgotten: true, session_key: key });
    expect(((await (await adminFetch(routePath(key))).json()) as any).entry).toBeNull();
  });
});
