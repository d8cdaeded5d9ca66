/**
 * The generic platform (`POST /webhooks/generic`), for custom clients and tests:
 * an HMAC-SHA256 signature of the raw body in `X-Signature-256`, a small JSON body,
 * and replies POSTed to `GENERIC_REPLY_URL`.
 */
import * as z from "zod";
import { verifyHmacSha256Hex } from "../crypto";
import { ATTACHMENT_KINDS } from "../domain/attachments";
import type { InboundMessage } from "../domain/inbound";
import { CHAT_TYPES } from "../domain/session-key";
import { apiError } from "../http/errors";
import { standardWebhookHeaders } from "../hooks/standard-webhooks";
import { callJson } from "../http/outbound";
import { now } from "../clock";
import { newId } from "../ids";
import { parseJsonBytes, validationError } from "./parse";
import type { PlatformAdapter } from "./types";

const id = z.union([z.string().min(1).max(512), z.number().int()]).transform(String);

/** An attachment a generic client sends: where the gateway fetches it (no credential), and what it is. */
export const genericAttachmentSchema = z.object({
  url: z.url({ protocol: /^https?$/, error: "must be an http or https URL" }).max(4096),
  kind: z.enum(ATTACHMENT_KINDS),
  mime_type: z.string().min(1).max(256).nullish(),
  name: z.string().min(1).max(1024).nullish(),
  size: z.number().int().nonnegative().nullish(),
});

/** More than a chat message ever carries; a bigger list is a client bug. */
export const GENERIC_MAX_ATTACHMENTS = 20;

export const genericBodySchema = z
  .object({
    event_id: id,
    chat_id: id,
    chat_type: z.enum(CHAT_TYPES),
    user_id: id,
    // An empty thread id means "not in a thread", like a missing one.
    thread_id: z.preprocess((v) => (v === "" ? null : v), id.nullish()),
    // Media alone is a message with text "" (spec "what counts as a message").
    text: z.string().max(32_768).default(""),
    attachments: z.array(genericAttachmentSchema).max(GENERIC_MAX_ATTACHMENTS).default([]),
    sent_at: z.number().int().nonnegative().nullish(),
  })
  .refine((body) => body.text !== "" || body.attachments.length > 0, {
    path: ["text"],
    message: "must not be empty when there are no attachments",
  });

const SIGNATURE = /^sha256=([0-9a-fA-F]{64})$/;

/** Checks `X-Signature-256: sha256=<hex>` over the raw bytes received. */
export async function verifyGenericSignature(
  secret: string,
  rawBody: ArrayBuffer,
  header: string | null,
): Promise<boolean> {
  const match = header ? SIGNATURE.exec(header.trim()) : null;
  if (!match) return false;
  return verifyHmacSha256Hex(secret, rawBody, match[1]!);
}

export function toInbound(body: z.infer<typeof genericBodySchema>): InboundMessage {
  return {
    platform: "generic",
    eventId: body.event_id,
    chatId: body.chat_id,
    chatType: body.chat_type,
    userId: body.user_id,
    threadId: body.thread_id ?? null,
    text: body.text,
    attachments: body.attachments.map((a) => ({
      kind: a.kind,
      mimeType: a.mime_type ?? null,
      name: a.name ?? null,
      size: a.size ?? null,
      source: { platform: "generic", ref: a.url },
    })),
    sentAt: body.sent_at ?? null,
    replyTo: { platform: "generic" },
  };
}

export const generic: PlatformAdapter<{ secret: string }> = {
  name: "generic",
  methods: ["POST"],

  settings: (_env, config) => (config.genericWebhookSecret ? { secret: config.genericWebhookSecret } : null),

  async handle(input, { secret }) {
    if (!(await verifyGenericSignature(secret, input.rawBody, input.headers.get("x-signature-256")))) {
      throw apiError(401, "bad_signature", "missing or invalid X-Signature-256");
    }
    const parsed = genericBodySchema.safeParse(parseJsonBytes(input.rawBody));
    if (!parsed.success) throw validationError(parsed.error);
    return {
      kind: "route",
      messages: [toInbound(parsed.data)],
      answer: ([outcome]) => ({
        status: 200,
        body: { accepted: true, session_id: outcome?.sessionId ?? null, duplicate: outcome?.duplicate ?? false },
      }),
    };
  },

  sender: {
    canDeliver: (_target, config) => config.genericReplyUrl !== null,

    async send(message, config) {
      if (!config.genericReplyUrl) {
        return { ok: false, retryable: false, retryAfterMs: null, status: null, error: "GENERIC_REPLY_URL is not set" };
      }
      const body: Record<string, unknown> = {
        kind: message.kind === "progress" ? "progress" : "reply",
        event_id: message.eventId,
        session_key: message.sessionKey,
        session_id: message.sessionId,
        text: message.text,
      };
      if (message.notice) body.notice = message.notice;
      // Signed by Standard Webhooks with GENERIC_WEBHOOK_SECRET: the delivery id as webhook-id.
      const payload = JSON.stringify(body);
      const headers = config.genericWebhookSecret
        ? await standardWebhookHeaders(config.genericWebhookSecret, message.deliveryId ?? newId("dl"), now(), payload)
        : undefined;
      const { ok, retryable, retryAfterMs, status, error } = await callJson(config.genericReplyUrl, payload, {
        headers,
        timeoutMs: 10_000,
      });
      return { ok, retryable, retryAfterMs, status, error };
    },
  },
};
