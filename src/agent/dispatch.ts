/**
 * Hands one run to the agent backend: `POST {AGENT_URL}` with the bearer AGENT_TOKEN.
 * Without AGENT_URL the routing object answers with the echo agent itself, in one batch.
 */
import type { Config } from "../config";
import { callJson } from "../http/outbound";
import type { AgentOutcome, AgentRunRequest } from "./types";

export async function handToAgent(config: Config, agentUrl: string, request: AgentRunRequest): Promise<AgentOutcome> {
  const outcome = await callJson(agentUrl, request, {
    headers: { authorization: `Bearer ${config.agentToken}` },
    timeoutMs: config.agentTimeoutMs,
  });
  if (outcome.status === 202) return { kind: "accepted" };
  if (outcome.ok) {
    const reply = (outcome.json as { reply?: unknown } | null)?.reply;
    if (reply === null || reply === undefined) return { kind: "reply", text: null };
    if (typeof reply !== "string")
      return { kind: "failed", error: `agent answered ${outcome.status} without a string "reply"` };
    return { kind: "reply", text: reply };
  }
  if (outcome.retryable)
    return { kind: "retry", error: outcome.error ?? "agent unavailable", retryAfterMs: outcome.retryAfterMs };
  return { kind: "failed", error: outcome.error ?? `agent answered ${outcome.status}` };
}
