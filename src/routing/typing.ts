/**
 * Typing while the agent works (spec "Typing"): the chat's "working…" indicator for
 * the session's current run, at its dispatch and then, on platforms whose indicator
 * fades (Telegram), every 4 s from the routing object's one alarm, for at most 10
 * minutes from dispatch (src/domain/typing.ts). Never a timer of its own: each call
 * is made only after asking the object's own ownership state (the run's hand-off is
 * still in the outbox, or the agent accepted it and it is not over; its session is
 * the entry's), so nothing can type for a run that finished, was revoked or lost
 * its lease, and a restart cannot make it type for ever (the dispatch time is stored).
 *
 * Best effort: a failed call is logged and never retried (a late indicator is worse
 * than none), never blocks nor fails the hand-off, and is no outbox work. Its state,
 * one row per session (`typing_runs`, the newest dispatched run: the current one),
 * lives in the object's own SQLite, so it costs D1 nothing.
 */
import { configOf, effectiveEnv } from "../config";
import type { ReplyTarget } from "../domain/inbound";
import { nextTypingAt, TYPING_AT_MOST_MS, type TypingRun } from "../domain/typing";
import { describe } from "../http/outbound";
import { log } from "../log";
import { senderFor } from "../platforms";
import type { TypingSender } from "../platforms/types";
import type { EntryState } from "./entry";
import type { Outbox } from "./outbox";
import { metered } from "./outbox-table";
import type { WaitingRoom } from "./waiting";

export interface TypingDeps {
  sql: SqlStorage;
  env: Env;
  entry: EntryState;
  outbox: Outbox;
  waiting: WaitingRoom;
  /** Brings the alarm forward to `at` (AlarmPlan.armBy, the only setter). */
  armBy: (at: number, now: number) => void;
  /** Keeps the object alive for a typing call nobody awaits (ctx.waitUntil). */
  waitUntil: (work: Promise<unknown>) => void;
}

/** A run to show typing for, as its hand-off knows it. */
export interface TypingStart {
  runId: string;
  sessionId: string;
  target: ReplyTarget;
  /** The newest message the run answers (WhatsApp marks it read). */
  eventId: string;
}

interface TypingSqlRow extends Record<string, SqlStorageValue> {
  run_id: string;
  session_id: string;
  target: string;
  event_id: string;
  dispatched_at: number;
  last_typing_at: number | null;
}

export class Typing {
  /** Calls on their way, so the alarm and diagnostics can wait for them (each is bounded by its own timeout). */
  private readonly inFlight = new Set<Promise<void>>();
  /** Resolved when a run starts typing (the alarm then stops waiting for a slow drain). */
  private typingBegan: { promise: Promise<void>; resolve: () => void } | null = null;

  constructor(private readonly deps: TypingDeps) {
    deps.sql.exec(`CREATE TABLE IF NOT EXISTS typing_runs (
      session_id TEXT PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, target TEXT NOT NULL, event_id TEXT NOT NULL,
      dispatched_at INTEGER NOT NULL, last_typing_at INTEGER)`);
  }

  /**
   * The run was handed to the agent (its first attempt): it is now its session's
   * current run, so it replaces any older run of that session, and typing shows at
   * once. A retried hand-off keeps its row, so the 10 minutes count from the first.
   */
  dispatched(run: TypingStart, now: number): void {
    if (!typingSenderOf(run.target)) return;
    const known = metered(this.deps.sql, `SELECT 1 AS one FROM typing_runs WHERE run_id = ?`, run.runId);
    if (known.length > 0) return;
    this.write(
      `INSERT OR REPLACE INTO typing_runs (session_id, run_id, target, event_id, dispatched_at, last_typing_at)
        VALUES (?, ?, ?, ?, ?, NULL)`,
      run.sessionId,
      run.runId,
      JSON.stringify(run.target),
      run.eventId,
      now,
    );
    this.tick(now);
    // The hand-off may wait long for the agent (a drain re-arms only when it ends):
    // the alarm is brought forward now. Later calls come from the plan's `typingDueAt`.
    const next = this.dueAt();
    if (next !== null) this.deps.armBy(next, now);
    this.typingBegan?.resolve();
    this.typingBegan = null;
  }

  /** The run is over (its reply recorded, or it failed for good): no call for it any more. */
  stop(runId: string): void {
    this.write(`DELETE FROM typing_runs WHERE run_id = ?`, runId);
  }

  /** The session ended (a command, the policy, an operator, the agent, a reaped lease): its runs are revoked. */
  sessionEnded(sessionId: string): void {
    this.write(`DELETE FROM typing_runs WHERE session_id = ?`, sessionId);
  }

  /** A rotation: the current run goes on in the continuation, and so does its typing. */
  moveSession(from: string, to: string): void {
    this.write(`UPDATE typing_runs SET session_id = ? WHERE session_id = ?`, to, from);
  }

