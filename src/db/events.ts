/**
 * Lifecycle event rows (spec "Lifecycle events"), written in the same batch as
 * the change they report. Each statement reads the session row as it stands after
 * that change and derives the event id from it:
 *   session.started    ev_{session}_started
 *   session.reset      ev_{session}_reset                  (the new session)
 *   session.ended      ev_{session}_ended_{reason}_{ended_at}
 *   session.finalized  ev_{session}_finalized              (finalizing reasons only)
 * so writing the same event twice is a no-op (ON CONFLICT DO NOTHING): exactly one
 * finalized event per session whichever path ended it, and an end found out of
 * band (a row ended by SQL) produces its events once when the gateway notices it.
 */
import { and, eq, lte, sql } from "drizzle-orm";
import { exec, query, selectRows, selectRowsSql, type Database, type Statement } from "./client";
import { events, type EventRow } from "./schema";
import { FINALIZING_SQL, RECOVERABLE_SQL } from "./sql-lists";

export type EventType = "session.started" | "session.ended" | "session.finalized" | "session.reset";

/** The status an event row starts in: nobody to tell when no hook URL is configured. */
export type InitialStatus = "pending" | "skipped";

interface EventSpec {
  type: EventType;
  id: string;
  reason: string;
  where: string;
  extra: string;
}

const ENVELOPE = (spec: EventSpec) =>
  `json_object('id', ${spec.id}, 'type', '${spec.type}', 'session_id', id, 'session_key', session_key,
     'reason', ${spec.reason}, 'occurred_at', ?, ${spec.extra})`;

function syncEvent(spec: EventSpec, sessionId: string, now: number, status: InitialStatus): Statement<number> {
  return exec(
    `INSERT INTO events (id, type, session_id, session_key, reason, occurred_at, payload, status, next_attempt_at, created_at)
      SELECT ${spec.id}, '${spec.type}', id, session_key, ${spec.reason}, ?, ${ENVELOPE(spec)}, ?, ?, ?
        FROM sessions WHERE id = ? AND ${spec.where}
      ON CONFLICT DO NOTHING`,
    now,
    now,
    status,
    status === "pending" ? now : null,
    now,
    sessionId,
  );
}

const STARTED: EventSpec = {
  type: "session.started",
  id: `'ev_' || id || '_started'`,
  reason: `COALESCE(reset_reason, CASE WHEN parent_session_id IS NOT NULL THEN 'compression' END)`,
  where: `1 = 1`,
  extra: `'parent_session_id', parent_session_id, 'started_at', started_at`,
};

const RESET: EventSpec = {
  type: "session.reset",
  id: `'ev_' || id || '_reset'`,
  reason: `reset_reason`,
  where: `previous_session_id IS NOT NULL AND parent_session_id IS NULL`,
  extra: `'previous_session_id', previous_session_id, 'had_activity', json(CASE WHEN reset_had_activity THEN 'true' ELSE 'false' END), 'started_at', started_at`,
};

const ENDED: EventSpec = {
  type: "session.ended",
  id: `'ev_' || id || '_ended_' || end_reason || '_' || ended_at`,
  reason: `end_reason`,
  where: `end_reason IS NOT NULL`,
  extra: `'started_at', started_at, 'ended_at', ended_at, 'last_active_at', last_active_at,
     'message_count', message_count, 'recoverable', json(CASE WHEN end_reason IN (${RECOVERABLE_SQL}) THEN 'true' ELSE 'false' END)`,
};

const FINALIZED: EventSpec = {
  type: "session.finalized",
  id: `'ev_' || id || '_finalized'`,
  reason: `end_reason`,
  where: `end_reason IN (${FINALIZING_SQL})`,
  extra: `'started_at', started_at, 'ended_at', ended_at, 'message_count', message_count`,
};

/** The events of a session that has just started (and of the reset it stands for). */
export function startedEvents(sessionId: string, now: number, status: InitialStatus): Statement<number>[] {
  return [syncEvent(STARTED, sessionId, now, status), syncEvent(RESET, sessionId, now, status)];
}

