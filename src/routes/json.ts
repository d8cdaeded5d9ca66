/** JSON shapes of rows in answers: snake_case, as the spec writes them. */
import { parseAttachmentsColumn } from "../domain/attachments";
import type { DeliveryRow, EventRow, MessageRow, RunRow, SessionRow } from "../db/schema";

const snake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** A session row with every column, snake_case (at least the spec's seven). */
export function sessionJson(row: SessionRow): Record<string, unknown> {
  return Object.fromEntries(Object.entries(row).map(([key, value]) => [snake(key), value]));
}

export function messageJson(row: MessageRow) {
  return {
    role: row.role,
    text: row.text,
    at: row.createdAt,
    attachments: parseAttachmentsColumn(row.attachments),
    // The run that carries (user) or produced (assistant) it, null while it waits; why it never ran, if so.
    run_id: row.runId,
    not_dispatched: row.notDispatched,
  };
}

export function eventJson(row: EventRow) {
  return {
    id: row.id,
    type: row.type,
    reason: row.reason,
    occurred_at: row.occurredAt,
    status: row.status,
    attempts: row.attempts,
    next_attempt_at: row.nextAttemptAt,
    last_status: row.lastStatus,
    last_error: row.lastError,
    payload: JSON.parse(row.payload) as unknown,
  };
}

export function deliveryJson(row: DeliveryRow) {
  return {
    id: row.id,
    event_id: row.eventId,
    run_id: row.runId,
    platform: row.platform,
    kind: row.kind,
    status: row.status,
    attempts: row.attempts,
    last_status: row.lastStatus,
    last_error: row.lastError,
    text: row.text,
    notice: row.notice,
    created_at: row.createdAt,
    updated_at: row.updatedAt,
  };
}

/** A run as the operator sees it (spec `runs`): its status derived from its row. */
export function runJson(row: RunRow) {
  const status = row.revokedReason
    ? "revoked"
    : row.failedAt !== null
      ? "failed"
      : row.finishedAt !== null
        ? "finished"
        : row.acceptedAt !== null
          ? "running"
          : "dispatching";
  return {
    run_id: row.id,
    status,
    attempts: row.attempts,
    last_error: row.lastError,
    revoked_reason: row.revokedReason,
    created_at: row.createdAt,
    finished_at: row.finishedAt ?? row.failedAt,
    event_id: row.eventId,
  };
}
