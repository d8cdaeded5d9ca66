/** SQL list literals of end reasons, derived from the one table in domain/end-reasons. */
import { FINALIZING_REASONS, RECOVERABLE_REASONS } from "../domain/end-reasons";

const list = (values: readonly string[]) => values.map((v) => `'${v}'`).join(", ");

export const RECOVERABLE_SQL = list(RECOVERABLE_REASONS);
export const FINALIZING_SQL = list(FINALIZING_REASONS);

/** D1 cannot bind -Infinity: the "live since" of a policy that never expires. */
export function sqlTime(t: number): number {
  return Number.isFinite(t) ? t : Number.MIN_SAFE_INTEGER;
}

/** The UTC day of `t`, the first part of a dedupe mark's key. */
export function dayOf(t: number): number {
  return Math.floor(t / 86_400_000);
}
