/**
 * The one clock seam. Every decision about time (activity, deadlines, backoff,
 * dedupe days) reads `now()`, so tests move time with `vi.setSystemTime()` instead
 * of sleeping, and the worker and its Durable Objects always agree.
 */
export function now(): number {
  return Date.now();
}
