/**
 * Expiry waits for the turn in progress (spec invariant 6): while a session's
 * current run is unfinished, the reset policy does not end the session, so an
 * acknowledged message is never dropped by expiry. A run handed to the agent and
 * accepted (202) holds its session while its lease holds: it must be heard from
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
