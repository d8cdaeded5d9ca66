/**
 * WhatsApp Cloud API webhook payloads. No well-kept type package describes them, so
 * these zod schemas are the types: they cover the fields the gateway reads and let
 * every other field through.
 *
 * ```
 * {"object": "whatsapp_business_account", "entry": [{"id", "changes": [{"field": "messages",
 *   "value": {"messaging_product", "metadata": {"display_phone_number", "phone_number_id"},
 *             "contacts": [...], "messages": [{"from", "id", "timestamp", "type", "text": {"body"}}],
 *             "statuses": [...]}}]}]}
 * ```
 */
import * as z from "zod";
import { stringOrNull, type AttachmentKind, type InboundAttachment } from "../../domain/attachments";
import type { InboundMessage } from "../../domain/inbound";
import { validationError } from "../parse";

/** Enough of any message to tell whether the gateway routes it; every type has these. */
const messageHeadSchema = z.looseObject({ type: z.string() });

/** The message types that carry what a user wrote or sent: text, or media with an optional caption. */
export const ROUTED_TYPES = new Set(["text", "image", "audio", "video", "document", "sticker"]);
const MEDIA_TYPES = ["image", "audio", "video", "document", "sticker"] as const;
type MediaType = (typeof MEDIA_TYPES)[number];

const id = z.string().min(1).max(512);

const mediaSchema = z.looseObject({
  /** The media id, resolved to a short-lived URL by `GET {WHATSAPP_API_BASE}/{id}`. */
  id,
  mime_type: z.string().optional(),
  caption: z.string().optional(),
  filename: z.string().optional(),
  /** On `audio`: a voice note recorded in the app. */
  voice: z.boolean().optional(),
});

/** A message of a routed type: the fields the gateway reads. */
const messageSchema = z.looseObject({
  /** The sender's WhatsApp id (`wa_id`), a phone number without `+`; absent for a user known only by BSUID. */
  from: id.optional(),
  /** The sender's business-scoped user id (BSUID), e.g. `US.13491208655302741918`. */
  from_user_id: id.optional(),
  /** The message id (`wamid.…`), the same on Meta's retries of the delivery. */
  id,
  /** Unix seconds, as a string. */
  timestamp: z.string().regex(/^\d+$/).optional(),
  type: z.string(),
  text: z.looseObject({ body: z.string() }).optional(),
  image: mediaSchema.optional(),
  audio: mediaSchema.optional(),
  video: mediaSchema.optional(),
  document: mediaSchema.optional(),
  sticker: mediaSchema.optional(),
});

const valueSchema = z.looseObject({
  metadata: z.looseObject({ phone_number_id: z.string().min(1) }).optional(),
  contacts: z.array(z.looseObject({ wa_id: z.string().optional(), user_id: z.string().optional() })).optional(),
  // Checked one by one below: a message the gateway does not route (a system
  // message, a reaction) must never get the whole delivery refused.
  messages: z.array(z.unknown()).optional(),
});

export const payloadSchema = z.looseObject({
  object: z.string(),
  entry: z.array(
    z.looseObject({
      changes: z.array(z.looseObject({ field: z.string(), value: z.unknown() })),
    }),
  ),
});

export type WhatsAppMessage = z.infer<typeof messageSchema>;
export type WhatsAppValue = z.infer<typeof valueSchema>;

/** Where a reply to a WhatsApp message goes: the sender, from the number it wrote to. */
export interface WhatsAppTarget {
  platform: "whatsapp";
  /** The user's phone number (`from`); null for a user known only by BSUID. */
  to: string | null;
  /** The user's BSUID, when the message had no `from`: the reply goes to it as `recipient`. */
  recipient?: string;
  /** The delivery's `metadata.phone_number_id`; null falls back to `WHATSAPP_PHONE_NUMBER_ID`. */
  phone_number_id: string | null;
  [field: string]: unknown;
}

