/** The agent hand-off (spec "Agent backend"): the body POSTed to AGENT_URL for each run. */
import type { HandoffAttachment } from "../domain/attachments";

/** One user message as the agent receives it (`message`, and each of `messages`). */
export interface HandoffMessage {
  event_id: string;
  platform: string;
  chat_id: string;
  chat_type: string;
  user_id: string;
  thread_id: string | null;
  text: string;
  /** Media the user sent, each with the gateway `path` that serves its bytes to this run's token. */
  attachments: HandoffAttachment[];
  received_at: number;
}

export interface AgentRunRequest {
  run_id: string;
  run_token: string;
  session: { id: string; key: string; is_new: boolean; parent_id: string | null };
  reset: null | { reason: string; had_activity: boolean; previous_session_id: string };
  message: HandoffMessage;
  /**
   * Every user message the run carries, oldest first, `message` being the last
   * (spec "Agent backend"). Optional until the routing object builds every
   * hand-off with `handoffRequest` (src/agent/handoff.ts).
   */
  messages?: HandoffMessage[];
}

export type AgentOutcome =
  /** 200: the reply (null when the agent chose not to answer). */
  | { kind: "reply"; text: string | null }
  /** 202: the agent replies later through the run API. */
  | { kind: "accepted" }
  /** Down, timed out, 5xx or 429: hand it over again later. */
  | { kind: "retry"; error: string; retryAfterMs: number | null }
  /** Refused for good (another 4xx, or a 200 that is not `{"reply"}`). */
  | { kind: "failed"; error: string };
