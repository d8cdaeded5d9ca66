/**
 * Integer counters since the isolate started (spec `GET /admin/metrics`). Each
 * isolate counts what it ran itself; in production the worker and every routing
 * object may run in different isolates, so the docs describe how to aggregate.
 */
import type { EndReason } from "./domain/end-reasons";

/** Which path a D1 statement ran on: the one that answers a webhook, or any other. */
export type D1Path = "ingress" | "background";

export interface Counters {
  messages_routed: number;
  duplicates: number;
  sessions_created: number;
  sessions_ended: Partial<Record<EndReason, number>>;
  events_delivered: number;
  events_failed: number;
  /** Runs whose hand-off failed for good (a refusing 4xx, or a day of retries). */
  runs_failed: number;
  /** Replies and command answers whose delivery was dead-lettered (failed for good). */
  deliveries_failed: number;
  d1_queries: number;
  d1_rows_read: number;
  d1_rows_written: number;
  d1_batches_ingress: number;
  d1_queries_ingress: number;
  d1_rows_read_ingress: number;
  d1_rows_written_ingress: number;
  /** Rows of the routing objects' own SQLite storage (billed like D1 rows). */
  do_rows_read: number;
  do_rows_written: number;
}

function zero(): Counters {
  return {
    messages_routed: 0,
    duplicates: 0,
    sessions_created: 0,
    sessions_ended: {},
    events_delivered: 0,
    events_failed: 0,
    runs_failed: 0,
    deliveries_failed: 0,
    d1_queries: 0,
    d1_rows_read: 0,
    d1_rows_written: 0,
    d1_batches_ingress: 0,
    d1_queries_ingress: 0,
    d1_rows_read_ingress: 0,
    d1_rows_written_ingress: 0,
    do_rows_read: 0,
    do_rows_written: 0,
  };
}

export const metrics: Counters = zero();

/** Adds D1's own `meta` of one batch to the counters. */
export function recordD1Batch(path: D1Path, metas: readonly { rows_read?: number; rows_written?: number }[]): void {
  let read = 0;
  let written = 0;
  for (const meta of metas) {
    read += meta.rows_read ?? 0;
    written += meta.rows_written ?? 0;
  }
  metrics.d1_queries += metas.length;
  metrics.d1_rows_read += read;
  metrics.d1_rows_written += written;
  if (path === "ingress") {
    metrics.d1_batches_ingress += 1;
    metrics.d1_queries_ingress += metas.length;
    metrics.d1_rows_read_ingress += read;
    metrics.d1_rows_written_ingress += written;
  }
}

/** Adds one routing-object storage statement's rows to the counters. */
export function recordObjectStorage(read: number, written: number): void {
  metrics.do_rows_read += read;
  metrics.do_rows_written += written;
}

export function countEnded(reason: EndReason): void {
  metrics.sessions_ended[reason] = (metrics.sessions_ended[reason] ?? 0) + 1;
}

/**
 * The counters, plus the D1 and object rows per 1,000 routed messages (integers,
 * like every other figure here; divide by 1,000 for rows per message).
 */
export function snapshot(): Counters & { per_1000_messages: Record<string, number> } {
  const routed = metrics.messages_routed;
  const per1000 = (value: number) => (routed === 0 ? 0 : Math.round((value * 1000) / routed));
  return {
    ...metrics,
    sessions_ended: { ...metrics.sessions_ended },
    per_1000_messages: {
      d1_batches_ingress: per1000(metrics.d1_batches_ingress),
      d1_queries_ingress: per1000(metrics.d1_queries_ingress),
      d1_rows_read_ingress: per1000(metrics.d1_rows_read_ingress),
      d1_rows_written_ingress: per1000(metrics.d1_rows_written_ingress),
      d1_queries: per1000(metrics.d1_queries),
      d1_rows_read: per1000(metrics.d1_rows_read),
      d1_rows_written: per1000(metrics.d1_rows_written),
      do_rows_read: per1000(metrics.do_rows_read),
      do_rows_written: per1000(metrics.do_rows_written),
    },
  };
}

/** Tests: start counting from zero. */
export function resetMetrics(): void {
  Object.assign(metrics, zero());
}
