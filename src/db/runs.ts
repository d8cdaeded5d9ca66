/** Statements on `runs`: dispatch, revocation, and the one-batch recording of a reply. */
import { eq } from "drizzle-orm";
import { exec, selectRows, selectRowsSql, type Database, type Statement } from "./client";
import { deliveries, runs, sessions, type RunRow, type SessionRow } from "./schema";
import { sqlTime } from "./sql-lists";

export interface NewRun {
  id: string;
  sessionId: string;
  sessionKey: string;
  eventId: string;
  tokenHash: string;
  replyTo: string;
  createdAt: number;
  /** JSON of the routed message it hands over (no token). */
  message: string;
  /** Its hand-off says `is_new`: the session's first run. */
  isNew: boolean;
}

/** The columns a new run is inserted with, and their values in that order. */
const RUN_COLUMNS = "id, session_id, session_key, event_id, token_hash, reply_to, created_at, message, is_new";
const runValues = (run: NewRun) => [
  run.id,
  run.sessionId,
  run.sessionKey,
  run.eventId,
  run.tokenHash,
  run.replyTo,
  run.createdAt,
  run.message,
  run.isNew ? 1 : 0,
];

/**
 * Makes a run its session's current run (spec: the latest one dispatched), only
 * while the session is live; a run whose session ended before its hand-off is
 * revoked by `revokeRuns` in the same batch instead.
 */
