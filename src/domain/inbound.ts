/**
 * The common shape of a verified inbound message, whatever platform it came
 * from. Adapters produce it; nothing below the adapters knows a platform's wire
 * format.
 */
import type { InboundAttachment, StoredAttachment } from "./attachments";
import type { ChatType } from "./session-key";

export interface InboundMessage {
  platform: string;
  /** The platform's id for this event; retries carry the same one (spec invariant 9). */
  eventId: string;
  chatId: string;
  chatType: ChatType;
  userId: string;
  threadId: string | null;
  /** What the user wrote: the message text, or the caption of its media; "" for media alone. */
  text: string;
  /** Media sent with it (none when absent). */
  attachments?: InboundAttachment[];
  /** When the platform says the user sent it, if it says. */
  sentAt: number | null;
  /** What the platform adapter needs to answer in this chat (opaque to routing). */
  replyTo: ReplyTarget;
}

/** Platform-specific reply coordinates, stored with the run and handed back to the adapter. */
export type ReplyTarget = {
  platform: string;
  /** The webhook's own HTTP response answers commands (Slack slash commands, Discord). */
  answersCommandsInline?: boolean;
} & Record<string, unknown>;

/** An inbound message after routing has given it its key and received time. */
export interface RoutedMessage extends InboundMessage {
  /** With the gateway's own ids, given by ingress. */
  attachments?: StoredAttachment[];
  sessionKey: string;
  receivedAt: number;
}
