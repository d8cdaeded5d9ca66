/**
 * The end reasons of the spec's table. One place decides which reasons may be
 * reopened, which finalize, and which produce a reset notice, so that no path
 * (alarm, message, command, agent, operator, sweep) can disagree with another.
 */
export const END_REASONS = [
  "idle",
  "daily",
  "suspended",
  "new_command",
  "compression",
  "cron_complete",
  "admin",
  "agent_close",
  "orphan_reap",
] as const;

export type EndReason = (typeof END_REASONS)[number];

/** Reasons the reset policy produces when a session expires. */
export type PolicyReason = "idle" | "daily";

/** A row ended for one of these may be reopened (same id) while its policy has not expired. */
export const RECOVERABLE_REASONS: readonly EndReason[] = ["agent_close", "orphan_reap"];

/** Ending for one of these yields exactly one `session.finalized`. */
export const FINALIZING_REASONS: readonly EndReason[] = END_REASONS.filter(
  (reason) => reason !== "compression" && !RECOVERABLE_REASONS.includes(reason),
);

/** Auto-resets whose replacement session carries a notice in its first reply. */
const NOTICE_REASONS: readonly EndReason[] = ["idle", "daily", "suspended"];

export function isEndReason(value: unknown): value is EndReason {
  return typeof value === "string" && (END_REASONS as readonly string[]).includes(value);
}

export function isRecoverable(reason: EndReason | null): boolean {
  return reason !== null && RECOVERABLE_REASONS.includes(reason);
}

export function finalizes(reason: EndReason): boolean {
  return FINALIZING_REASONS.includes(reason);
}

/**
 * Spec invariant 10: the first reply of a session that replaced an auto-reset one
 * carries a notice when the old session had activity; `suspended` always does.
 */
export function noticeFor(reason: EndReason, hadActivity: boolean): EndReason | null {
  if (!NOTICE_REASONS.includes(reason)) return null;
  if (reason === "suspended" || hadActivity) return reason;
  return null;
}
