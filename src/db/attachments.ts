/**
 * Statements on `attachments`: the platform reference behind each gateway
 * attachment id, and who may read it.
 */
import { eq } from "drizzle-orm";
import type { StoredAttachment } from "../domain/attachments";
import { exec, query, selectRows, type Database, type Statement } from "./client";
import { attachments, type AttachmentRow } from "./schema";

/**
 * One insert per attachment, each only if the statement before it changed a row:
 * the chain follows the message's own (message, dedupe mark), so the references are
 * stored exactly when the message is, in the same batch. A text-only message gets none.
 */
export function insertAttachments(
  sessionId: string,
  message: { attachments?: readonly StoredAttachment[]; receivedAt: number },
): Statement<number>[] {
  return (message.attachments ?? []).map((attachment) =>
    exec(
      `INSERT INTO attachments (id, session_id, platform, ref, kind, mime_type, name, size, created_at)
        SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE changes() = 1`,
      attachment.id,
      sessionId,
      attachment.source.platform,
      attachment.source.ref,
      attachment.kind,
      attachment.mimeType,
      attachment.name,
      attachment.size,
      message.receivedAt,
    ),
  );
}

/** One attachment's row (its platform reference and the session holding it). */
export function selectAttachment(db: Database, id: string): Statement<AttachmentRow[]> {
  return selectRows(attachments, db.q.select().from(attachments).where(eq(attachments.id, id)));
}

/**
 * Whether `sessionId` is `ancestorId` or continues it through rotations
 * (`parent_session_id`, spec end reason `compression`): a rotation moves the
 * current run into the continuation, and that run may still read the media of
 * the messages it carries. Resets (`previous_session_id`) are boundaries and do
 * not count.
 */
export function selectContinues(sessionId: string, ancestorId: string): Statement<{ found: number }[]> {
  return query(
    `WITH RECURSIVE chain(id, depth) AS (
        SELECT ?, 0
        UNION ALL
        SELECT s.parent_session_id, chain.depth + 1 FROM sessions s JOIN chain ON s.id = chain.id
          WHERE s.parent_session_id IS NOT NULL AND chain.depth < 100
      )
      SELECT 1 AS found FROM chain WHERE id = ? LIMIT 1`,
    sessionId,
    ancestorId,
  );
}
