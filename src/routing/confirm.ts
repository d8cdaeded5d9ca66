/**
 * Confirming a staged hand-off before it is handed over: the run item as it stands
 * once the route call that staged it is done, and, for one staged before this object
 * restarted, D1's word that its message was stored (and in which session).
 */
import { selectRun } from "../db/runs";
import { selectDedupe } from "../db/sessions";
import { log } from "../log";
import type { RouterContext } from "./context";
import type { RunWork } from "./work";

/**
 * The run as it stands once its storing has finished (under the lock, so a route
 * call that staged it is done): its payload read again, since storing may have
 * rewritten it (a fresh session changes `is_new` and `reset`). A run staged before
 * this object restarted is confirmed against D1 (`sessionStoredIn`), or dropped.
 */
export async function confirmStaged(ctx: RouterContext, work: RunWork): Promise<RunWork | null> {
  const { outbox, confirmedRuns } = ctx;
  return ctx.mutex.run(async () => {
    const item = outbox.get(work.runId, "run");
    const current = item?.payload;
    if (!item || !current) return null;
    if (confirmedRuns.has(work.runId)) return current;
    // A run dispatched from the waiting list carries messages D1 had already stored
    // (each was confirmed before it left the list): nothing to ask again.
    if (current.messages) {
      confirmedRuns.add(work.runId);
      return current;
    }
    const storedIn = await sessionStoredIn(ctx, work.runId, current.message);
    if (storedIn === null) {
      log.warn("hand-off dropped: D1 has no stored message for it", {
        session_key: current.message.sessionKey,
        run_id: work.runId,
        event_id: current.message.eventId,
      });
      return null;
    }
    // A rotation moved the hand-off on from the session its message was stored in.
    const moved = current.movedFrom?.includes(storedIn) ?? false;
    const confirmed = moved ? current : { ...current, sessionId: storedIn };
    // Kept as confirmed: once cached, later attempts (a retried hand-off) read the
    // stored payload, and a session predicted from a stale entry would revoke the run.
    if (current.sessionId !== storedIn) {
      const again = outbox.get(work.runId, "run");
      if (again) outbox.checkpoint(again, { payload: confirmed });
    }
    confirmedRuns.add(work.runId);
    return confirmed;
  });
}

/**
 * The session D1 stored this run's message in, or null when D1 has no record of it
 * for this run (its batch never landed, or the message went out with another run).
 */
async function sessionStoredIn(ctx: RouterContext, runId: string, message: RunWork["message"]): Promise<string | null> {
  const { db } = ctx;
  // The mark is asked on the day it was written (the message's), not today's: a
  // hand-off retried past midnight, or by a late alarm, still finds it.
  const [[mark], [run]] = await db.batch(
    selectDedupe(message.platform, message.eventId, message.receivedAt),
    selectRun(db, runId),
  );
  // The message went out with another run (or is a command's).
  if (mark && (mark.run_id !== runId || !mark.session_id)) return null;
  // Only a stored message's hand-off has a run row (written at its first attempt,
  // kept for an operator's retry): it confirms the item even once the sweep removed
  // the mark, and names the session the run belongs to now (a rotation moved it on
  // from the one its message was stored in). Whether the run is still owed is for
  // Turns.beginRun to say.
  if (run) return run.sessionId;
  return mark?.session_id ?? null;
}
