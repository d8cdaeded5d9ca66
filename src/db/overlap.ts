/**
 * Statements for overlapping messages (spec "Overlapping messages", invariant 11):
 * which run carries each stored user message, and which were never dispatched.
 * A user message is waiting while both `run_id` and `not_dispatched` are null;
 * each statement below moves it out of (or, for a revoked run, back into) that
 * state only from the state it must be in, so a replayed or raced batch can never
 * give one message two live runs, nor a reason and a run at once.
 *
 * Messages are found by session (the primary key's prefix) and event id: these
 * run when a waiting message is dispatched or dropped, never on the path that
 * answers a webhook (a message dispatched at once gets its `run_id` in the append).
 */
import type { NotDispatchedReason } from "../domain/overlap-plan";
import { exec, selectRowsSql, type Statement } from "./client";
import { messages, type MessageRow } from "./schema";

const EVENT_IN_LIST = `event_id IN (SELECT value FROM json_each(?))`;

/**
 * Gives waiting user messages of `sessionId` (by event id) to `runId`, only while
 * that run exists and is not revoked. Put it in the batch that inserts the run,
 * after the insert. The changed-row count says how many it took.
 */
export function attachMessages(sessionId: string, runId: string, eventIds: readonly string[]): Statement<number> {
  return exec(
    `UPDATE messages SET run_id = ?
      WHERE session_id = ? AND role = 'user' AND run_id IS NULL AND not_dispatched IS NULL AND ${EVENT_IN_LIST}
        AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND revoked_reason IS NULL)`,
    runId,
    sessionId,
    JSON.stringify(eventIds),
    runId,
  );
}

/**
 * An interrupt revokes an unfinished run as `superseded` (its heartbeat then says
 * so, and its reply, even a 200 already on its way, is never recorded nor
 * delivered: `recordReply` skips a revoked run). Only an unfinished run: a
 * finished or failed one keeps what it is.
 */
export function revokeInterrupted(runId: string): Statement<number> {
  return exec(
    `UPDATE runs SET revoked_reason = 'superseded'
      WHERE id = ? AND finished_at IS NULL AND revoked_reason IS NULL AND failed_at IS NULL`,
    runId,
  );
}

/**
 * An interrupt revoked `runId`: its user messages wait again (run_id null), so the
 * run that replaces it can carry them. Put it after `revokeInterrupted` in the same
 * batch. Only from a run that is revoked, or was staged and never written to D1
 * (its hand-off still in the routing object's outbox, which the interrupt drops):
 * a live, finished or failed run never loses its messages.
 */
export function releaseMessages(sessionId: string, runId: string): Statement<number> {
  return exec(
    `UPDATE messages SET run_id = NULL
      WHERE session_id = ? AND role = 'user' AND run_id = ?
        AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ? AND revoked_reason IS NULL)`,
    sessionId,
    runId,
    runId,
  );
}

/**
 * Records waiting user messages as never dispatched, with the reason (a command or
 * the session's end left them behind). A message a run carries is never touched.
 */
export function markNotDispatched(
  sessionId: string,
  eventIds: readonly string[],
  reason: NotDispatchedReason,
): Statement<number> {
  return exec(
    `UPDATE messages SET not_dispatched = ?
      WHERE session_id = ? AND role = 'user' AND run_id IS NULL AND not_dispatched IS NULL AND ${EVENT_IN_LIST}`,
    reason,
    sessionId,
    JSON.stringify(eventIds),
  );
}

/**
 * Records every waiting user message of an ended session as never dispatched: the
 * twin of `markNotDispatched` for an end the routing object did not see (an end
 * written by SQL, an operator end) or for its storage lost (a forgotten entry).
 * Only touches a session that has ended.
 */
export function markSessionNotDispatched(sessionId: string, reason: NotDispatchedReason): Statement<number> {
  return exec(
    `UPDATE messages SET not_dispatched = ?
      WHERE session_id = ? AND role = 'user' AND run_id IS NULL AND not_dispatched IS NULL
        AND EXISTS (SELECT 1 FROM sessions WHERE id = ? AND end_reason IS NOT NULL)`,
    reason,
    sessionId,
    sessionId,
  );
}

/** Records the messages a run carries (the hand-off's `messages`, oldest first), for an operator retry. */
export function setRunMessages(runId: string, carried: readonly unknown[]): Statement<number> {
  return exec(`UPDATE runs SET messages = ? WHERE id = ?`, JSON.stringify(carried), runId);
}

/**
 * The user messages of a session no run carries yet and none recorded as not
 * dispatched, oldest first: what waits, as D1 knows it (to rebuild the routing
 * object's waiting list when its storage was lost).
 */
export function selectWaitingMessages(sessionId: string): Statement<MessageRow[]> {
  return selectRowsSql(
    messages,
    `SELECT * FROM messages WHERE session_id = ? AND role = 'user' AND run_id IS NULL AND not_dispatched IS NULL
      ORDER BY seq`,
    sessionId,
  );
}

/**
 * Records every waiting user message of a session that has ended as never
 * dispatched, with the reason its end gives (`new_command` for `/new` and
 * `/reset`, `stopped` for `/stop`, `session_ended` for any other end). Runs in
 * every batch that ends a session, and in the batch that dispatches a run (whose
 * session may have ended meanwhile); a no-op for a live session, and for a
 * rotation, whose waiting messages are carried on in the continuation.
 */
export function markEndedNotDispatched(sessionId: string): Statement<number> {
  // The session and the parents it continues by rotation: a message that waited in a
  // parent went on waiting here (a rotation moves what waits), while its row stays
  // where it was stored. Only a rotation's parent can still hold a waiting message.
  return exec(
    `UPDATE messages SET not_dispatched = (SELECT CASE end_reason WHEN 'new_command' THEN 'new_command'
          WHEN 'suspended' THEN 'stopped' ELSE 'session_ended' END FROM sessions WHERE id = ?1)
      WHERE session_id IN (
          WITH RECURSIVE chain(id, parent) AS (
            SELECT id, parent_session_id FROM sessions WHERE id = ?1
            UNION ALL
            SELECT p.id, p.parent_session_id FROM sessions p JOIN chain ON p.id = chain.parent
              WHERE p.end_reason = 'compression')
          SELECT id FROM chain)
        AND role = 'user' AND run_id IS NULL AND not_dispatched IS NULL
        AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = ?1 AND s.end_reason IS NOT NULL
          AND NOT (s.end_reason = 'compression'
            AND EXISTS (SELECT 1 FROM sessions c WHERE c.session_key = s.session_key AND c.parent_session_id = s.id)))`,
    sessionId,
  );
}