/**
 * The inbound messages of one webhook delivery, in order (400 naming the field when
 * a field the gateway reads has the wrong shape). Routed: messages of type `text`,
 * `image`, `audio`, `video`, `document` and `sticker` in `messages` changes, each as
 * a `dm` keyed by its sender (`from`, else its BSUID). Ignored: status callbacks
 * (sent, delivered, read, failed), every other message type (reactions, locations,
 * contacts, interactive replies, `system`, `unsupported`) and every other change field.
 */
export function inboundMessages(body: unknown): InboundMessage[] {
  const payload = payloadSchema.safeParse(body);
  if (!payload.success) throw validationError(payload.error);
  const messages: InboundMessage[] = [];
  for (const [e, entry] of payload.data.entry.entries()) {
    for (const [c, change] of entry.changes.entries()) {
      if (change.field !== "messages") continue;
      const value = valueSchema.safeParse(change.value);
      if (!value.success) throw validationError(prefixed(value.error, ["entry", e, "changes", c, "value"]));
      for (const [m, raw] of (value.data.messages ?? []).entries()) {
        const path = ["entry", e, "changes", c, "value", "messages", m];
        const head = messageHeadSchema.safeParse(raw);
        if (!head.success) throw validationError(prefixed(head.error, path));
        if (!ROUTED_TYPES.has(head.data.type)) continue;
        const message = messageSchema.safeParse(raw);
        if (!message.success) throw validationError(prefixed(message.error, path));
        const inbound = toInbound(message.data, value.data, path);
        if (inbound) messages.push(inbound);
      }
    }
  }
  return messages;
}

/**
 * The sender: the phone number (`from`) when there is one, so existing sessions keep
 * their keys; else the BSUID, from the message (`from_user_id`) or from the one
 * contact of the change.
 */
function senderOf(message: WhatsAppMessage, value: WhatsAppValue): { from: string | null; userId: string | null } {
  if (message.from) return { from: message.from, userId: null };
  const contacts = value.contacts ?? [];
  const bsuid = message.from_user_id ?? (contacts.length === 1 ? contacts[0]!.user_id : undefined);
  return { from: null, userId: bsuid ?? null };
}

const KIND: Record<MediaType, AttachmentKind> = {
  image: "image",
  audio: "audio",
  video: "video",
  document: "file",
  sticker: "sticker",
};

/** The media of a message of a media type, with its caption (images, videos and documents have one). */
function mediaOf(message: WhatsAppMessage): { attachment: InboundAttachment; caption: string } | null {
  const type = MEDIA_TYPES.find((t) => t === message.type);
  const media = type ? message[type] : undefined;
  if (!type || !media) return null;
  const kind = type === "audio" && media.voice ? "voice" : KIND[type];
  return {
    attachment: {
      kind,
      mimeType: stringOrNull(media.mime_type),
      name: stringOrNull(media.filename),
      size: null,
      source: { platform: "whatsapp", ref: media.id },
    },
    caption: media.caption ?? "",
  };
}

function toInbound(message: WhatsAppMessage, value: WhatsAppValue, path: (string | number)[]): InboundMessage | null {
  const media = mediaOf(message);
  const text = message.type === "text" ? (message.text?.body ?? "") : (media?.caption ?? "");
  if (text === "" && !media) return null;
  const sender = senderOf(message, value);
  const key = sender.from ?? sender.userId;
  if (key === null) {
    throw validationError(
      new z.ZodError([{ code: "custom", path: [...path, "from"], message: "a message needs from or from_user_id" }]),
    );
  }
  const target: WhatsAppTarget = {
    platform: "whatsapp",
    to: sender.from,
    phone_number_id: value.metadata?.phone_number_id ?? null,
  };
  if (sender.from === null) target.recipient = key;
  return {
    platform: "whatsapp",
    eventId: message.id,
    chatId: key,
    chatType: "dm",
    userId: key,
    threadId: null,
    text,
    attachments: media ? [media.attachment] : [],
    sentAt: message.timestamp === undefined ? null : Number(message.timestamp) * 1000,
    replyTo: target,
  };
}

function prefixed(error: z.ZodError, path: (string | number)[]): z.ZodError {
  return new z.ZodError(error.issues.map((issue) => ({ ...issue, path: [...path, ...issue.path] })));
}
