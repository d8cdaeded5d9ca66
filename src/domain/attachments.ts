/**
 * Media a user sent with a message (spec "Attachments and what counts as a
 * message"). Adapters describe each one with its platform reference (a Telegram
 * `file_id`, a Slack or Discord URL, a WhatsApp media id, a generic client's URL);
 * ingress gives it the gateway's own id. The reference stays in D1 and is only ever
 * used by `GET /v1/attachments/{id}`: the agent, the operator API and the hooks see
 * the id, kind, MIME type, name and size, never where the bytes are.
 */
import { log } from "../log";

export const ATTACHMENT_KINDS = ["image", "audio", "voice", "video", "file", "sticker"] as const;
export type AttachmentKind = (typeof ATTACHMENT_KINDS)[number];

/** Where the platform keeps the bytes; read server-side only (see src/attachments/). */
export interface AttachmentSource {
  platform: string;
  /** Telegram file_id, Slack url_private_download, Discord attachment URL, WhatsApp media id, generic URL. */
  ref: string;
}

/** One attachment as an adapter parses it. Fields the platform does not give are null. */
export interface InboundAttachment {
  kind: AttachmentKind;
  mimeType: string | null;
  name: string | null;
  size: number | null;
  source: AttachmentSource;
}

/** An attachment once ingress has given it the gateway's id. */
export interface StoredAttachment extends InboundAttachment {
  id: string;
}

/** The public shape, as admin answers, transcripts and the agent see it. */
export interface AttachmentJson {
  id: string;
  kind: AttachmentKind;
  mime_type: string | null;
  name: string | null;
  size: number | null;
}

/** The agent's shape: the public one plus the gateway path that serves the bytes. */
export interface HandoffAttachment extends AttachmentJson {
  path: string;
}

export function attachmentJson(attachment: StoredAttachment): AttachmentJson {
  return {
    id: attachment.id,
    kind: attachment.kind,
    mime_type: attachment.mimeType,
    name: attachment.name,
    size: attachment.size,
  };
}

export function attachmentPath(id: string): string {
  return `/v1/attachments/${encodeURIComponent(id)}`;
}

export function handoffAttachment(attachment: StoredAttachment): HandoffAttachment {
  return { ...attachmentJson(attachment), path: attachmentPath(attachment.id) };
}

/**
 * The `messages.attachments` column: the public JSON list, or null for a message
 * without any (so a text-only message stores nothing more than before).
 */
export function attachmentsColumn(attachments: readonly StoredAttachment[] | undefined): string | null {
  return attachments && attachments.length > 0 ? JSON.stringify(attachments.map(attachmentJson)) : null;
}

/** Reads the `messages.attachments` column back; an empty or unreadable one is no attachments. */
export function parseAttachmentsColumn(column: string | null): AttachmentJson[] {
  if (!column) return [];
  try {
    const parsed: unknown = JSON.parse(column);
    return Array.isArray(parsed) ? (parsed as AttachmentJson[]) : [];
  } catch {
    // Operators edit rows by SQL; a broken column must not break the session view.
    log.warn("messages.attachments is not valid JSON; shown as none");
    return [];
  }
}

/** A size the platform reported: a non-negative integer, else unknown. */
export function sizeOf(value: unknown): number | null {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? value : null;
}

/** A non-empty string, else unknown. */
export function stringOrNull(value: unknown): string | null {
  return typeof value === "string" && value !== "" ? value : null;
}

/** The kind a MIME type suggests, for platforms that only give the type. */
export function kindOfMime(mimeType: string | null): AttachmentKind {
  const top = mimeType?.split("/")[0]?.toLowerCase();
  if (top === "image") return "image";
  if (top === "audio") return "audio";
  if (top === "video") return "video";
  return "file";
}
