/**
 * The platform adapter interface. Adapters verify and parse inbound webhooks into
 * `InboundMessage`s and send outbound messages; they know nothing of sessions.
 */
import type { Config } from "../config";
import type { ReplyTarget } from "../domain/inbound";

/** One outbound chat message: an agent reply, a progress notice, or a command's answer. */
export interface OutboundMessage {
  kind: "reply" | "progress" | "command";
  text: string;
  /** The reset notice reason this reply carries (spec invariant 10), if any. */
  notice: string | null;
  sessionKey: string;
  sessionId: string;
  /** The inbound event this answers. */
  eventId: string | null;
  target: ReplyTarget;
}

export interface SendOutcome {
  ok: boolean;
  /** Another attempt may succeed (5xx, 429, network). */
  retryable: boolean;
  retryAfterMs: number | null;
  status: number | null;
  error: string | null;
}

export interface PlatformSender {
  /** Whether a reply to `target` has anywhere to go with this configuration. */
  canDeliver(target: ReplyTarget, config: Config, env: Record<string, unknown>): boolean;
  send(message: OutboundMessage, config: Config, env: Record<string, unknown>): Promise<SendOutcome>;
}

/** The human text of a reset notice, for platforms that show it as the reply's first line. */
export const NOTICE_TEXT: Record<string, string> = {
  idle: "(Your previous conversation ended after a period of inactivity; this is a new one.)",
  daily: "(Your previous conversation ended at the daily reset; this is a new one.)",
  suspended: "(Your previous conversation was stopped; this is a new one.)",
};
