/**
 * Statements on `sessions`, `messages` and `inbound_events`. Each state change is
 * a conditional statement (spec invariant 4) and multi-step changes are chained
 * inside one D1 batch with `changes() = 1`: SQLite's count of rows changed by the
 * previous statement, so a step runs only when the one before it took effect and
 * the whole chain is one atomic, one-round-trip unit.
 */
import { and, desc, eq, isNotNull, isNull, type SQL } from "drizzle-orm";
import { attachmentsColumn, type StoredAttachment } from "../domain/attachments";
import type { PolicyReason } from "../domain/end-reasons";
import type { Replaced } from "../domain/routing-decision";
import { exec, query, selectRows, type Database, type Statement } from "./client";
import { insertAttachments } from "./attachments";
import { sessions, messages, type SessionRow, type MessageRow } from "./schema";
import { dayOf, RECOVERABLE_SQL, sqlTime } from "./sql-lists";

export function selectSession(db: Database, id: string): Statement<SessionRow[]> {
  return selectRows(sessions, db.q.select().from(sessions).where(eq(sessions.id, id)));
}

/** Spec invariant 5: only the newest row of a key is ever a resume candidate. */
export function selectNewestForKey(db: Database, key: string): Statement<SessionRow[]> {
  return selectRows(
    sessions,
    db.q.select().from(sessions).where(eq(sessions.sessionKey, key)).orderBy(desc(sessions.startedAt)).limit(1),
  );
}

export function selectSessions(
  db: Database,
  filter: { key?: string; open?: boolean; limit: number },
): Statement<SessionRow[]> {
  const conditions: SQL[] = [];
  if (filter.key !== undefined) conditions.push(eq(sessions.sessionKey, filter.key));
  if (filter.open === true) conditions.push(isNull(sessions.endReason));
  if (filter.open === false) conditions.push(isNotNull(sessions.endReason));
  return selectRows(
    sessions,
    db.q
      .select()
      .from(sessions)
      .where(and(...conditions))
      .orderBy(desc(sessions.startedAt))
      .limit(filter.limit),
  );
}

export function selectMessages(db: Database, sessionId: string): Statement<MessageRow[]> {
  return selectRows(
    messages,
    db.q.select().from(messages).where(eq(messages.sessionId, sessionId)).orderBy(messages.seq),
  );
}

// Event ids are remembered per platform (spec invariant 9), under the UTC day they
// were written: an event is new when neither today's nor yesterday's day holds it
// (at least 24 hours). Two equality probes, not `day IN (…)`: a probe that misses
// reads no row, and the IN form reads two.
const MARK = `SELECT 1 FROM inbound_events WHERE day = ? AND platform = ? AND event_id = ?`;
const NOT_SEEN = `NOT EXISTS (${MARK}) AND NOT EXISTS (${MARK})`;
const notSeenParams = (platform: string, eventId: string, now: number) => [
  dayOf(now),
  platform,
  eventId,
  dayOf(now) - 1,
  platform,
  eventId,
];

export interface DedupeMark {
  session_id: string | null;
  run_id: string | null;
}

/** The dedupe mark of an event, if it was stored within the retention window. */
export function selectDedupe(platform: string, eventId: string, now: number): Statement<DedupeMark[]> {
  const mark = `SELECT session_id, run_id FROM inbound_events WHERE day = ? AND platform = ? AND event_id = ?`;
  return query(`${mark} UNION ALL ${mark} LIMIT 1`, dayOf(now), platform, eventId, dayOf(now) - 1, platform, eventId);
}

export interface UserMessage {
  platform: string;
  sessionKey: string;
  eventId: string;
  runId: string | null;
  text: string;
  receivedAt: number;
  /** Media with their platform references; none for a text-only message. */
  attachments?: readonly StoredAttachment[];
}

/**
 * The steady-state path in one batch: bump activity only if the row is live, its
 * policy has not expired against D1's own `last_active_at`, and the event is new;
 * then store the message and its dedupe mark only if that bump happened. A row
 * ended a moment ago can never receive the message, and the mark can never exist
 * without the message (nor the message without the mark).
 * The first statement's changed-row count says whether the message was stored.
 */
