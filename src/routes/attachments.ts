/**
 * `GET /v1/attachments/{id}`: the bytes of a user's attachment, for the agent.
 * Authorised by the run token of any run of the session holding the message (or
 * of a continuation of it), then fetched from the platform at this moment with the
 * gateway's credentials and streamed through: never buffered whole, never larger
 * than ATTACHMENT_MAX_BYTES, and never a platform URL or credential in the answer.
 */
import { Hono } from "hono";
import { openMedia } from "../attachments/open";
import { limitBytes } from "../attachments/limit";
import { configOf, effectiveEnv } from "../config";
import { selectAttachment, selectContinues } from "../db/attachments";
import { Database } from "../db/client";
import { apiError } from "../http/errors";
import { errorSummary, log } from "../log";
import { requireRunToken } from "./auth";

export const attachmentsApi = new Hono<{ Bindings: Env }>();

attachmentsApi.get("/:id", async (c) => {
  const config = configOf(c.env);
  // As every run endpoint: the token first (401/403), then the id (404), then the right (403).
  const run = await requireRunToken(c);
  const id = c.req.param("id");
  const db = new Database(c.env.DB, "background");
  const [rows] = await db.batch(selectAttachment(db, id));
  const row = rows[0];
  if (!row) throw apiError(404, "not_found", `no attachment ${id}`);
  if (run.sessionId !== row.sessionId) {
    const [continues] = await db.batch(selectContinues(run.sessionId, row.sessionId));
    if (!continues[0]) throw apiError(403, "forbidden", "this run belongs to another session");
  }
  const outcome = await openMedia(row, effectiveEnv(c.env), config);
  if (!outcome.ok) {
    log.warn("attachment not served", {
      platform: row.platform,
      attachment_id: id,
      status: outcome.status,
      error: errorSummary(outcome.error),
    });
    throw apiError(outcome.status, outcome.status === 413 ? "payload_too_large" : "bad_gateway", outcome.error);
  }
  const { response } = outcome;
  const max = config.attachmentMaxBytes;
  const length = response.headers.get("content-length");
  if (length !== null && Number(length) > max) {
    await response.body?.cancel();
    throw apiError(413, "payload_too_large", `the attachment is ${length} bytes, over ATTACHMENT_MAX_BYTES (${max})`);
  }
  const headers = new Headers({
    "content-type": response.headers.get("content-type") ?? row.mimeType ?? "application/octet-stream",
    "cache-control": "private, no-store",
    "x-content-type-options": "nosniff",
  });
  if (length !== null) headers.set("content-length", length);
  const body = response.body ? limitBytes(response.body, max) : null;
  return new Response(body, { status: 200, headers });
});
