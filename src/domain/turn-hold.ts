/**
 * Expiry waits for the turn in progress (spec invariant 6): while any run of a
 * session is unfinished, the reset policy does not end the session, so an
 * acknowledged message is never dropped by expiry. Any run, not only the current
 * one: each message is its own run (`concurrent`), and a run only superseded by a
 * newer one is not revoked and still delivers its reply. A run handed to the agent
 * and accepted (202) holds its session while its lease holds: it must be heard from
 * (accepted, a heartbeat) within RUN_LEASE_MS. A run whose hand-off is still in the
 * routing object's outbox holds it too (see `SessionRouter.leaseOf`).
 */

/** How long a run accepted with 202 may stay silent before its owner counts as vanished. */
export const RUN_LEASE_MS = 10 * 60_000;

export interface RunLeaseFields {
  createdAt: number;
  dispatchedAt: number | null;
  lastHeartbeatAt: number | null;
  finishedAt: number | null;
  revokedReason: string | null;
  failedAt: number | null;
}

/** A run is open (it may still answer) until it finishes, is revoked or fails for good. */
export function isOpenRun(run: RunLeaseFields): boolean {
  return run.finishedAt === null && run.revokedReason === null && run.failedAt === null;
}

/** When an open run's lease runs out: RUN_LEASE_MS after it was last heard from. */
export function leaseUntil(run: RunLeaseFields): number {
  return (run.lastHeartbeatAt ?? run.dispatchedAt ?? run.createdAt) + RUN_LEASE_MS;
}

export interface TurnHold {
  /** Some open run of the session is within its lease: the policy waits. */
  held: boolean;
  /** Nothing holds, and the session's current run is open past its lease: its owner vanished. */
  lapsed: boolean;
  /** The earliest lease end among the runs that hold (when to look again), else null. */
  until: number | null;
}

/**
 * Whether a session's open runs hold it: any one within its lease holds it (a
 * superseded run still answers). Only the current run's lapse counts as a vanished
 * owner: an older run gone silent does not reap a session whose turn is over.
 */
export function holdOf(
  runs: readonly (RunLeaseFields & { id: string })[],
  currentRunId: string | null,
  now: number,
): TurnHold {
  const open = runs.filter(isOpenRun);
  const leases = open.map(leaseUntil).filter((until) => until > now);
  if (leases.length > 0) return { held: true, lapsed: false, until: Math.min(...leases) };
  return { held: false, lapsed: open.some((run) => run.id === currentRunId), until: null };
}

/**
 * When to look at a session next, given its policy deadline (null: none) and its
 * open runs: the earlier of the deadline and the first lease to run out, so an
 * owner that vanishes is reaped when its lease lapses (mode `none` included); at
 * once when the current run's lease has already lapsed.
 */
export function nextLook(
  policyDeadline: number | null,
  runs: readonly (RunLeaseFields & { id: string })[],
  currentRunId: string | null,
  now: number,
): number | null {
  const hold = holdOf(runs, currentRunId, now);
  if (hold.lapsed) return now;
  if (hold.until === null) return policyDeadline;
  return policyDeadline === null ? hold.until : Math.min(policyDeadline, hold.until);
}
