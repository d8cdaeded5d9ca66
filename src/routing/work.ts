/**
 * The outbox's work items and the small conversions between rows and the shapes
 * sent out, kept apart from the routing object's logic.
 */
import { handoffRequest } from "../agent/handoff";
import type { AgentRunRequest, HandoffMessage } from "../agent/types";
import { sha256Hex } from "../crypto";
import type { NewRun } from "../db/runs";
import type { DeliveryRow } from "../db/schema";
import type { UserMessage } from "../db/sessions";
import type { RoutedMessage } from "../domain/inbound";
import type { Entry } from "./entry";

/** The agent hand-off of one stored message, from the moment it is staged until the reply is recorded. */
export interface RunWork {
  stage: "dispatch" | "record";
  runId: string;
  /** Handed to the agent with every attempt; D1 only ever sees its hash. */
  token: string;
  sessionId: string;
  isNew: boolean;
  parentId: string | null;
  reset: Entry["reset"];
  /** The newest message the run answers (the last of `messages`). */
  message: RoutedMessage;
  /**
   * Every message a run dispatched from the waiting list carries, oldest first (their
   * `run_id` is set when it is dispatched); absent for a run staged with its one
   * message, whose `run_id` was written with the message.
   */
  messages?: RoutedMessage[];
  reply?: string | null;
  /** Sessions a rotation moved this hand-off on from (its message is stored in the first). */
  movedFrom?: string[];
}

/** One outbound platform call, mirrored by its `deliveries` row. */
export interface DeliveryWork {
  deliveryId: string;
  sessionId: string;
  sessionKey: string;
  platform: string;
  kind: "reply" | "progress" | "command";
  text: string;
  notice: string | null;
  eventId: string | null;
  target: RoutedMessage["replyTo"];
  /**
   * Staged before the D1 batch that writes its row (a run API reply): sent only
   * once D1 shows the row pending, and then as D1 holds it (its notice).
   */
  beforeBatch?: true;
}

/** Lifecycle events of one session still to deliver. */
/** A session of this key to look at again by its policy (a replaced recoverable row). */
export interface CheckWork {
  sessionId: string;
}

export interface EventsWork {
  sessionId: string;
}

/** How recording a run's reply turned out. */
export interface RecordedReply {
  finished: boolean;
  added: boolean;
  delivery: DeliveryWork | null;
}

export function toUserMessage(message: RoutedMessage, runId: string | null): UserMessage {
  return {
    platform: message.platform,
    sessionKey: message.sessionKey,
    eventId: message.eventId,
    runId,
    text: message.text,
    receivedAt: message.receivedAt,
    attachments: message.attachments,
  };
}

/** The hand-off body: `messages` oldest first, `message` the newest. */
export function agentRequest(work: RunWork): AgentRunRequest & { messages: HandoffMessage[] } {
  return handoffRequest({
    runId: work.runId,
    token: work.token,
    sessionId: work.sessionId,
    sessionKey: work.message.sessionKey,
    isNew: work.isNew,
    parentId: work.parentId,
    reset: work.reset,
    messages: carriedBy(work),
  });
}

/** The messages a run carries, oldest first. */
export const carriedBy = (work: RunWork): RoutedMessage[] => work.messages ?? [work.message];

export function deliveryWork(row: DeliveryRow, sessionKey: string): DeliveryWork {
  return {
    deliveryId: row.id,
    sessionId: row.sessionId,
    sessionKey,
    platform: row.platform,
    kind: row.kind,
    text: row.text,
    notice: row.notice,
    eventId: row.eventId,
    target: JSON.parse(row.target) as RoutedMessage["replyTo"],
  };
}

/** The `runs` row of a staged run; the token is stored only as its SHA-256. */
export async function newRunOf(work: RunWork): Promise<NewRun> {
  return {
    id: work.runId,
    sessionId: work.sessionId,
    sessionKey: work.message.sessionKey,
    eventId: work.message.eventId,
    tokenHash: await sha256Hex(work.token),
    replyTo: JSON.stringify(work.message.replyTo),
    createdAt: work.message.receivedAt,
    message: JSON.stringify(work.message),
    isNew: work.isNew,
  };
}