export function appendUserMessage(sessionId: string, message: UserMessage, liveSince: number): Statement<number>[] {
  const { platform, eventId, runId, text, receivedAt } = message;
  return [
    exec(
      `UPDATE sessions SET last_active_at = MAX(last_active_at, ?), message_count = message_count + 1
        WHERE id = ? AND end_reason IS NULL AND last_active_at >= ? AND ${NOT_SEEN}`,
      receivedAt,
      sessionId,
      sqlTime(liveSince),
      ...notSeenParams(platform, eventId, receivedAt),
    ),
    exec(
      `INSERT INTO messages (session_id, seq, role, text, created_at, event_id, run_id, attachments)
        SELECT id, message_count, 'user', ?, ?, ?, ?, ? FROM sessions WHERE id = ? AND changes() = 1`,
      text,
      receivedAt,
      eventId,
      runId,
      attachmentsColumn(message.attachments),
      sessionId,
    ),
    markSeen(message, sessionId, "changes() = 1"),
    ...insertAttachments(sessionId, message),
  ];
}

function markSeen(message: UserMessage, sessionId: string | null, condition: string): Statement<number> {
  return exec(
    `INSERT INTO inbound_events (day, platform, event_id, session_key, session_id, run_id, received_at)
      SELECT ?, ?, ?, ?, ?, ?, ? WHERE ${condition}`,
    dayOf(message.receivedAt),
    message.platform,
    message.eventId,
    message.sessionKey,
    sessionId,
    message.runId,
    message.receivedAt,
  );
}

/**
 * The dedupe mark of a command, which stores no message. With a session, only if
 * that session exists (it may be inserted earlier in the same batch).
 */
export function markCommandSeen(message: UserMessage, sessionId: string | null): Statement<number> {
  if (sessionId === null) return markSeen(message, null, "1 = 1");
  return exec(
    `INSERT INTO inbound_events (day, platform, event_id, session_key, session_id, run_id, received_at)
      SELECT ?, ?, ?, ?, ?, NULL, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)`,
    dayOf(message.receivedAt),
    message.platform,
    message.eventId,
    message.sessionKey,
    sessionId,
    message.receivedAt,
    sessionId,
  );
}

export interface NewSession {
  id: string;
  sessionKey: string;
  platform: string;
  chatType: string;
  startedAt: number;
  parentSessionId: string | null;
  /** The ended row this one replaces (reset context), and the end reason the caller saw on it. */
  replaced: Replaced | null;
  noticePending: string | null;
  sweepAt: number | null;
  /** A continuation keeps its parent's last activity, so a rotation never re-arms the idle clock. */
  lastActiveAt?: number;
  /** A continuation adopts its parent's current run. */
  currentRunId?: string | null;
}

/**
 * Inserts a session, only if the row it follows (`replaced`, or the parent of a
 * continuation) is still its key's newest row and still carries the end reason the
 * caller saw, so a race or a stale entry can never leave two live rows for one key; and, when it starts with a message, only if
 * that message's event is new. With `first`, the message and its dedupe mark
 * follow in the same chain.
 */
export function insertSession(
  session: NewSession,
  first: UserMessage | null,
  follows: { sessionId: string; reason: string } | null = session.replaced,
  options: { endedJustBefore?: boolean } = {},
): Statement<number>[] {
  // Only if the statement just before it in the batch ended the row it follows: a
  // row another writer ended meanwhile, even with the same reason, is not followed.
  const conditions = [options.endedJustBefore ? "changes() = 1" : "1 = 1"];
  // Spec invariant 5: a session only ever follows its key's newest row, or starts a
  // key with none (a brand-new key's first session: the newest row IS NULL). A caller
  // working from a stale entry (its process was killed after D1 stored a newer session,
  // before the entry learnt of it) misses here and rereads, so a key never gets a
  // second live row. One index probe (sessions_key_started), however long the key's history.
  conditions.push(`(SELECT id FROM sessions WHERE session_key = ? ORDER BY started_at DESC LIMIT 1) IS ?`);
  const guardParams: unknown[] = [session.sessionKey, follows?.sessionId ?? null];
  if (follows) {
    conditions.push(`EXISTS (SELECT 1 FROM sessions WHERE id = ? AND end_reason = ?)`);
    guardParams.push(follows.sessionId, follows.reason);
  }
  if (first) {
    conditions.push(NOT_SEEN);
    guardParams.push(...notSeenParams(first.platform, first.eventId, first.receivedAt));
  }
  const insert = exec(
    `INSERT INTO sessions (id, session_key, platform, chat_type, started_at, last_active_at, message_count,
        parent_session_id, previous_session_id, reset_reason, reset_had_activity, notice_pending, sweep_at, current_run_id)
      SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE ${conditions.join(" AND ")}`,
    session.id,
    session.sessionKey,
    session.platform,
    session.chatType,
    session.startedAt,
    first ? first.receivedAt : (session.lastActiveAt ?? session.startedAt),
    first ? 1 : 0,
    session.parentSessionId,
    session.replaced?.sessionId ?? null,
    session.replaced?.reason ?? null,
    session.replaced ? (session.replaced.hadActivity ? 1 : 0) : null,
    session.noticePending,
    session.sweepAt,
    session.currentRunId ?? null,
    ...guardParams,
  );
  if (!first) return [insert];
  return [
    insert,
    exec(
      `INSERT INTO messages (session_id, seq, role, text, created_at, event_id, run_id, attachments)
        SELECT ?, 1, 'user', ?, ?, ?, ?, ? WHERE changes() = 1`,
      session.id,
      first.text,
      first.receivedAt,
      first.eventId,
      first.runId,
      attachmentsColumn(first.attachments),
    ),
    markSeen(first, session.id, "changes() = 1"),
    ...insertAttachments(session.id, first),
  ];
}

