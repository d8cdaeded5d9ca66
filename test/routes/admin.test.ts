/** The operator API (spec "Operator API"), through the worker's own fetch. */
import { env, exports } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  ADMIN_TOKEN,
  BASE,
  MINUTE,
  T0,
  adminFetch,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }), AGENT_TOKEN: "agent-token" });
});
afterEach(() => {
  restoreClock();
  useConfig(null);
});

const routePath = (key: string) => `/admin/routes/${encodeURIComponent(key)}`;
const SESSION_FIELDS = [
  "id",
  "session_key",
  "started_at",
  "last_active_at",
  "ended_at",
  "end_reason",
  "parent_session_id",
];

describe("authorisation", () => {
  const paths = ["/admin/metrics", "/admin/sessions", `/admin/routes/${encodeURIComponent("generic:dm:x")}`];
  for (const path of paths) {
    it(`GET ${path}: 401 without a token or with a wrong one, 403 with the agent's token`, async () => {
      const none = await exports.default.fetch(new Request(`${BASE}${path}`));
      expect(none.status).toBe(401);
      expect(await none.json()).toEqual({ error: { code: "unauthorized", message: expect.any(String) } });
      const wrong = await exports.default.fetch(
        new Request(`${BASE}${path}`, { headers: { authorization: "Bearer nope" } }),
      );
      expect(wrong.status).toBe(401);
      const agent = await exports.default.fetch(
        new Request(`${BASE}${path}`, { headers: { authorization: "Bearer agent-token" } }),
      );
      expect(agent.status).toBe(403);
      const right = await exports.default.fetch(
        new Request(`${BASE}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
      );
      expect(right.status).toBe(200);
    });
  }

  it("refuses everything while ADMIN_TOKEN is unset", async () => {
    useConfig({ ADMIN_TOKEN: "" });
    const response = await exports.default.fetch(
      new Request(`${BASE}/admin/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    );
    expect(response.status).toBe(401);
  });
});

describe("routes", () => {
  it("shows the entry, the live session's deadline and its row; null for an unknown key", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    const body = (await (await adminFetch(routePath(key))).json()) as any;
    expect(body.entry).toMatchObject({ session_key: key, session_id: sent.body.session_id, last_active_at: T0 });
    expect(body.alarm_at).toBe(T0 + 60 * MINUTE + 1);
    expect(body.session).toMatchObject({ id: sent.body.session_id, session_key: key, end_reason: null });
    for (const field of SESSION_FIELDS) expect(body.session).toHaveProperty(field);
    expect(await (await adminFetch(routePath(genericKey(unique("nobody"))))).json()).toEqual({
      entry: null,
      alarm_at: null,
      session: null,
    });
  });

  it("shows alarm_at as the deadline even while the alarm is set earlier for due work", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat }); // the hand-off is due now, so the alarm is at T0 + 1
    const body = (await (await adminFetch(routePath(key))).json()) as any;
    expect(body.alarm_at).toBe(T0 + 60 * MINUTE + 1);
  });

  it("an ended session's route has no deadline; a row deleted by hand leaves the entry with no row", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    const ended = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, { method: "POST" });
    expect(ended.status).toBe(200);
    const after = (await (await adminFetch(routePath(key))).json()) as any;
    expect(after.session).toMatchObject({ id: sent.body.session_id, end_reason: "admin" });
    expect(after.alarm_at).toBeNull();
    // The entry still names it (the next message decides what follows).
    expect(after.entry).toMatchObject({ session_id: sent.body.session_id });
    await env.DB.prepare(`DELETE FROM sessions WHERE id = ?`).bind(sent.body.session_id).run();
    const gone = (await (await adminFetch(routePath(key))).json()) as any;
    expect(gone).toMatchObject({
      entry: { session_id: sent.body.session_id, last_active_at: null, notice_pending: null },
      alarm_at: null,
      session: null,
    });
  });

  it("handles keys with encoded ids", async () => {
    const chat = "odd:id%/x";
    const key = `generic:dm:${"odd%3Aid%25/x"}`;
    const sent = await send({ chat_id: chat, event_id: unique("e") });
    const body = (await (await adminFetch(routePath(key))).json()) as any;
    expect(body.entry?.session_id).toBe(sent.body.session_id);
  });

  it("DELETE forgets the entry and its deadline but keeps D1", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat });
    await runAlarm(key);
    const deleted = await adminFetch(routePath(key), { method: "DELETE" });
    expect(deleted.status).toBe(200);
    expect(await (await adminFetch(routePath(key))).json()).toEqual({ entry: null, alarm_at: null, session: null });
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    // The next message resolves the key from D1 alone.
    expect((await send({ chat_id: chat })).body.session_id).toBe(sent.body.session_id);
  });
});

