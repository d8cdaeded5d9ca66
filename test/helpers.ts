/** Shared test helpers: signed webhooks through the worker's own fetch, the clock, D1 reads. */
import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { expect, vi } from "vitest";
import { overrideConfigForTests } from "../src/config";
import { hmacSha256Hex } from "../src/crypto";
import { SessionRouter } from "../src/routing/router";

export const GENERIC_SECRET = "test-generic-secret";
export const ADMIN_TOKEN = "test-admin-token";
export const BASE = "https://gateway.test";

/**
 * Tests run on a fake clock far in the future: an alarm set for a fake instant is
 * then also in the real future, so it never fires on its own and each test runs
 * alarms itself with runDurableObjectAlarm.
 */
export const T0 = Date.UTC(2031, 0, 15, 12, 0, 0);
export const MINUTE = 60_000;
export const HOUR = 60 * MINUTE;

export function setNow(t: number): void {
  vi.useFakeTimers({ toFake: ["Date"] });
  vi.setSystemTime(t);
}

export function restoreClock(): void {
  vi.useRealTimers();
}

/** Overrides config variables for this isolate (the worker and the routing objects). */
export function useConfig(vars: Record<string, string> | null): void {
  overrideConfigForTests(vars);
}

let counter = 0;
/** An id unique within the test run (storage is shared by the tests of a file). */
export function unique(prefix: string): string {
  counter += 1;
  return `${prefix}-${counter}-${crypto.randomUUID().slice(0, 8)}`;
}

export interface GenericMessage {
  event_id?: string;
  chat_id: string;
  chat_type?: "dm" | "group" | "channel";
  user_id?: string;
  thread_id?: string | null;
  text?: string;
  sent_at?: number;
}

