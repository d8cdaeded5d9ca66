/**
 * Retry schedule for agent hand-offs, hook events and platform replies: about 1 s,
 * then doubling, capped at 5 minutes, so the first three attempts fall within 3 s
 * and never wait for the Cron Trigger.
 */
export const BACKOFF_BASE_MS = 1_000;
export const BACKOFF_CAP_MS = 5 * 60_000;

/** Delay before the attempt that follows attempt number `attempt` (1-based). */
export function backoffDelay(attempt: number, retryAfterMs: number | null = null): number {
  const exponential = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** Math.max(0, attempt - 1));
  return retryAfterMs === null ? exponential : Math.min(BACKOFF_CAP_MS, Math.max(exponential, retryAfterMs));
}
