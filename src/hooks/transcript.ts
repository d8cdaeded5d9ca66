/**
 * The transcript carried by `session.finalized`: the session's messages, oldest
 * first, bounded so that a very long session cannot produce an event no hook
 * receiver accepts. When the bounds cut it, the newest messages are kept (they
 * are what a memory service most needs) and `truncated` says so.
 */
import type { MessageRow } from "../db/schema";
import { parseAttachmentsColumn, type AttachmentJson } from "../domain/attachments";

export const TRANSCRIPT_MAX_MESSAGES = 500;
export const TRANSCRIPT_MAX_BYTES = 256 * 1024;

export interface TranscriptLine {
  role: string;
  text: string;
  at: number;
  attachments: AttachmentJson[];
}

const encoder = new TextEncoder();

/** A message row as the transcript shows it, with its attachments (ids, never platform references). */
export function transcriptLine(row: MessageRow): TranscriptLine {
  return { role: row.role, text: row.text, at: row.createdAt, attachments: parseAttachmentsColumn(row.attachments) };
}

export function boundTranscript(all: readonly TranscriptLine[]): { transcript: TranscriptLine[]; truncated: boolean } {
  const kept: TranscriptLine[] = [];
  let bytes = 0;
  for (let i = all.length - 1; i >= 0 && kept.length < TRANSCRIPT_MAX_MESSAGES; i--) {
    const line = all[i]!;
    const size =
      encoder.encode(line.text).length + (line.attachments.length ? JSON.stringify(line.attachments).length : 0);
    if (bytes + size > TRANSCRIPT_MAX_BYTES) break;
    bytes += size;
    kept.push(line);
  }
  kept.reverse();
  return { transcript: kept, truncated: kept.length < all.length };
}
