/** An external agent and a chat client on fake URLs, for the agent tests. */
import { exports } from "cloudflare:workers";
import { afterEach, beforeEach, vi } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import {
  BASE,
  T0,
  captureFetch,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  setNow,
  useConfig,
  type Captured,
} from "../helpers";

export const AGENT_URL = "https://agent.test/runs";
export const AGENT_TOKEN = "agent-secret-token";
export const REPLY_URL = "https://client.test/replies";

/**
 * OVERLAP concurrent: every message its own run at once. For tests about something
 * else (ownership, crash windows, leases) that send a message while a run is unfinished.
 */
export const CONCURRENT = { OVERLAP: JSON.stringify({ mode: "concurrent" }) };

export const agentConfig = (extra: Record<string, string> = {}) => ({
  AGENT_URL,
  AGENT_TOKEN,
  GENERIC_REPLY_URL: REPLY_URL,
  SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }),
  ...extra,
});

/** The agent config without AGENT_URL and AGENT_TOKEN: the built-in echo agent answers. */
export function echoConfig(extra: Record<string, string> = {}): Record<string, string> {
  const { AGENT_URL: _url, AGENT_TOKEN: _token, ...echo } = agentConfig(extra);
  return echo;
}

/**
 * Captures outbound calls: the agent answers with `agent(request)`, the reply URL
 * with `chat(request)` (200 unless told). Anything else fails the test.
 */
export function fakeServices(
  agent: (request: Captured) => Response | Promise<Response>,
  chat: (request: Captured) => Response = () => new Response("ok"),
) {
  const captured = captureFetch((request) => {
    if (request.url === AGENT_URL) return agent(request);
    if (request.url === REPLY_URL) return chat(request);
    throw new Error(`unexpected outbound request to ${request.url}`);
  });
  return {
    ...captured,
    agentCalls: () => captured.calls.filter((c) => c.url === AGENT_URL),
    replies: () => captured.calls.filter((c) => c.url === REPLY_URL).map((c) => c.json),
  };
}

export type FakeServices = ReturnType<typeof fakeServices>;

/**
 * The hooks of a test file that drives the gateway with a fake agent: before each
 * test the clock at T0, the agent configured (no hooks) and every outbound call
 * answered by `agent`; after each, no D1 fault left armed, spies and the fake
 * services restored, the clock and the configuration reset. `services` is the
 * current test's fake agent and chat; `answerWith` replaces it for the rest of it.
 */
export function agentTestHooks(agent: (request: Captured) => Response | Promise<Response> = () => accepted()) {
  let current: FakeServices | null = null;
  beforeEach(() => {
    setNow(T0);
    useConfig(agentConfig({ HOOK_URLS: "" }));
    current = fakeServices(agent);
  });
  afterEach(() => {
    injectD1Fault(null);
    vi.restoreAllMocks();
    current?.restore();
    current = null;
    restoreClock();
    useConfig(null);
  });
  return {
    get services(): FakeServices {
      if (!current) throw new Error("agentTestHooks: services are set up only inside a test");
      return current;
    },
    answerWith(
      next: (request: Captured) => Response | Promise<Response>,
      chat?: (request: Captured) => Response,
    ): FakeServices {
      current?.restore();
      current = fakeServices(next, chat);
      return current;
    },
  };
}

export const replyWith = (reply: string | null, status = 200) => new Response(JSON.stringify({ reply }), { status });
export const accepted = () => new Response(null, { status: 202 });

/** Calls the agent API with a bearer token. */
export async function agentApi(
  path: string,
  token: string | null,
  body?: unknown,
): Promise<{ status: number; body: any }> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const response = await exports.default.fetch(
    new Request(`${BASE}${path}`, {
      method: "POST",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    }),
  );
  return { status: response.status, body: await response.json() };
}

/** Sends a message and hands it to the agent `services` fakes; returns the run the agent got. */
export async function dispatchedThrough(services: ReturnType<typeof fakeServices>, chat: string, text = "hello") {
  const sent = await send({ chat_id: chat, text });
  await runAlarm(genericKey(chat));
  const call = services.agentCalls().at(-1)!.json;
  return { sessionId: sent.body.session_id as string, runId: call.run_id as string, token: call.run_token as string };
}
