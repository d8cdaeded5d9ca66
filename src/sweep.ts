/**
 * The scheduled sweep (Cron Trigger, every minute): the backstop for work whose
 * routing object did not do it on time. It never ends a session itself: it asks
 * the session's routing object to look (one path for ending). Every query is
 * served by an index and reads only what is due.
 *
 * - Sessions whose `sweep_at` passed more than SWEEP_GRACE_MS ago: a deadline the
 *   object's alarm missed (its entry was forgotten, or its alarm lost), a
 *   recoverable row waiting for promotion, or a run lease that ran out (orphan
 *   reaping and cron sessions whose run vanished).
 * - Lifecycle events whose next attempt is overdue.
 * - Dedupe marks older than DEDUPE_DAYS_KEPT days.
 */
import { now as clockNow } from "./clock";
import { configOf } from "./config";
import { Database, exec } from "./db/client";
import { selectOverdueEvents } from "./db/events";
import { selectSweepDue } from "./db/sessions";
import { dayOf } from "./db/sql-lists";
import { attemptEvent } from "./hooks/deliver";
import { describe } from "./http/outbound";
import { log } from "./log";
import { routerFor } from "./routing/client";

/** Dedupe marks are kept for whole UTC days: the current one and the two before it (48 to 72 hours). */
export const DEDUPE_DAYS_KEPT = 3;
/** The routing object's own alarm gets this long to act before the sweep steps in. */
export const SWEEP_GRACE_MS = 60_000;
const BATCH = 100;

export interface SweepReport {
  sessionsChecked: number;
  eventsAttempted: number;
  failures: number;
}

export async function sweep(env: Env, scheduledTime: number = clockNow()): Promise<SweepReport> {
  const config = configOf(env);
  const db = new Database(env.DB, "background");
  const now = Math.max(scheduledTime, clockNow());
  const report: SweepReport = { sessionsChecked: 0, eventsAttempted: 0, failures: 0 };

  const [due] = await db.batch(selectSweepDue(now - SWEEP_GRACE_MS, BATCH));
  await Promise.all(
    due.map(async (row) => {
      try {
        await routerFor(env, row.session_key).checkSession(row.id);
        report.sessionsChecked += 1;
      } catch (error) {
        report.failures += 1;
        log.error("sweep: could not check session", {
          session_key: row.session_key,
          session_id: row.id,
          error: describe(error),
        });
      }
    }),
  );

  if (config.hookUrls.length > 0) {
    const [overdue] = await db.batch(selectOverdueEvents(db, now - SWEEP_GRACE_MS, BATCH));
    for (const event of overdue) {
      try {
        await attemptEvent(db, config, event, now);
        report.eventsAttempted += 1;
      } catch (error) {
        report.failures += 1;
        log.error("sweep: event attempt failed", {
          session_id: event.sessionId,
          event_id: event.id,
          error: describe(error),
        });
      }
    }
  }

  await db.batch(exec(`DELETE FROM inbound_events WHERE day < ?`, dayOf(now) - (DEDUPE_DAYS_KEPT - 1)));
  return report;
}
