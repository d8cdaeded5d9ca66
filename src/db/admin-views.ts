/** Reads for the admin page: sessions with its filters and paging, a session's runs, failed items. */
import { selectRowsSql, type Statement } from "./client";
import {
  deliveries,
  events,
  runs,
  sessions,
  type DeliveryRow,
  type EventRow,
  type RunRow,
  type SessionRow,
} from "./schema";

export interface SessionFilter {
  /** A key, or the start of one (`telegram:dm:` lists every Telegram DM). */
  key?: string;
  state?: "open" | "ended";
  reason?: string;
  platform?: string;
  /** Paging: sessions after this one (the last of the previous page) in the page's order. */
  before?: { startedAt: number; id: string };
  limit: number;
}

/** Sessions newest first, filtered as the page asks; one more than `limit` tells whether a next page exists. */
export function selectSessionPage(filter: SessionFilter): Statement<SessionRow[]> {
  const where: string[] = [];
  const params: unknown[] = [];
  if (filter.key !== undefined) {
    // A prefix test without LIKE, whose wildcards keys may hold (`%3A`).
    where.push(`substr(session_key, 1, length(?)) = ?`);
    params.push(filter.key, filter.key);
  }
  if (filter.state === "open") where.push(`end_reason IS NULL`);
  if (filter.state === "ended") where.push(`end_reason IS NOT NULL`);
  if (filter.reason !== undefined) {
    where.push(`end_reason = ?`);
    params.push(filter.reason);
  }
  if (filter.platform !== undefined) {
    where.push(`platform = ?`);
    params.push(filter.platform);
  }
  if (filter.before !== undefined) {
    where.push(`(started_at < ? OR (started_at = ? AND id < ?))`);
    params.push(filter.before.startedAt, filter.before.startedAt, filter.before.id);
  }
  const clause = where.length > 0 ? `WHERE ${where.join(" AND ")}` : "";
  return selectRowsSql(
    sessions,
    `SELECT * FROM sessions ${clause} ORDER BY started_at DESC, id DESC LIMIT ?`,
    ...params,
    filter.limit + 1,
  );
}

/** The platforms that have sessions, for the filter's choices. */
export function selectPlatforms(): Statement<{ platform: string }[]> {
  return {
    sql: `SELECT DISTINCT platform FROM sessions ORDER BY platform`,
    params: [],
    read: (result) => result.results as { platform: string }[],
  };
}

export function selectSessionRuns(sessionId: string): Statement<RunRow[]> {
  return selectRowsSql(runs, `SELECT * FROM runs WHERE session_id = ? ORDER BY created_at, id`, sessionId);
}

/** Runs whose hand-off failed for good, newest first. */
export function selectFailedRuns(limit: number): Statement<RunRow[]> {
  return selectRowsSql(runs, `SELECT * FROM runs WHERE failed_at IS NOT NULL ORDER BY failed_at DESC LIMIT ?`, limit);
}

/** Platform deliveries dead-lettered, newest first. */
export function selectFailedDeliveries(limit: number): Statement<DeliveryRow[]> {
  return selectRowsSql(
    deliveries,
    `SELECT * FROM deliveries WHERE status = 'failed' ORDER BY updated_at DESC LIMIT ?`,
    limit,
  );
}

/** Lifecycle events dead-lettered, newest first. */
export function selectFailedEvents(limit: number): Statement<EventRow[]> {
  return selectRowsSql(events, `SELECT * FROM events WHERE status = 'failed' ORDER BY created_at DESC LIMIT ?`, limit);
}

/** Platform and chat type of the given sessions (for the zone their times are shown in). */
export function selectConversations(ids: string[]): Statement<{ id: string; platform: string; chat_type: string }[]> {
  return {
    sql: `SELECT id, platform, chat_type FROM sessions WHERE id IN (SELECT value FROM json_each(?))`,
    params: [JSON.stringify(ids)],
    read: (result) => result.results as { id: string; platform: string; chat_type: string }[],
  };
}
