/**
 * The platform adapter interface. An adapter verifies a webhook over the raw bytes
 * received, parses it into `InboundMessage`s (or answers it itself: challenges,
 * pings, updates with no text), shapes the webhook's answer once the messages are
 * routed, and sends outbound messages. Adapters know nothing of sessions.
 */
import type { Config } from "../config";
import type { InboundMessage, ReplyTarget } from "../domain/inbound";

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
  /** The delivery's own id, the same on every attempt (Standard Webhooks `webhook-id` of generic replies). */
  deliveryId?: string;
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

/** The environment as adapters read it (their own secrets and API base URLs). */
export type PlatformEnv = object;

/** The chat's "working…" indicator (spec "Typing"), for platforms that have one. */
export interface TypingSender {
  /** How often the routing object sends it (src/domain/typing.ts). */
  readonly cadence: "repeat" | "once";
  /** Shows it in the chat of `target`; `eventId` is the newest message the run answers. */
  send(target: ReplyTarget, eventId: string, config: Config, env: PlatformEnv): Promise<SendOutcome>;
}

export interface PlatformSender {
  /** Whether a message to `target` has anywhere to go with this configuration. */
  canDeliver(target: ReplyTarget, config: Config, env: PlatformEnv): boolean;
  send(message: OutboundMessage, config: Config, env: PlatformEnv): Promise<SendOutcome>;
  /** Absent for platforms with no typing call (Discord's deferred answer shows it already; Slack; generic). */
  typing?: TypingSender;
}

/** What a webhook request looks like to an adapter. */
export interface WebhookInput {
  method: string;
  url: URL;
  headers: Headers;
  /** The raw bytes received; signatures are checked over these, never a re-serialisation. */
  rawBody: ArrayBuffer;
  config: Config;
}

/** A webhook answer: JSON, or plain text (WhatsApp's challenge). */
export interface WebhookAnswer {
  status: number;
  body: unknown;
  text?: boolean;
}

/** How the routing of one message turned out, as the adapter needs it to answer. */
export interface RoutedOutcome {
  message: InboundMessage;
  sessionId: string | null;
  duplicate: boolean;
  /** Set for a command: what the gateway says in reply. */
  commandReply: string | null;
}

export type WebhookVerdict =
  /** Answer now and route nothing (a challenge, a ping, an update without text). */
  | { kind: "answer"; answer: WebhookAnswer }
  /** Route these messages in order, then answer with `answer(outcomes)`. */
  | { kind: "route"; messages: InboundMessage[]; answer: (outcomes: RoutedOutcome[]) => WebhookAnswer };

export interface PlatformAdapter<S = unknown> {
  /** The platform name: the first part of its session keys, and its webhook path. */
  readonly name: string;
  /** HTTP methods its webhook accepts. */
  readonly methods: readonly ("GET" | "POST")[];
  /**
   * Its settings from the environment: null when none of its secrets is set (the
   * platform is off: 404); a ConfigError naming the missing key when only some are.
   */
  settings(env: PlatformEnv, config: Config): S | null;
  /** Verifies (401 on failure) and parses (400 on failure) one webhook request. */
  handle(input: WebhookInput, settings: S): Promise<WebhookVerdict>;
  readonly sender: PlatformSender;
}

/** The human text of a reset notice, for platforms that show it as the reply's first line. */
export const NOTICE_TEXT: Record<string, string> = {
  idle: "(Your previous conversation ended after a period of inactivity; this is a new one.)",
  daily: "(Your previous conversation ended at the daily reset; this is a new one.)",
  suspended: "(Your previous conversation was stopped; this is a new one.)",
};

/** A reply's text as a chat platform shows it: the reset notice, if any, on the first line. */
export function withNotice(message: Pick<OutboundMessage, "text" | "notice">): string {
  const notice = message.notice ? NOTICE_TEXT[message.notice] : undefined;
  return notice ? `${notice}\n${message.text}` : message.text;
}
