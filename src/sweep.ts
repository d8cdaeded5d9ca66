/**
 * The scheduled sweep (Cron Trigger, every minute): the backstop for work whose
 * routing object did not do it on time. Every query is served by an index and
 * reads only what is due.
 */
import { configOf } from "./config";
import { Database, exec } from "./db/client";
import { dayOf } from "./db/sql-lists";
import { selectOverdueEvents } from "./db/events";
import { attemptEvent } from "./hooks/deliver";
import { now as clockNow } from "./clock";

/** Dedupe marks are kept for whole UTC days: the current one and the two before it (48 to 72 hours). */
export const DEDUPE_DAYS_KEPT = 3;
const BATCH = 100;

export async function sweep(env: Env, scheduledTime: number = clockNow()): Promise<void> {
  const config = configOf(env);
  const db = new Database(env.DB, "background");
  const now = Math.max(scheduledTime, clockNow());
  await db.batch(exec(`DELETE FROM inbound_events WHERE day < ?`, dayOf(now) - (DEDUPE_DAYS_KEPT - 1)));
  if (config.hookUrls.length > 0) {
    const [overdue] = await db.batch(selectOverdueEvents(db, now, BATCH));
    for (const event of overdue) await attemptEvent(db, config, event, now);
  }
}