describe("sessions", () => {
  it("lists a key's sessions newest first, filtered by open", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(key);
    setNow(T0 + 2 * 60 * MINUTE);
    const second = await send({ chat_id: chat });
    const all = (await (await adminFetch(`/admin/sessions?key=${encodeURIComponent(key)}`)).json()) as any;
    expect(all.sessions.map((s: any) => s.id)).toEqual([second.body.session_id, first.body.session_id]);
    for (const field of SESSION_FIELDS) expect(all.sessions[0]).toHaveProperty(field);
    const open = (await (await adminFetch(`/admin/sessions?key=${encodeURIComponent(key)}&open=true`)).json()) as any;
    expect(open.sessions.map((s: any) => s.id)).toEqual([second.body.session_id]);
    const closed = (await (
      await adminFetch(`/admin/sessions?key=${encodeURIComponent(key)}&open=false`)
    ).json()) as any;
    expect(closed.sessions.map((s: any) => [s.id, s.end_reason])).toEqual([[first.body.session_id, "idle"]]);
    expect((await adminFetch(`/admin/sessions?open=maybe`)).status).toBe(400);
    // Empty values are no filter, as when absent.
    const empty = (await (await adminFetch(`/admin/sessions?key=&open=`)).json()) as any;
    expect(empty.sessions.length).toBeGreaterThanOrEqual(2);
  });

  it("shows one session with its messages oldest first, its events and its deliveries", async () => {
    const chat = unique("chat");
    const sent = await send({ chat_id: chat, text: "one" });
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    const body = (await (await adminFetch(`/admin/sessions/${sent.body.session_id}`)).json()) as any;
    expect(body.session.id).toBe(sent.body.session_id);
    // "one" has its run; "two" arrived while that run was unfinished, and waits (queue, the default).
    expect(body.messages).toEqual([
      { role: "user", text: "one", at: T0, attachments: [], run_id: expect.any(String), not_dispatched: null },
      { role: "user", text: "two", at: T0 + 1, attachments: [], run_id: null, not_dispatched: null },
    ]);
    expect(body.events.map((e: any) => e.type)).toEqual(["session.started"]);
    expect(body.deliveries).toEqual([]);
    expect((await adminFetch(`/admin/sessions/ses_nope`)).status).toBe(404);
  });

  it("ends a session as admin by default, once", async () => {
    const chat = unique("chat");
    const sent = await send({ chat_id: chat });
    const ended = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, { method: "POST" });
    expect(ended.status).toBe(200);
    expect(await ended.json()).toMatchObject({
      changed: true,
      session: { id: sent.body.session_id, end_reason: "admin", ended_at: T0 },
    });
    const again = await adminFetch(`/admin/sessions/${sent.body.session_id}/end`, {
      method: "POST",
      body: JSON.stringify({ reason: "idle" }),
    });
    expect(await again.json()).toMatchObject({ changed: false, session: { end_reason: "admin" } });
    // The next message starts fresh, in place of the ended one.
    const next = await send({ chat_id: chat });
    expect(next.body.session_id).not.toBe(sent.body.session_id);
    expect(await sessionRow(next.body.session_id)).toMatchObject({
      previous_session_id: sent.body.session_id,
      reset_reason: "admin",
    });
  });

  it("validates the end body and the id", async () => {
    const sent = await send({ chat_id: unique("chat") });
    const path = `/admin/sessions/${sent.body.session_id}/end`;
    expect((await adminFetch(path, { method: "POST", body: "{nope" })).status).toBe(400);
    expect((await adminFetch(path, { method: "POST", body: JSON.stringify({ reason: "because" }) })).status).toBe(400);
    expect((await adminFetch(path, { method: "POST", body: JSON.stringify({ reason: "compression" }) })).status).toBe(
      400,
    );
    expect(await sessionRow(sent.body.session_id)).toMatchObject({ end_reason: null });
    expect((await adminFetch(`/admin/sessions/ses_nope/end`, { method: "POST" })).status).toBe(404);
  });
});

describe("metrics and health", () => {
  it("counts routed messages, sessions and D1 rows from D1's own meta", async () => {
    const before = (await (await adminFetch("/admin/metrics")).json()) as any;
    const chat = unique("chat");
    await send({ chat_id: chat });
    await send({ chat_id: chat });
    const after = (await (await adminFetch("/admin/metrics")).json()) as any;
    for (const counter of [
      "messages_routed",
      "sessions_created",
      "events_delivered",
      "events_failed",
      "d1_rows_read",
      "d1_rows_written",
      "d1_rows_read_ingress",
      "d1_rows_written_ingress",
    ]) {
      expect(Number.isInteger(after[counter])).toBe(true);
    }
    expect(typeof after.sessions_ended).toBe("object");
    // Every figure is an integer, nested ones too.
    const integersOnly = (value: unknown): boolean =>
      typeof value === "number" ? Number.isInteger(value) : Object.values(value as object).every(integersOnly);
    expect(integersOnly(after)).toBe(true);
    expect(after.messages_routed - before.messages_routed).toBe(2);
    expect(after.sessions_created - before.sessions_created).toBe(1);
    expect(after.d1_rows_written_ingress - before.d1_rows_written_ingress).toBeGreaterThan(0);
  });

  it("GET /healthz answers 200 without a token; its D1 probe is counted in the metrics", async () => {
    const metrics = async () => (await (await adminFetch("/admin/metrics")).json()) as any;
    const before = await metrics();
    const response = await exports.default.fetch(new Request(`${BASE}/healthz`));
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ ok: true, status: "ok" });
    expect((await metrics()).d1_queries - before.d1_queries).toBe(1);
  });

  it("GET /healthz names an invalid configuration key", async () => {
    useConfig({ GROUP_SESSIONS_PER_USER: "sometimes" });
    const response = await exports.default.fetch(new Request(`${BASE}/healthz`));
    expect(response.status).toBe(500);
    expect(((await response.json()) as any).error.message).toContain("GROUP_SESSIONS_PER_USER");
  });

  it("unknown routes answer 404 in the error shape", async () => {
    const response = await exports.default.fetch(new Request(`${BASE}/nope`));
    expect(response.status).toBe(404);
    expect(await response.json()).toEqual({ error: { code: "not_found", message: expect.any(String) } });
  });
});
