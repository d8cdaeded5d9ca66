/**
 * Run ownership (spec invariant 8) as a pure function of the run's row and its
 * session's row. A run owns its session while it is the session's current run,
 * its reply has not been recorded, and nothing revoked it.
 */
export type NotOwnedReason = "finished" | "superseded" | "stopped" | "session_ended";
export type Ownership = { owns: true } | { owns: false; reason: NotOwnedReason };

/** Why a run whose session ended for `endReason` no longer owns it. */
export function revocationFor(endReason: string): NotOwnedReason {
  if (endReason === "new_command") return "superseded";
  if (endReason === "suspended") return "stopped";
  return "session_ended";
}

export interface OwnershipInputs {
  run: { id: string; finishedAt: number | null; revokedReason: string | null };
  session: { endReason: string | null; currentRunId: string | null };
}

export function ownership({ run, session }: OwnershipInputs): Ownership {
  if (run.revokedReason) return { owns: false, reason: run.revokedReason as NotOwnedReason };
  // A row ended by SQL revokes its runs too, even though nobody marked them.
  if (session.endReason !== null) return { owns: false, reason: revocationFor(session.endReason) };
  if (session.currentRunId !== run.id) return { owns: false, reason: "superseded" };
  if (run.finishedAt !== null) return { owns: false, reason: "finished" };
  return { owns: true };
}

/**
 * May this run end or rotate its session through the agent API? Only the current
 * run, finished or not (so an agent can release the session after replying).
 */
export function isCurrentRun({ run, session }: OwnershipInputs): boolean {
  return session.currentRunId === run.id && !run.revokedReason;
}