/**
 * The events of a session as it stands now, if it has ended: ended, and finalized
 * when its reason finalizes. A row ended by SQL without `ended_at` gets it first
 * (the time the gateway noticed), so the ended event's id is stable.
 */
export function endedEvents(
  sessionId: string,
  now: number,
  status: InitialStatus,
): [Statement<number>, Statement<number>, Statement<number>] {
  return [
    exec(
      `UPDATE sessions SET ended_at = ? WHERE id = ? AND end_reason IS NOT NULL AND ended_at IS NULL`,
      now,
      sessionId,
    ),
    syncEvent(ENDED, sessionId, now, status),
    syncEvent(FINALIZED, sessionId, now, status),
  ];
}

/**
 * Events written in one batch share `created_at`; they are listed and delivered
 * in the order their changes happened: started, reset, ended, finalized.
 */
const LIFECYCLE_ORDER = sql`CASE ${events.type} WHEN 'session.started' THEN 0 WHEN 'session.reset' THEN 1 WHEN 'session.ended' THEN 2 ELSE 3 END`;

export function selectSessionEvents(db: Database, sessionId: string): Statement<EventRow[]> {
  return selectRows(
    events,
    db.q
      .select()
      .from(events)
      .where(eq(events.sessionId, sessionId))
      .orderBy(events.createdAt, LIFECYCLE_ORDER, events.id),
  );
}

export function selectEvent(id: string): Statement<EventRow[]> {
  return selectRowsSql(events, `SELECT * FROM events WHERE id = ?`, id);
}

/** Pending events of one session that are due now, oldest first. */
export function selectDueSessionEvents(db: Database, sessionId: string, now: number): Statement<EventRow[]> {
  return selectRows(
    events,
    db.q
      .select()
      .from(events)
      .where(and(eq(events.sessionId, sessionId), eq(events.status, "pending"), lte(events.nextAttemptAt, now)))
      .orderBy(events.createdAt, LIFECYCLE_ORDER, events.id),
  );
}

/** The earliest retry still pending for one session, if any. */
export function selectNextSessionEventAt(sessionId: string): Statement<{ next: number | null }[]> {
  return query(
    `SELECT MIN(next_attempt_at) AS next FROM events WHERE session_id = ? AND status = 'pending'`,
    sessionId,
  );
}

/** Pending events anywhere whose attempt is overdue (the sweep), served by events_due. */
export function selectOverdueEvents(db: Database, before: number, limit: number): Statement<EventRow[]> {
  return selectRows(
    events,
    db.q
      .select()
      .from(events)
      .where(and(eq(events.status, "pending"), lte(events.nextAttemptAt, before)))
      .orderBy(events.nextAttemptAt)
      .limit(limit),
  );
}

/**
 * Takes an event for one delivery attempt: pushes its next attempt out by a lease
 * so that the sweep and the routing object never deliver it at the same moment.
 */
export function claimEvent(id: string, now: number, leaseUntil: number): Statement<number> {
  return exec(
    `UPDATE events SET next_attempt_at = ?, attempts = attempts + 1
      WHERE id = ? AND status = 'pending' AND next_attempt_at <= ?`,
    leaseUntil,
    id,
    now,
  );
}

export interface AttemptOutcome {
  status: "pending" | "sent" | "failed";
  nextAttemptAt: number | null;
  lastStatus: number | null;
  lastError: string | null;
  deliveredTo: string[];
}

export function recordEventAttempt(id: string, outcome: AttemptOutcome): Statement<number> {
  return exec(
    `UPDATE events SET status = ?, next_attempt_at = ?, last_status = ?, last_error = ?, delivered_to = ? WHERE id = ?`,
    outcome.status,
    outcome.nextAttemptAt,
    outcome.lastStatus,
    outcome.lastError,
    JSON.stringify(outcome.deliveredTo),
    id,
  );
}

/** Operator retry of a dead-lettered event: due now, attempts counted afresh. */
export function requeueEvent(id: string, now: number): Statement<number> {
  return exec(
    `UPDATE events SET status = 'pending', attempts = 0, next_attempt_at = ? WHERE id = ? AND status = 'failed'`,
    now,
    id,
  );
}
