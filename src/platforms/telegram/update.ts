/**
 * Telegram updates (Bot API, typed by `@grammyjs/types`): which ones become inbound
 * messages, and how a message maps to the common shape. zod checks the fields read
 * here and lets every other field through; the checked value is then the Bot API's
 * `Update` as `@grammyjs/types` describes it.
 */
import type { Chat, Message, Update } from "@grammyjs/types";
import * as z from "zod";
import type { InboundMessage } from "../../domain/inbound";
import type { ChatType } from "../../domain/session-key";
import { validationError } from "../parse";

const int = z.number().int();

const CHAT_TYPES = ["private", "group", "supergroup", "channel"] as const satisfies readonly Chat["type"][];

const messageSchema = z.looseObject({
  message_id: int,
  date: int,
  chat: z.looseObject({ id: int, type: z.enum(CHAT_TYPES) }),
  from: z.looseObject({ id: int }).optional(),
  sender_chat: z.looseObject({ id: int }).optional(),
  text: z.string().optional(),
  message_thread_id: int.optional(),
  is_topic_message: z.boolean().optional(),
});

// Only the kinds routed are checked; edits and every other kind pass unread (see `inboundOf`).
export const updateSchema = z.looseObject({
  update_id: int.nonnegative(),
  message: messageSchema.optional(),
  channel_post: messageSchema.optional(),
});

/** Validates a parsed webhook body as an update (400 naming the field otherwise). */
export function checkUpdate(body: unknown): Update {
  const parsed = updateSchema.safeParse(body);
  if (!parsed.success) throw validationError(parsed.error);
  return parsed.data as unknown as Update;
}

const CHAT_TYPE: Record<Chat["type"], ChatType> = {
  private: "dm",
  group: "group",
  supergroup: "group",
  channel: "channel",
};

/** Where a reply to a Telegram message goes: its chat, and its forum topic if it was in one. */
export interface TelegramTarget {
  platform: "telegram";
  chat_id: number;
  message_thread_id: number | null;
  [field: string]: unknown;
}

/**
 * The inbound message an update carries, or null when it carries none the gateway
 * handles. Routed: `message` and `channel_post` with text. Ignored: edits
 * (`edited_message`, `edited_channel_post`: an edit is not a new turn, and
 * answering it would answer the same message twice), messages without text
 * (stickers, media, captions, joins and other service messages), and every other
 * update kind (callbacks, reactions, business and guest messages, member changes).
 */
export function inboundOf(update: Update): InboundMessage | null {
  const message: Message | undefined = update.message ?? update.channel_post;
  if (!message || typeof message.text !== "string" || message.text === "") return null;
  const chat = message.chat;
  // A message sent on behalf of a chat (a channel post, an anonymous admin, a channel
  // writing in a group) carries that chat in `sender_chat` and, in groups, a
  // placeholder user in `from` shared by every such sender; the chat is the sender.
  const sender = message.sender_chat?.id ?? message.from?.id ?? chat.id;
  // `message_thread_id` also marks replies outside forums; only a topic message is in a thread.
  const thread = message.is_topic_message && message.message_thread_id !== undefined ? message.message_thread_id : null;
  const target: TelegramTarget = { platform: "telegram", chat_id: chat.id, message_thread_id: thread };
  return {
    platform: "telegram",
    eventId: String(update.update_id),
    chatId: String(chat.id),
    chatType: CHAT_TYPE[chat.type],
    userId: String(sender),
    threadId: thread === null ? null : String(thread),
    text: message.text,
    sentAt: message.date * 1000,
    replyTo: target,
  };
}
