/**
 * The agent hand-off body of a run that carries one or more stored user messages
 * (spec "Agent backend"): `messages` is every message the run carries, oldest
 * first, and `message` the newest of them, each in the same shape. Ids and paths
 * only for attachments: a platform reference never leaves the gateway.
 */
import { handoffAttachment } from "../domain/attachments";
import type { RoutedMessage } from "../domain/inbound";
import type { AgentRunRequest, HandoffMessage } from "./types";

/** What a run's hand-off is built from (the routing object's staged run). */
export interface HandoffInput {
  runId: string;
  /** Handed to the agent with every attempt; D1 only ever sees its hash. */
  token: string;
  sessionId: string;
  sessionKey: string;
  isNew: boolean;
  parentId: string | null;
  reset: AgentRunRequest["reset"];
  /** The messages the run carries, in any order: the body lists them oldest first. */
  messages: readonly RoutedMessage[];
}

/** One stored user message as the agent receives it. */
export function handoffMessage(m: RoutedMessage): HandoffMessage {
  return {
    event_id: m.eventId,
    platform: m.platform,
    chat_id: m.chatId,
    chat_type: m.chatType,
    user_id: m.userId,
    thread_id: m.threadId,
    text: m.text,
    attachments: (m.attachments ?? []).map(handoffAttachment),
    received_at: m.receivedAt,
  };
}

/**
 * The body POSTed to AGENT_URL. Oldest first by received time; messages received
 * at the same instant keep the order given (the order they were stored in).
 */
export function handoffRequest(input: HandoffInput): AgentRunRequest & { messages: HandoffMessage[] } {
  if (input.messages.length === 0) throw new Error("a run carries at least one message");
  const ordered = [...input.messages].sort((a, b) => a.receivedAt - b.receivedAt).map(handoffMessage);
  return {
    run_id: input.runId,
    run_token: input.token,
    session: { id: input.sessionId, key: input.sessionKey, is_new: input.isNew, parent_id: input.parentId },
    reset: input.reset,
    message: ordered[ordered.length - 1]!,
    messages: ordered,
  };
}
