/**
 * When the chat should next show that the agent is working (spec "Typing"): at
 * dispatch, then every 4 s on platforms whose indicator fades that fast
 * (Telegram's lasts about 5 s), for at most 10 minutes from dispatch, and never
 * for a run that is finished, revoked, failed or has lost its lease. A pure
 * function of the run's ownership, so the routing object's alarm can drive it and
 * no timer can outlive the run.
 */

/** How often a repeating indicator is sent again. */
export const TYPING_EVERY_MS = 4_000;
/** How long after dispatch an indicator may still be sent. */
export const TYPING_AT_MOST_MS = 600_000;

/**
 * `repeat`: at dispatch and every 4 s (Telegram `sendChatAction`); `once`: at
 * dispatch only (WhatsApp's read receipt with typing indicator lasts until the
 * reply or 25 s); `none`: the platform has no such call.
 */
export type TypingCadence = "repeat" | "once" | "none";

export interface TypingRun {
  /** When the run was dispatched (its hand-off staged). */
  dispatchedAt: number;
  /** When the last typing call for this run was made; null before the first. */
  lastTypingAt: number | null;
  /** The run is unfinished and still owns its session (current, not finished, revoked, failed or lapsed). */
  owns: boolean;
}

/** When the next typing call for `run` is due; null when none will ever be. */
export function nextTypingAt(run: TypingRun, cadence: TypingCadence): number | null {
  if (!run.owns || cadence === "none") return null;
  if (run.lastTypingAt === null) return run.dispatchedAt;
  if (cadence === "once") return null;
  const next = run.lastTypingAt + TYPING_EVERY_MS;
  return next <= run.dispatchedAt + TYPING_AT_MOST_MS ? next : null;
}

/** Whether a typing call for `run` is due at `now` (the alarm asks, then records `lastTypingAt = now`). */
export function typingDue(run: TypingRun, cadence: TypingCadence, now: number): boolean {
  const next = nextTypingAt(run, cadence);
  return next !== null && next <= now;
}
