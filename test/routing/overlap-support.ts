/**
 * Set-up shared by the overlap tests (`overlap-*.test.ts`): the clock and the agent
 * config around each test, the fake agent and reply URL it talks to, and what the
 * tests read back (which messages each hand-off carried, each user message's run or
 * reason for not being dispatched).
 */
import { env } from "cloudflare:test";
import { afterEach, beforeEach, expect, vi } from "vitest";
import { T0, adminFetch, genericKey, restoreClock, runAlarm, send, setNow, useConfig } from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { agentConfig, fakeServices } from "../agent/support";

export type FakeServices = ReturnType<typeof fakeServices>;

/**
 * Registers the hooks of an overlap test file: before each test the clock at T0 and,
 * when `overrides` is given, the agent config with them (no hooks); after it the fake
 * services restored, the clock and config reset. Returns `fake`, which makes a test's
 * fake agent (and reply URL) and remembers it for that reset.
 */
export function overlapHooks(
  overrides?: Record<string, string>,
): (agent: Parameters<typeof fakeServices>[0]) => FakeServices {
  let current: FakeServices | undefined;
  beforeEach(() => {
    setNow(T0);
    if (overrides) useConfig(overlapConfig(overrides));
  });
  afterEach(() => {
    vi.restoreAllMocks();
    injectD1Fault(null);
    current?.restore();
    current = undefined;
    restoreClock();
    useConfig(null);
  });
  return (agent) => (current = fakeServices(agent));
}

/** The agent config of the overlap tests: no hooks, and `overrides` (an `OVERLAP`, mostly). */
export const overlapConfig = (overrides: Record<string, string> = {}) => agentConfig({ HOOK_URLS: "", ...overrides });

/** The texts of the messages each hand-off to the agent carried, in order. */
export const carriedBy = (services: FakeServices): string[][] =>
  services.agentCalls().map((c) => (c.json.messages as { text: string }[]).map((m) => m.text));

export type UserMessage = { text: string; run_id: string | null; not_dispatched: string | null };

/** A session's user messages as D1 holds them, oldest first. */
export async function userMessages(sessionId: string): Promise<UserMessage[]> {
  const { results } = await env.DB.prepare(
    `SELECT text, run_id, not_dispatched FROM messages WHERE session_id = ? AND role = 'user' ORDER BY seq`,
  )
    .bind(sessionId)
    .all<UserMessage>();
  return results;
}

/** The session answer of `GET /admin/sessions/{id}`: its messages and runs. */
export async function sessionAnswer(sessionId: string): Promise<{ messages: any[]; runs: any[] }> {
  return (await (await adminFetch(`/admin/sessions/${sessionId}`)).json()) as any;
}

/** A session's user messages as the session answer shows them, oldest first. */
export async function answeredUserMessages(sessionId: string): Promise<UserMessage[]> {
  const { messages } = await sessionAnswer(sessionId);
  return messages
    .filter((m) => m.role === "user")
    .map((m) => ({ text: m.text, run_id: m.run_id, not_dispatched: m.not_dispatched }));
}

/**
 * "one" sent on `chat` and handed to the agent by the alarm (the test's fake agent
 * decides the answer, 202 mostly): its key, session and the hand-off the agent got.
 */
export async function firstHandedOver(services: FakeServices, chat: string) {
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  await runAlarm(key);
  return { key, sessionId: one.body.session_id as string, run: services.agentCalls().at(-1)!.json };
}

/** What `GET /admin/routes/{key}/explain` answers an operator (its `waiting` count, mostly). */
export async function explained(key: string): Promise<any> {
  return (await adminFetch(`/admin/routes/${encodeURIComponent(key)}/explain`)).json();
}

/** An operator's tool ends a row by SQL (recoverable by default): the routing object is not told. */
export async function endBySql(sessionId: string, at: number, reason = "agent_close"): Promise<void> {
  await env.DB.prepare(`UPDATE sessions SET end_reason = ?, ended_at = ? WHERE id = ?`)
    .bind(reason, at, sessionId)
    .run();
}

/** The operator forgets the key's routing entry (`DELETE /admin/routes/{key}`); D1 keeps its sessions. */
export async function forget(key: string): Promise<void> {
  const answer = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
  expect(answer.status).toBe(200);
}
