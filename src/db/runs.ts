/** Statements on `runs`: dispatch, revocation, and the one-batch recording of a reply. */
import { eq } from "drizzle-orm";
import { exec, selectRows, selectRowsSql, type Database, type Statement } from "./client";
import { deliveries, runs, sessions, type DeliveryRow, type RunRow, type SessionRow } from "./schema";
import { sqlTime } from "./sql-lists";

export interface NewRun {
  id: string;
  sessionId: string;
  sessionKey: string;
  eventId: string;
  tokenHash: string;
  replyTo: string;
  createdAt: number;
}

/**
 * Makes a run its session's current run (spec: the latest one dispatched), only
 * while the session is live; a run whose session ended before its hand-off is
 * revoked by `revokeRuns` in the same batch instead.
 */
export function dispatchRun(run: NewRun, now: number): Statement<number>[] {
  return [
    exec(
      `INSERT INTO runs (id, session_id, session_key, event_id, token_hash, reply_to, created_at)
        VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      run.id,
      run.sessionId,
      run.sessionKey,
      run.eventId,
      run.tokenHash,
      run.replyTo,
      run.createdAt,
    ),
    exec(
      `UPDATE sessions SET current_run_id = ? WHERE id = ? AND end_reason IS NULL
        AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ? AND (dispatched_at IS NOT NULL OR revoked_reason IS NOT NULL))`,
      run.id,
      run.sessionId,
      run.id,
    ),
    exec(`UPDATE runs SET dispatched_at = ? WHERE id = ? AND changes() = 1`, now, run.id),
    revokeRuns(run.sessionId),
  ];
}

/**
 * Revokes every unfinished run of a session that has ended (a rotation moves its
 * runs instead). Runs in every batch that ends a session, and is a no-op otherwise.
 */
export function revokeRuns(sessionId: string): Statement<number> {
  return exec(
    `UPDATE runs SET revoked_reason = (
        SELECT CASE end_reason WHEN 'new_command' THEN 'superseded' WHEN 'suspended' THEN 'stopped' ELSE 'session_ended' END
          FROM sessions WHERE id = runs.session_id)
      WHERE session_id = ? AND finished_at IS NULL AND revoked_reason IS NULL
        AND EXISTS (SELECT 1 FROM sessions WHERE id = ? AND end_reason IS NOT NULL AND end_reason <> 'compression')`,
    sessionId,
    sessionId,
  );
}

export function selectRun(db: Database, runId: string): Statement<RunRow[]> {
  return selectRows(runs, db.q.select().from(runs).where(eq(runs.id, runId)));
}

/** The session a run currently belongs to (a rotation moves runs to the continuation). */
export function selectSessionOfRun(runId: string): Statement<SessionRow[]> {
  return selectRowsSql(sessions, `SELECT * FROM sessions WHERE id = (SELECT session_id FROM runs WHERE id = ?)`, runId);
}

/**
 * A rotation moves the session's unfinished runs, still current, to the
 * continuation: their replies land there, and they are not revoked.
 */
export function moveRuns(fromSessionId: string, toSessionId: string): Statement<number> {
  return exec(
    `UPDATE runs SET session_id = ? WHERE session_id = ? AND finished_at IS NULL AND revoked_reason IS NULL`,
    toSessionId,
    fromSessionId,
  );
}

export function touchHeartbeat(runId: string, now: number): Statement<number> {
  return exec(`UPDATE runs SET last_heartbeat_at = ? WHERE id = ?`, now, runId);
}

export function markRunFailed(runId: string, now: number, error: string): Statement<number> {
  return exec(
    `UPDATE runs SET failed_at = ?, last_error = ? WHERE id = ? AND finished_at IS NULL`,
    now,
    error.slice(0, 500),
    runId,
  );
}

/** The reply delivery's id: one per run, so recording a reply twice is a no-op. */
export const replyDeliveryId = (runId: string) => `dl_${runId}_reply`;

/**
 * Records a run's reply in one batch. The run is finished (first reply wins) and
 * keeps the text whatever happens next. Then, only if there is text, the run is
 * not revoked, and its session is live and within its policy (`liveSince`): the
 * activity bump that also clears the pending reset notice, the assistant message,
 * and, when the reply has somewhere to go, its delivery row carrying that notice.
 * The last statement reads the delivery row back, so replaying the batch after a
 * restart tells whether a delivery is still owed.
 */
export function recordReply(
  runId: string,
  text: string | null,
  liveSince: number,
  now: number,
  options: { notice: string | null; deliverable: boolean },
): [Statement<number>, Statement<number>, Statement<number>, Statement<number>, Statement<DeliveryRow[]>] {
  const sessionOf = `(SELECT session_id FROM runs WHERE id = ?)`;
  return [
    exec(`UPDATE runs SET finished_at = ?, reply_text = ? WHERE id = ? AND finished_at IS NULL`, now, text, runId),
    exec(
      `UPDATE sessions SET last_active_at = MAX(last_active_at, ?), message_count = message_count + 1, notice_pending = NULL
        WHERE id = ${sessionOf} AND changes() = 1 AND ? AND end_reason IS NULL AND last_active_at >= ?
          AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ? AND revoked_reason IS NOT NULL)`,
      now,
      runId,
      text === null ? 0 : 1,
      sqlTime(liveSince),
      runId,
    ),
    exec(
      `INSERT INTO messages (session_id, seq, role, text, created_at, event_id, run_id)
        SELECT id, message_count, 'assistant', ?, ?, NULL, ? FROM sessions WHERE id = ${sessionOf} AND changes() = 1`,
      text,
      now,
      runId,
      runId,
    ),
    exec(
      `INSERT INTO deliveries (id, session_id, run_id, event_id, platform, kind, status, text, notice, target, created_at, updated_at)
        SELECT ?, session_id, id, event_id, json_extract(reply_to, '$.platform'), 'reply', 'pending', ?, ?, reply_to, ?, ?
          FROM runs WHERE id = ? AND changes() = 1 AND ?`,
      replyDeliveryId(runId),
      text,
      options.notice,
      now,
      now,
      runId,
      options.deliverable ? 1 : 0,
    ),
    selectRowsSql(deliveries, `SELECT * FROM deliveries WHERE id = ?`, replyDeliveryId(runId)),
  ];
}