export async function signedRequest(
  body: string,
  secret = GENERIC_SECRET,
  path = "/webhooks/generic",
): Promise<Request> {
  return new Request(`${BASE}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-signature-256": `sha256=${await hmacSha256Hex(secret, body)}` },
    body,
  });
}

/** POSTs one generic message, signed, through the worker's own fetch. */
export async function send(message: GenericMessage): Promise<{ status: number; body: any; eventId: string }> {
  const eventId = message.event_id ?? unique("evt");
  const payload = { chat_type: "dm", user_id: "u1", text: "hello", ...message, event_id: eventId };
  const response = await exports.default.fetch(await signedRequest(JSON.stringify(payload)));
  return { status: response.status, body: await response.json(), eventId };
}

export function genericKey(chatId: string, chatType = "dm"): string {
  return `generic:${chatType}:${chatId}`;
}

export function router(key: string): DurableObjectStub<SessionRouter> {
  return env.ROUTER.getByName(key);
}

export async function runAlarm(key: string): Promise<boolean> {
  return runDurableObjectAlarm(router(key));
}

/** A new instance of the routing object over the same storage (nothing kept in memory, as after a restart) fires its alarm. */
export async function alarmAfterRestart(key: string): Promise<void> {
  await runInDurableObject(router(key), async (_instance, state) => {
    const fresh = new SessionRouter(state, env);
    await fresh.alarm();
    await fresh.drained();
  });
}

/** The alarm as the object's storage holds it. */
export async function alarmOf(key: string): Promise<number | null> {
  return runInDurableObject(router(key), (_instance, state) => state.storage.getAlarm());
}

export async function adminFetch(path: string, init: RequestInit = {}): Promise<Response> {
  return exports.default.fetch(
    new Request(`${BASE}${path}`, { ...init, headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...init.headers } }),
  );
}

export interface SessionRecord {
  id: string;
  session_key: string;
  started_at: number;
  last_active_at: number;
  ended_at: number | null;
  end_reason: string | null;
  parent_session_id: string | null;
  message_count: number;
  [column: string]: unknown;
}

export async function sessionRow(id: string): Promise<SessionRecord | null> {
  return env.DB.prepare(`SELECT * FROM sessions WHERE id = ?`).bind(id).first<SessionRecord>();
}

export async function sessionsOfKey(key: string): Promise<SessionRecord[]> {
  const { results } = await env.DB.prepare(`SELECT * FROM sessions WHERE session_key = ? ORDER BY started_at`)
    .bind(key)
    .all<SessionRecord>();
  return results;
}

export async function messagesOf(
  sessionId: string,
): Promise<{ role: string; text: string; created_at: number; seq: number }[]> {
  const { results } = await env.DB.prepare(`SELECT * FROM messages WHERE session_id = ? ORDER BY seq`)
    .bind(sessionId)
    .all<{
      role: string;
      text: string;
      created_at: number;
      seq: number;
    }>();
  return results;
}

export async function eventsOf(
  sessionId: string,
): Promise<{ id: string; type: string; reason: string | null; status: string; payload: string }[]> {
  const { results } = await env.DB.prepare(`SELECT * FROM events WHERE session_id = ? ORDER BY created_at, id`)
    .bind(sessionId)
    .all<{
      id: string;
      type: string;
      reason: string | null;
      status: string;
      payload: string;
    }>();
  return results;
}

export interface Captured {
  url: string;
  method: string;
  /** The request's redirect mode ("manual" when a credential must not follow a redirect). */
  redirect: string;
  headers: Record<string, string>;
  body: string;
  json: any;
}

/**
 * Intercepts outbound fetch from the worker and its routing objects (same isolate).
 * `respond` answers each request; a request it does not expect should throw, which
 * fails the test. Returns the requests seen, in order.
 */
export function captureFetch(respond: (request: Captured) => Response | Promise<Response>): {
  calls: Captured[];
  restore: () => void;
} {
  const calls: Captured[] = [];
  const spy = vi.spyOn(globalThis, "fetch").mockImplementation(async (input, init) => {
    const request = new Request(input as RequestInfo, init as RequestInit);
    const body = await request.text();
    let json: unknown = null;
    try {
      json = JSON.parse(body);
    } catch {
      json = null;
    }
    const captured: Captured = {
      url: request.url,
      method: request.method,
      redirect: request.redirect,
      headers: Object.fromEntries(request.headers),
      body,
      json,
    };
    calls.push(captured);
    return respond(captured);
  });
  return { calls, restore: () => spy.mockRestore() };
}

/** Row counts of the tables a webhook writes: bad input must leave them unchanged. */
export async function tableCounts() {
  const count = async (table: string) =>
    (await env.DB.prepare(`SELECT COUNT(*) AS n FROM ${table}`).first<{ n: number }>())!.n;
  return {
    sessions: await count("sessions"),
    messages: await count("messages"),
    marks: await count("inbound_events"),
    deliveries: await count("deliveries"),
  };
}

/** A session's `deliveries`, as the operator API shows them. */
export async function deliveriesOf(sessionId: string): Promise<any[]> {
  const response = await adminFetch(`/admin/sessions/${sessionId}`);
  expect(response.status).toBe(200);
  return ((await response.json()) as any).deliveries;
}

/** The JSON log lines a console spy saw with this `msg` (the gateway logs one JSON object a line). */
export function loggedLines(spy: { mock: { calls: unknown[][] } }, msg: string): Record<string, unknown>[] {
  return spy.mock.calls
    .map(([line]) => JSON.parse(String(line)) as Record<string, unknown>)
    .filter((line) => line.msg === msg);
}

/**
 * For `injectD1Fault`'s `before`: another writer (an operator's SQL) ends `sessionId`,
 * each time with a reason other than the one it has (agent_close, then admin, and so
 * on), so a batch prepared from the row as it was read misses every time.
 */
export const endOtherwiseBySql = (sessionId: string, at: number) => (db: D1Database) =>
  db
    .prepare(
      `UPDATE sessions SET end_reason = CASE end_reason WHEN 'agent_close' THEN 'admin' ELSE 'agent_close' END,
         ended_at = COALESCE(ended_at, ?) WHERE id = ?`,
    )
    .bind(at, sessionId)
    .run();
