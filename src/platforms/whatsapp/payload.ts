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
import type { InboundMessage } from "../../domain/inbound";
import { validationError } from "../parse";

const messageSchema = z.looseObject({
  /** The sender's WhatsApp id (`wa_id`), a phone number without `+`. */
  from: z.string().min(1).max(512),
  /** The message id (`wamid.…`), the same on Meta's retries of the delivery. */
  id: z.string().min(1).max(512),
  /** Unix seconds, as a string. */
  timestamp: z.string().regex(/^\d+$/).optional(),
  type: z.string(),
  text: z.looseObject({ body: z.string() }).optional(),
});

const valueSchema = z.looseObject({
  metadata: z.looseObject({ phone_number_id: z.string().min(1) }).optional(),
  messages: z.array(messageSchema).optional(),
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
  to: string;
  /** The delivery's `metadata.phone_number_id`; null falls back to `WHATSAPP_PHONE_NUMBER_ID`. */
  phone_number_id: string | null;
  [field: string]: unknown;
}

/**
 * The inbound messages of one webhook delivery, in order (400 naming the field when
 * the shape is wrong). Routed: messages of type `text` in `messages` changes, each as
 * a `dm` keyed by its sender. Ignored: status callbacks (sent, delivered, read,
 * failed), every other message type (media, reactions, locations, interactive
 * replies, `unsupported`) and every other change field.
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
      for (const message of value.data.messages ?? []) {
        const inbound = toInbound(message, value.data);
        if (inbound) messages.push(inbound);
      }
    }
  }
  return messages;
}

function toInbound(message: WhatsAppMessage, value: WhatsAppValue): InboundMessage | null {
  if (message.type !== "text" || !message.text?.body) return null;
  const target: WhatsAppTarget = {
    platform: "whatsapp",
    to: message.from,
    phone_number_id: value.metadata?.phone_number_id ?? null,
  };
  return {
    platform: "whatsapp",
    eventId: message.id,
    chatId: message.from,
    chatType: "dm",
    userId: message.from,
    threadId: null,
    text: message.text.body,
    sentAt: message.timestamp === undefined ? null : Number(message.timestamp) * 1000,
    replyTo: target,
  };
}

function prefixed(error: z.ZodError, path: (string | number)[]): z.ZodError {
  return new z.ZodError(error.issues.map((issue) => ({ ...issue, path: [...path, ...issue.path] })));
}