  /** When the next typing call is due, for the alarm plan (null: none will be). */
  dueAt(): number | null {
    const due = this.rows()
      .map((row) => this.nextOf(row))
      .filter((at): at is number => at !== null);
    return due.length === 0 ? null : Math.min(...due);
  }

  /**
   * Makes the calls due at `now` (the alarm, and dispatch). Each row is asked again
   * whether its run owns its session; one that does not is skipped (it goes with its
   * run, or with its cap). A row past its 10 minutes, or whose platform typed once
   * already, is forgotten: no call can be due for it again.
   */
  tick(now: number): void {
    for (const row of this.rows()) {
      const sender = typingSenderOf(targetOf(row));
      // The cap counts from the stored dispatch time, so it holds after a restart too.
      if (!sender || now > row.dispatched_at + TYPING_AT_MOST_MS || scheduleOf(row, sender, true) === null) {
        this.stop(row.run_id);
        continue;
      }
      const next = scheduleOf(row, sender, this.owns(row));
      if (next === null || next > now) continue;
      this.send(row, sender, now);
      if (scheduleOf({ ...row, last_typing_at: now }, sender, true) === null) this.stop(row.run_id);
    }
  }

  /** Whether any run is being shown typing (the alarm then must come back in 4 s). */
  active(): boolean {
    return this.dueAt() !== null;
  }

  /**
   * Resolves as soon as a run is typing: at once when one is, else when a hand-off
   * begins to (one promise at a time, shared by whoever waits).
   */
  whenTyping(): Promise<void> {
    if (this.active()) return Promise.resolve();
    if (!this.typingBegan) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.typingBegan = { promise, resolve };
    }
    return this.typingBegan.promise;
  }

  /** Resolves once no typing call is on its way. */
  async settled(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  /**
   * The run's ownership, from what the object keeps: its session is the entry's, and
   * its hand-off is still in the outbox (being made, or retried) or the agent
   * accepted it and it is not over (reply, revocation, lease lapse take it off).
   */
  private owns(row: TypingSqlRow): boolean {
    const { entry, outbox, waiting } = this.deps;
    if (!entry.isLive(row.session_id)) return false;
    return outbox.get(row.run_id, "run") !== null || waiting.accepted(row.session_id).includes(row.run_id);
  }

  /** The next call due for a row, with its run's ownership as asked now (null: none). */
  private nextOf(row: TypingSqlRow): number | null {
    const sender = typingSenderOf(targetOf(row));
    return sender ? scheduleOf(row, sender, this.owns(row)) : null;
  }

  /** One call, recorded as made before it leaves (a failure is not retried), awaited by nobody on the hand-off. */
  private send(row: TypingSqlRow, sender: TypingSender, now: number): void {
    const target = targetOf(row);
    this.write(`UPDATE typing_runs SET last_typing_at = ? WHERE run_id = ?`, now, row.run_id);
    const fields = { session_id: row.session_id, run_id: row.run_id, platform: target.platform };
    const call = sender
      .send(target, row.event_id, configOf(this.deps.env), effectiveEnv(this.deps.env))
      .then((outcome) => {
        if (!outcome.ok)
          log.warn("typing call failed (not retried)", { ...fields, status: outcome.status, error: outcome.error });
      })
      .catch((error: unknown) => log.warn("typing call failed (not retried)", { ...fields, error: describe(error) }))
      .finally(() => this.inFlight.delete(call));
    this.inFlight.add(call);
    this.deps.waitUntil(call);
  }

  /**
   * The table as last read. Only this unit writes it, and each write drops the copy:
   * the plan asks `dueAt` on every re-arm, and on a platform without typing (or
   * between turns) that would be a read of an empty table per message.
   */
  private cached: TypingSqlRow[] | null = null;

  private rows(): TypingSqlRow[] {
    this.cached ??= metered<TypingSqlRow>(
      this.deps.sql,
      `SELECT session_id, run_id, target, event_id, dispatched_at, last_typing_at FROM typing_runs`,
    );
    return this.cached;
  }

  /** Every write goes through here, so the copy `rows` keeps is never stale. */
  private write(query: string, ...params: SqlStorageValue[]): void {
    this.cached = null;
    metered(this.deps.sql, query, ...params);
  }
}

function targetOf(row: TypingSqlRow): ReplyTarget {
  return JSON.parse(row.target) as ReplyTarget;
}

/** The domain schedule (src/domain/typing.ts) of one row. */
function scheduleOf(row: TypingSqlRow, sender: TypingSender, owns: boolean): number | null {
  const run: TypingRun = { dispatchedAt: row.dispatched_at, lastTypingAt: row.last_typing_at, owns };
  return nextTypingAt(run, sender.cadence);
}

function typingSenderOf(target: ReplyTarget): TypingSender | null {
  return senderFor(target.platform)?.typing ?? null;
}
