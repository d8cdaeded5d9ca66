/**
 * Telegram updates (Bot API, typed by `@grammyjs/types`): which ones become inbound
 * messages, and how a message maps to the common shape. zod checks the fields read
 * here and lets every other field through; the checked value is then the Bot API's
 * `Update` as `@grammyjs/types` describes it.
 */
import type { Chat, Message, Sticker, Update } from "@grammyjs/types";
import * as z from "zod";
import { sizeOf, type AttachmentKind, type InboundAttachment } from "../../domain/attachments";
import type { InboundMessage } from "../../domain/inbound";
import type { ChatType } from "../../domain/session-key";
import { validationError } from "../parse";

const int = z.number().int();

const CHAT_TYPES = ["private", "group", "supergroup", "channel"] as const satisfies readonly Chat["type"][];

/** The fields read of any file the Bot API describes (PhotoSize, Voice, Audio, Video, Document, Sticker…). */
const fileSchema = z.looseObject({
  file_id: z.string().min(1).max(1024),
  file_size: int.nonnegative().optional(),
  file_name: z.string().optional(),
  mime_type: z.string().optional(),
});

const messageSchema = z.looseObject({
  message_id: int,
  date: int,
  chat: z.looseObject({ id: int, type: z.enum(CHAT_TYPES) }),
  from: z.looseObject({ id: int }).optional(),
  sender_chat: z.looseObject({ id: int }).optional(),
  text: z.string().optional(),
  caption: z.string().optional(),
  message_thread_id: int.optional(),
  is_topic_message: z.boolean().optional(),
  photo: z.array(fileSchema.extend({ width: int, height: int })).optional(),
  voice: fileSchema.optional(),
  audio: fileSchema.optional(),
  video: fileSchema.optional(),
  video_note: fileSchema.optional(),
  document: fileSchema.optional(),
  animation: fileSchema.optional(),
  sticker: fileSchema.extend({ is_animated: z.boolean().optional(), is_video: z.boolean().optional() }).optional(),
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

type File = { file_id: string; file_size?: number; file_name?: string; mime_type?: string };

function attachment(kind: AttachmentKind, file: File, mimeType = file.mime_type ?? null): InboundAttachment {
  return {
    kind,
    mimeType,
    name: file.file_name ?? null,
    size: sizeOf(file.file_size),
    source: { platform: "telegram", ref: file.file_id },
  };
}

/** The sticker's file format, which the Bot API documents by its flags (TGS, WEBM, WEBP). */
function stickerMime(sticker: Sticker): string {
  if (sticker.is_animated) return "application/x-tgsticker";
  if (sticker.is_video) return "video/webm";
  return "image/webp";
}

/**
 * The media of a message: the largest size of a `photo`, then `voice`, `audio`,
 * `video`, `video_note`, `document`, `animation` and `sticker`. An animation also
 * fills `document` with the same file (for old clients), so that one is skipped.
 */
export function attachmentsOf(message: Message): InboundAttachment[] {
  const found: InboundAttachment[] = [];
  if (message.photo && message.photo.length > 0) {
    const largest = message.photo.reduce((a, b) => (b.width * b.height > a.width * a.height ? b : a));
    found.push(attachment("image", largest, null));
  }
  if (message.voice) found.push(attachment("voice", message.voice));
  if (message.audio) found.push(attachment("audio", message.audio));
  if (message.video) found.push(attachment("video", message.video));
  if (message.video_note) found.push(attachment("video", message.video_note, null));
  if (message.document && !message.animation) found.push(attachment("file", message.document));
  if (message.animation) found.push(attachment("video", message.animation));
  if (message.sticker) found.push(attachment("sticker", message.sticker, stickerMime(message.sticker)));
  return found;
}

/**
 * The inbound message an update carries, or null when it carries none the gateway
 * handles. Routed: `message` and `channel_post` with text, a caption or media
 * (media alone is routed with text ""). Ignored: edits (`edited_message`,
 * `edited_channel_post`: an edit is not a new turn, and answering it would answer
 * the same message twice), messages with neither text nor media (joins and other
 * service messages, locations, polls, contacts, dice), and every other update kind
 * (callbacks, reactions, business and guest messages, member changes).
 */
export function inboundOf(update: Update): InboundMessage | null {
  const message: Message | undefined = update.message ?? update.channel_post;
  if (!message) return null;
  const text = message.text ?? message.caption ?? "";
  const attachments = attachmentsOf(message);
  if (text === "" && attachments.length === 0) return null;
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
    text,
    attachments,
    sentAt: message.date * 1000,
    replyTo: target,
  };
}