/**
 * Ends a live row (spec invariant 4: ending only touches a live row; first reason
 * wins). A recoverable end keeps `sweep_at` so that the policy can still promote
 * the row later; any other end clears it.
 */
export function endLive(sessionId: string, reason: string, recoverable: boolean, now: number): Statement<number> {
  return exec(
    `UPDATE sessions SET end_reason = ?, ended_at = ?, sweep_at = CASE WHEN ? THEN sweep_at ELSE NULL END
      WHERE id = ? AND end_reason IS NULL`,
    reason,
    now,
    recoverable ? 1 : 0,
    sessionId,
  );
}

/**
 * Ends a live or recoverable row by its policy, only while D1's own last activity
 * still says it is expired. A recoverable row keeps the time it ended.
 */
export function promoteExpired(
  sessionId: string,
  reason: PolicyReason,
  liveSince: number,
  now: number,
): Statement<number> {
  return exec(
    `UPDATE sessions SET end_reason = ?, ended_at = COALESCE(ended_at, ?), sweep_at = NULL
      WHERE id = ? AND (end_reason IS NULL OR end_reason IN (${RECOVERABLE_SQL})) AND last_active_at < ?`,
    reason,
    now,
    sessionId,
    sqlTime(liveSince),
  );
}

/** Reopens a recoverable row (same id, transcript kept) while its policy has not expired. */
export function reopenRecoverable(
  sessionId: string,
  sessionKey: string,
  liveSince: number,
  sweepAt: number | null,
): Statement<number> {
  // Spec invariant 5: only the key's newest row is reopened. An entry left pointing at
  // an older released row (its object was killed after D1 stored the `/new` that
  // followed it) misses here and rereads, so the key never gets two live rows.
  return exec(
    `UPDATE sessions SET end_reason = NULL, ended_at = NULL, sweep_at = ?
      WHERE id = ? AND end_reason IN (${RECOVERABLE_SQL}) AND last_active_at >= ?
        AND id = (SELECT id FROM sessions WHERE session_key = ? ORDER BY started_at DESC LIMIT 1)`,
    sweepAt,
    sessionId,
    sqlTime(liveSince),
    sessionKey,
  );
}

/** A row that became a durable boundary out of band needs no more looking at. */
export function clearSweepAt(sessionId: string): Statement<number> {
  return exec(
    `UPDATE sessions SET sweep_at = NULL WHERE id = ? AND sweep_at IS NOT NULL
      AND end_reason IS NOT NULL AND end_reason NOT IN (${RECOVERABLE_SQL})`,
    sessionId,
  );
}

/** Sessions whose `sweep_at` passed before `before`, oldest first (served by sessions_sweep). */
export function selectSweepDue(before: number, limit: number): Statement<{ id: string; session_key: string }[]> {
  return query(
    `SELECT id, session_key FROM sessions WHERE sweep_at IS NOT NULL AND sweep_at <= ? ORDER BY sweep_at LIMIT ?`,
    before,
    limit,
  );
}

/** Records the deadline the routing object now knows, for the sweep. */
export function setSweepAt(sessionId: string, sweepAt: number | null): Statement<number> {
  return exec(
    `UPDATE sessions SET sweep_at = ? WHERE id = ? AND (end_reason IS NULL OR end_reason IN (${RECOVERABLE_SQL}))
      AND sweep_at IS NOT ?`,
    sweepAt,
    sessionId,
    sweepAt,
  );
}