export function dispatchRun(run: NewRun, now: number): Statement<number>[] {
  return [
    exec(
      `INSERT INTO runs (${RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      ...runValues(run),
    ),
    exec(
      `UPDATE sessions SET current_run_id = ? WHERE id = ? AND end_reason IS NULL
        AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ? AND (dispatched_at IS NOT NULL OR revoked_reason IS NOT NULL))`,
      run.id,
      run.sessionId,
      run.id,
    ),
    exec(`UPDATE runs SET dispatched_at = ? WHERE id = ? AND changes() = 1`, now, run.id),
    revokeRun(run.id, run.sessionId),
    // One more attempt at the hand-off (the operator API shows the count).
    exec(`UPDATE runs SET attempts = attempts + 1 WHERE id = ? AND finished_at IS NULL`, run.id),
  ];
}

/** Why a run of an ended session is revoked (the SQL twin of `revocationFor`). */
const REVOCATION_OF_SESSION = `SELECT CASE end_reason WHEN 'new_command' THEN 'superseded' WHEN 'suspended' THEN 'stopped'
    ELSE 'session_ended' END FROM sessions WHERE id = runs.session_id`;

/**
 * The session (bound to `?`) has ended, and not by a rotation: a `compression` end
 * moves its runs to the continuation, but one written by SQL has none to move to.
 */
const ENDED_WITHOUT_CONTINUATION = `SELECT 1 FROM sessions s WHERE s.id = ? AND s.end_reason IS NOT NULL
    AND NOT (s.end_reason = 'compression' AND EXISTS (SELECT 1 FROM sessions c WHERE c.session_key = s.session_key AND c.parent_session_id = s.id))`;

/**
 * Revokes every unfinished run of a session that has ended (a rotation moves its
 * runs instead). Runs in every batch that ends a session, and is a no-op otherwise.
 * A run that failed for good is not unfinished: it stays failed, for the operator.
 */
export function revokeRuns(sessionId: string): Statement<number> {
  return exec(
    `UPDATE runs SET revoked_reason = (${REVOCATION_OF_SESSION})
      WHERE session_id = ? AND finished_at IS NULL AND revoked_reason IS NULL AND failed_at IS NULL
        AND EXISTS (${ENDED_WITHOUT_CONTINUATION})`,
    sessionId,
    sessionId,
  );
}

/** Revokes one unfinished run whose session has ended (it was dispatched too late). */
function revokeRun(runId: string, sessionId: string): Statement<number> {
  return exec(
    `UPDATE runs SET revoked_reason = (${REVOCATION_OF_SESSION})
      WHERE id = ? AND finished_at IS NULL AND revoked_reason IS NULL
        AND EXISTS (${ENDED_WITHOUT_CONTINUATION})`,
    runId,
    sessionId,
  );
}

export function selectRun(db: Database, runId: string): Statement<RunRow[]> {
  return selectRows(runs, db.q.select().from(runs).where(eq(runs.id, runId)));
}

/** A session's unfinished, unrevoked runs (served by the partial index runs_open). */
export function selectOpenRuns(sessionId: string): Statement<RunRow[]> {
  return selectRowsSql(
    runs,
    `SELECT * FROM runs WHERE session_id = ? AND finished_at IS NULL AND revoked_reason IS NULL`,
    sessionId,
  );
}

/** The session a run currently belongs to (a rotation moves runs to the continuation). */
export function selectSessionOfRun(runId: string): Statement<SessionRow[]> {
  return selectRowsSql(sessions, `SELECT * FROM sessions WHERE id = (SELECT session_id FROM runs WHERE id = ?)`, runId);
}

/**
 * A rotation moves the session's current run (finished or not, so it may still end
 * the continuation) and its other unfinished runs to the continuation: their
 * replies land there, and they are not revoked. Only once the continuation is in
 * D1: its insert, earlier in the same batch, happens only if that batch ended the
 * parent, so a rotation that lost a race to another writer moves nothing.
 */
export function moveRuns(fromSessionId: string, toSessionId: string): [Statement<number>, Statement<number>] {
  const continued = `EXISTS (SELECT 1 FROM sessions WHERE id = ?)`;
  return [
    exec(
      `UPDATE runs SET session_id = ? WHERE id = (SELECT current_run_id FROM sessions WHERE id = ?) AND session_id = ?
        AND ${continued}`,
      toSessionId,
      fromSessionId,
      fromSessionId,
      toSessionId,
    ),
    exec(
      `UPDATE runs SET session_id = ? WHERE session_id = ? AND finished_at IS NULL AND revoked_reason IS NULL
        AND ${continued}`,
      toSessionId,
      fromSessionId,
      toSessionId,
    ),
  ];
}

export function touchHeartbeat(runId: string, now: number): Statement<number> {
  return exec(`UPDATE runs SET last_heartbeat_at = ? WHERE id = ?`, now, runId);
}

/** A hand-off attempt failed and will be retried: the operator API shows why. */
export function recordRunRetry(runId: string, error: string): Statement<number> {
  return exec(`UPDATE runs SET last_error = ? WHERE id = ? AND finished_at IS NULL`, error.slice(0, 500), runId);
}

/**
 * The agent accepted the run with 202: it is running, and its lease starts now. Only
 * while it is open: a 202 to a hand-off repeated after the run already finished (its
 * reply came through the API) or was revoked changes nothing (1 row changed, else 0).
 */
export function markRunAccepted(runId: string, now: number): Statement<number> {
  return exec(
    `UPDATE runs SET accepted_at = ?, last_heartbeat_at = ?
      WHERE id = ? AND finished_at IS NULL AND revoked_reason IS NULL AND failed_at IS NULL`,
    now,
    now,
    runId,
  );
}

/**
 * An operator retry of a failed run: the same run, handed over again with a fresh
 * attempt count and a fresh token (only its hash is kept), only while it is failed.
 */
export function requeueFailedRun(runId: string, tokenHash: string): Statement<number> {
  return exec(
    `UPDATE runs SET failed_at = NULL, last_error = NULL, attempts = 0, accepted_at = NULL, token_hash = ?
      WHERE id = ? AND failed_at IS NOT NULL AND finished_at IS NULL AND revoked_reason IS NULL`,
    tokenHash,
    runId,
  );
}

/**
 * The runs of a session for the operator API, oldest first: those that carry its
 * messages, and its current run (a rotation moves it). Served by primary keys.
 */
export function selectSessionRuns(sessionId: string): Statement<RunRow[]> {
  return selectRowsSql(
    runs,
    `SELECT * FROM runs WHERE id IN (
        SELECT run_id FROM messages WHERE session_id = ? AND run_id IS NOT NULL
        UNION SELECT current_run_id FROM sessions WHERE id = ?)
      ORDER BY created_at, id`,
    sessionId,
    sessionId,
  );
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

export interface ReplyRecord {
  runId: string;
  sessionId: string;
  /** Null when the agent had nothing to say: the run is finished, nothing is added. */
  text: string | null;
  /** The session must still be within its policy: last activity at or after this. */
  liveSince: number;
  /**
   * The session is held open by its turn in progress (spec invariant 6: expiry
   * waits for it), so the reply is recorded even past the policy's deadline.
   */
  held: boolean;
  now: number;
  /** Whether the reply has anywhere to go (a delivery row is written only then). */
  deliverable: boolean;
  /** Whether the session may still owe a reset notice (the statement that clears it runs only then). */
  clearNotice: boolean;
}

/**
 * After the statement that finishes the run (it must change one row the first time
 * only): if there is text, the run is not revoked, and the session is live and
 * within its policy, bump the session's activity (and, for `currentRunId`, make the
 * run current), add the assistant message, write its delivery row carrying the
 * session's pending reset notice, then clear that notice. The batch then reads
 * the delivery row back, so replaying it after a restart tells whether a delivery
 * is still owed.
 */
function replyChain(reply: ReplyRecord, options: { makeCurrent: boolean }): Statement<unknown>[] {
  const { runId, sessionId, text, liveSince, held, now, deliverable } = reply;
  // A run made current here was inserted by the statement before (`changes() = 1`), in
  // this same transaction, so it cannot be revoked: probing it would read its row for nothing.
  const notRevoked = options.makeCurrent
    ? { sql: "", params: [] }
    : { sql: "AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ? AND revoked_reason IS NOT NULL)", params: [runId] };
  return [
    exec(
      `UPDATE sessions SET last_active_at = MAX(last_active_at, ?), message_count = message_count + 1,
          current_run_id = CASE WHEN ? THEN ? ELSE current_run_id END
        WHERE id = ? AND changes() = 1 AND ? AND end_reason IS NULL AND (? OR last_active_at >= ?) ${notRevoked.sql}`,
      now,
      options.makeCurrent ? 1 : 0,
      runId,
      sessionId,
      text === null ? 0 : 1,
      held ? 1 : 0,
      sqlTime(liveSince),
      ...notRevoked.params,
    ),
    exec(
      `INSERT INTO messages (session_id, seq, role, text, created_at, event_id, run_id)
        SELECT id, message_count, 'assistant', ?, ?, NULL, ? FROM sessions WHERE id = ? AND changes() = 1`,
      text,
      now,
      runId,
      sessionId,
    ),
    // Only when the reply has somewhere to go (otherwise it is recorded, not sent).
    ...(deliverable
      ? [
          exec(
            `INSERT INTO deliveries (id, session_id, run_id, event_id, platform, kind, status, text, notice, target,
                created_at, updated_at)
              SELECT ?, r.session_id, r.id, r.event_id, json_extract(r.reply_to, '$.platform'), 'reply', 'pending', ?,
                     s.notice_pending, r.reply_to, ?, ?
                FROM runs r JOIN sessions s ON s.id = r.session_id WHERE r.id = ? AND changes() = 1`,
            replyDeliveryId(runId),
            text,
            now,
            now,
            runId,
          ),
        ]
      : []),
    // The notice is owed to the first reply only: cleared once a reply was added.
    ...(reply.clearNotice ? [clearNotice(sessionId, runId)] : []),
  ];
}

function clearNotice(sessionId: string, runId: string): Statement<number> {
  return exec(
    `UPDATE sessions SET notice_pending = NULL WHERE id = ? AND notice_pending IS NOT NULL
        AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id AND m.seq = sessions.message_count
                      AND m.run_id = ? AND m.role = 'assistant')`,
    sessionId,
    runId,
  );
}

/** Reads a reply's delivery row back, the last statement of a batch whose reply is deliverable. */
const replyDelivery = (reply: ReplyRecord) =>
  reply.deliverable
    ? [selectRowsSql(deliveries, `SELECT * FROM deliveries WHERE id = ?`, replyDeliveryId(reply.runId))]
    : [];

/** What recording a reply did: the run finished now (not before), the reply was added, its delivery row. */
export type ReplyResults = [number, number, ...unknown[]];

/** Records a dispatched run's reply (first reply wins). See `replyChain`. */
export function recordReply(reply: ReplyRecord): Statement<unknown>[] {
  return [
    exec(
      `UPDATE runs SET finished_at = ?, reply_text = ? WHERE id = ? AND finished_at IS NULL`,
      reply.now,
      reply.text,
      reply.runId,
    ),
    ...replyChain(reply, { makeCurrent: false }),
    ...replyDelivery(reply),
  ];
}

/**
 * A turn whose answer is known at once (the echo agent): the run is created
 * dispatched and finished, made current, and its reply recorded, in one batch.
 */
export function recordInstantTurn(run: NewRun, reply: ReplyRecord): Statement<unknown>[] {
  return [
    exec(
      `INSERT INTO runs (${RUN_COLUMNS}, dispatched_at, finished_at, reply_text, attempts)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT DO NOTHING`,
      ...runValues(run),
      reply.now,
      reply.now,
      reply.text,
    ),
    ...replyChain(reply, { makeCurrent: true }),
    ...replyDelivery(reply),
  ];
}
