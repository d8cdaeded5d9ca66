/**
 * The real system the model runs against: the worker's own fetch (signed generic
 * webhook, agent API, operator API), the routing objects' alarms, D1 read as it
 * stands, and a fake agent, chat client and hook receiver behind one fetch spy.
 */
import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { vi } from "vitest";
import { ADMIN_TOKEN, BASE, router, signedRequest } from "../helpers";
import type { AgentMode } from "./model";

export const AGENT_URL = "https://agent.model.test/runs";
export const AGENT_TOKEN = "model-agent-token";
export const REPLY_URL = "https://client.model.test/replies";
export const HOOK_URL = "https://hooks.model.test/events";

export interface AgentCall {
  runId: string;
  token: string;
  sessionId: string;
  isNew: boolean;
  reset: unknown;
  eventId: string;
  /** The event ids of the messages the run carries (`messages`), oldest first. */
  carried: string[];
  mode: AgentMode;
}

/** The fake agent answers each run as `mode` says; replies and hook events are recorded. */
export class FakeServices {
  mode: AgentMode = "reply";
  agentCalls: AgentCall[] = [];
  replies: Record<string, any>[] = [];
  hooks: Record<string, any>[] = [];
  unexpected: string[] = [];

  reset(): void {
    this.mode = "reply";
    this.agentCalls = [];
    this.replies = [];
    this.hooks = [];
    this.unexpected = [];
  }

  install(): () => void {
    const spy = vi.spyOn(globalThis, "fetch").mockImplementation(async (input, init) => {
      const request = new Request(input as RequestInfo, init as RequestInit);
      const body = await request.text();
      const json = body ? JSON.parse(body) : null;
      if (request.url === AGENT_URL) return this.answerRun(json);
      if (request.url === REPLY_URL) {
        this.replies.push(json);
        return new Response("ok");
      }
      if (request.url === HOOK_URL) {
        this.hooks.push(json);
        return new Response("ok");
      }
      this.unexpected.push(request.url);
      throw new Error(`unexpected outbound request to ${request.url}`);
    });
    return () => spy.mockRestore();
  }

  private answerRun(json: any): Response {
    const mode = this.mode;
    this.agentCalls.push({
      runId: json.run_id,
      token: json.run_token,
      sessionId: json.session.id,
      isNew: json.session.is_new,
      reset: json.reset,
      eventId: json.message.event_id,
      carried: (json.messages ?? [json.message]).map((message: { event_id: string }) => message.event_id),
      mode,
    });
    if (mode === "reply") return Response.json({ reply: `re:${json.message.event_id}` });
    if (mode === "null") return Response.json({ reply: null });
    if (mode === "accept") return new Response(null, { status: 202 });
    if (mode === "refuse") return new Response("no", { status: 400 });
    return new Response("down", { status: 503 });
  }
}

export interface Answer {
  status: number;
  body: any;
}

async function answer(response: Response): Promise<Answer> {
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

export async function postWebhook(body: Record<string, unknown>): Promise<Answer> {
  return answer(await exports.default.fetch(await signedRequest(JSON.stringify(body))));
}

export async function admin(path: string, init: RequestInit = {}): Promise<Answer> {
  return answer(
    await exports.default.fetch(
      new Request(`${BASE}${path}`, {
        ...init,
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
      }),
    ),
  );
}

export async function agentApi(path: string, token: string, body: unknown): Promise<Answer> {
  return answer(
    await exports.default.fetch(
      new Request(`${BASE}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    ),
  );
}

/** Runs the key's alarm now, as the runtime would when it fires; false when none is set. */
export async function fireAlarm(key: string): Promise<boolean> {
  const fired = runDurableObjectAlarm(router(key));
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stuck = new Promise<"stuck">((resolve) => (timer = setTimeout(() => resolve("stuck"), 20_000)));
  const outcome = await Promise.race([fired, stuck]);
  if (timer !== undefined) clearTimeout(timer);
  if (outcome === "stuck") {
    const outbox = await router(key).outbox();
    throw new Error(`the alarm of ${key} did not return within 20 s; outbox: ${JSON.stringify(outbox)}`);
  }
  return outcome;
}

export async function alarmOf(key: string): Promise<number | null> {
  return (await runInDurableObject(router(key), (_instance, state) => state.storage.getAlarm())) ?? null;
}

export interface D1Session {
  id: string;
  session_key: string;
  started_at: number;
  last_active_at: number;
  ended_at: number | null;
  end_reason: string | null;
  parent_session_id: string | null;
}
export interface D1Message {
  session_id: string;
  seq: number;
  role: string;
  text: string;
  created_at: number;
  event_id: string | null;
  run_id: string | null;
  not_dispatched: string | null;
}
export interface D1Run {
  id: string;
  session_id: string;
  event_id: string;
  created_at: number;
  dispatched_at: number | null;
  last_heartbeat_at: number | null;
  accepted_at: number | null;
  finished_at: number | null;
  failed_at: number | null;
  revoked_reason: string | null;
  /** JSON list of the routed messages it carries; null when only `event_id`. */
  messages: string | null;
}
export interface D1Event {
  id: string;
  type: string;
  session_id: string;
  reason: string | null;
  status: string;
  payload: string;
}

export interface Snapshot {
  sessions: D1Session[];
  messages: D1Message[];
  events: D1Event[];
  runs: D1Run[];
}

/** D1 as it stands for these keys: sessions, their messages and their lifecycle events. */
export async function snapshot(keys: string[]): Promise<Snapshot> {
  const marks = keys.map(() => "?").join(", ");
  const ofKeys = `SELECT id FROM sessions WHERE session_key IN (${marks})`;
  const [sessions, messages, events, runs] = await env.DB.batch([
    env.DB.prepare(`SELECT * FROM sessions WHERE session_key IN (${marks}) ORDER BY started_at`).bind(...keys),
    env.DB.prepare(`SELECT * FROM messages WHERE session_id IN (${ofKeys}) ORDER BY session_id, seq`).bind(...keys),
    env.DB.prepare(
      `SELECT id, type, session_id, reason, status, payload FROM events WHERE session_id IN (${ofKeys})`,
    ).bind(...keys),
    env.DB.prepare(
      `SELECT id, session_id, event_id, created_at, dispatched_at, last_heartbeat_at, accepted_at, finished_at,
        failed_at, revoked_reason, messages FROM runs WHERE session_id IN (${ofKeys})`,
    ).bind(...keys),
  ]);
  return {
    sessions: sessions!.results as unknown as D1Session[],
    messages: messages!.results as unknown as D1Message[],
    events: events!.results as unknown as D1Event[],
    runs: runs!.results as unknown as D1Run[],
  };
}

export async function sqlEnd(sessionId: string, reason: string, endedAt: number | null): Promise<number> {
  const result = await env.DB.prepare(
    `UPDATE sessions SET end_reason = ?, ended_at = ? WHERE id = ? AND end_reason IS NULL`,
  )
    .bind(reason, endedAt, sessionId)
    .run();
  return result.meta.changes;
}

export async function sessionRow(id: string): Promise<D1Session | null> {
  return env.DB.prepare(`SELECT * FROM sessions WHERE id = ?`).bind(id).first<D1Session>();
}

/** The user messages D1 stored for these events, by event id. */
export async function storedMessages(eventIds: string[]): Promise<Map<string, D1Message>> {
  const marks = eventIds.map(() => "?").join(", ");
  const { results } = await env.DB.prepare(`SELECT * FROM messages WHERE role = 'user' AND event_id IN (${marks})`)
    .bind(...eventIds)
    .all<D1Message>();
  return new Map(results.map((row) => [row.event_id!, row]));
}
