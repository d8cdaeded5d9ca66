/** Statements on `deliveries`, the record of every outbound platform call. */
import { eq } from "drizzle-orm";
import { exec, selectRows, selectRowsSql, type Database, type Statement } from "./client";
import { deliveries, type DeliveryRow } from "./schema";

export interface NewDelivery {
  id: string;
  sessionId: string;
  runId: string | null;
  eventId: string | null;
  platform: string;
  kind: "reply" | "progress" | "command";
  status: "pending" | "sent" | "failed";
  attempts: number;
  lastStatus: number | null;
  lastError: string | null;
  text: string;
  notice: string | null;
  target: string;
  createdAt: number;
}

/** Inserts a delivery row, only if its session exists (so it follows a session insert in the same batch). */
export function insertDelivery(d: NewDelivery): Statement<number> {
  return exec(
    `INSERT INTO deliveries (id, session_id, run_id, event_id, platform, kind, status, attempts, last_status, last_error,
        text, notice, target, created_at, updated_at)
      SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)`,
    d.id,
    d.sessionId,
    d.runId,
    d.eventId,
    d.platform,
    d.kind,
    d.status,
    d.attempts,
    d.lastStatus,
    d.lastError,
    d.text,
    d.notice,
    d.target,
    d.createdAt,
    d.createdAt,
    d.sessionId,
  );
}

export function selectDelivery(id: string): Statement<DeliveryRow[]> {
  return selectRowsSql(deliveries, `SELECT * FROM deliveries WHERE id = ?`, id);
}

/** The deliveries named by an id: the delivery's own, or the inbound event's they answer, newest first. */
export function selectDeliveriesFor(id: string): Statement<DeliveryRow[]> {
  return selectRowsSql(
    deliveries,
    `SELECT * FROM deliveries WHERE id = ?
      UNION ALL SELECT * FROM deliveries WHERE event_id = ? AND id <> ?
      ORDER BY created_at DESC, id DESC LIMIT 20`,
    id,
    id,
    id,
  );
}

export function selectSessionDeliveries(db: Database, sessionId: string): Statement<DeliveryRow[]> {
  return selectRows(
    deliveries,
    db.q
      .select()
      .from(deliveries)
      .where(eq(deliveries.sessionId, sessionId))
      .orderBy(deliveries.createdAt, deliveries.id),
  );
}

export interface DeliveryAttempt {
  status: "pending" | "sent" | "failed";
  lastStatus: number | null;
  lastError: string | null;
}

/** Records one attempt; a row already settled (sent or failed) is left as it is. */
export function recordDeliveryAttempt(id: string, attempt: DeliveryAttempt, now: number): Statement<number> {
  return exec(
    `UPDATE deliveries SET status = ?, attempts = attempts + 1, last_status = ?, last_error = ?, updated_at = ?
      WHERE id = ? AND status = 'pending'`,
    attempt.status,
    attempt.lastStatus,
    attempt.lastError,
    now,
    id,
  );
}

/** An operator retry of a dead-lettered delivery: pending again, attempts counted afresh. */
export function requeueDelivery(id: string, now: number): Statement<number> {
  return exec(
    `UPDATE deliveries SET status = 'pending', attempts = 0, last_error = NULL, last_status = NULL, updated_at = ?
      WHERE id = ? AND status = 'failed'`,
    now,
    id,
  );
}
