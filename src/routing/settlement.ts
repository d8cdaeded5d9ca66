/**
 * Settlement and leases: the reset policy applied to one of this key's sessions
 * against D1's own last activity (spec invariants 3 and 6), the turn in progress
 * that holds a session open, and the one path every explicit end takes.
 */
import { type Statement } from "../db/client";
import { endedEvents } from "../db/events";
import { markEndedNotDispatched } from "../db/overlap";
import { markRunAccepted, revokeRuns, selectOpenRuns } from "../db/runs";
import type { SessionRow } from "../db/schema";
import { clearSweepAt, endLive, promoteExpired, selectSession, setSweepAt } from "../db/sessions";
import { isCronSession } from "../domain/cron";
import { isRecoverable, type EndReason } from "../domain/end-reasons";
import { deadline, expiryReason, liveSince } from "../domain/reset-policy";
import { holdOf, RUN_LEASE_MS } from "../domain/turn-hold";
import { countEnded } from "../metrics";
import type { AlarmPlan } from "./alarm";
import { eventStatusFor, policyFor, revokedAndEnded, stageEvents, type RouterContext } from "./context";
import type { RoutedMessage } from "../domain/inbound";
import type { OutboxItem } from "./outbox-table";
import { dropEnded, type Queue } from "./queue";

/** Who holds a live session's turn, and until when. */
export interface Lease {
  held: boolean;
  lapsed: boolean;
  until: number | null;
}

export class Settlement {
  constructor(
    private readonly ctx: RouterContext,
    private readonly alarm: AlarmPlan,
    private readonly queue: Queue,
  ) {}

  /**
   * The alarm's deadline check (spec invariant 6): re-read the live session, end it
   * by its policy when due, otherwise learn its current deadline.
   */
  async settleLiveSession(now: number): Promise<void> {
    const { entry, db } = this.ctx;
    const current = entry.entry;
    if (!current) {
      entry.setDeadline(null);
      return;
    }
    const known = entry.liveDeadline;
    if (known !== undefined && (known === null || known > now)) return;
    const [rows] = await db.batch(selectSession(db, current.sessionId));
    const row = rows[0];
    entry.setDeadline(row ? await this.settleRow(row, now) : null);
    this.alarm.settled();
  }

  /** Reads one session of this key and settles it (a no-op for an unknown id); the entry learns its next look. */
  async settleById(sessionId: string, now: number): Promise<number | null> {
    const { db } = this.ctx;
    const [rows] = await db.batch(selectSession(db, sessionId));
    const row = rows[0];
    if (!row) return null;
    return this.settleAndLearn(row, now);
  }

  /** settleRow, and the entry learns the next look when the row is its session. */
  async settleAndLearn(row: SessionRow, now: number): Promise<number | null> {
    const next = await this.settleRow(row, now);
    this.ctx.entry.learnt(row.id, next);
    return next;
  }

  /**
   * Applies the policy to one row of this key against its real last activity: ends
   * it when expired (live or recoverable), ends a live one whose run owner vanished
   * (its lease ran out), writes the events of an end found out of band, and
   * otherwise records when to look at it next. Returns that time (null: never).
   */
  async settleRow(row: SessionRow, now: number): Promise<number | null> {
    const { db } = this.ctx;
    const policy = policyFor(this.ctx, row.platform, row.chatType);
    const reason = row.endReason as EndReason | null;
    if (reason !== null && !isRecoverable(reason)) {
      await db.batch(
        revokeRuns(row.id),
        markEndedNotDispatched(row.id),
        clearSweepAt(row.id),
        ...endedEvents(row.id, now, eventStatusFor(this.ctx)),
      );
      dropEnded(this.ctx, row.id);
      stageEvents(this.ctx, row.id, now);
      return null;
    }
    // Messages waiting behind a run that is over (its lease lapsed, say) get their run
    // first: then that run holds the session, and the session is not reaped under them.
    if (reason === null && this.ctx.waiting.count(row.id) > 0) await this.queue.pump(now);
    const expired = expiryReason(policy, row.lastActiveAt, now);
    // Expiry waits for the turn in progress (invariant 6): look again when it is over.
    const held = expired && reason === null ? await this.leaseOf(row, now) : null;
    if (held?.held) {
      // Held by a lease, a hand-off, or messages waiting for their run (a debounce
      // window's end): look again then, not at once and over and over.
      const next = held.until ?? this.outboxRunDue(row.id) ?? this.queue.dueAt(now) ?? now + 1;
      if (row.sweepAt !== next) await db.batch(setSweepAt(row.id, next));
      return next;
    }
    if (expired) {
      const [promoted] = await db.batch(
        promoteExpired(row.id, expired, liveSince(policy, now), now),
        ...revokedAndEnded(this.ctx, row.id, now),
      );
      if (promoted === 1) countEnded(expired);
      dropEnded(this.ctx, row.id);
      stageEvents(this.ctx, row.id, now);
      return null;
    }
    let next = deadline(policy, row.lastActiveAt);
    if (reason === null) {
      const lease = await this.leaseOf(row, now);
      if (lease.lapsed) {
        const ending: EndReason = isCronSession(row) ? "cron_complete" : "orphan_reap";
        await this.endNow(row.id, ending, now);
        if (ending === "cron_complete") return null;
        // Reaped rows stay recoverable: look again at their policy deadline.
        await db.batch(setSweepAt(row.id, next));
        return next;
      }
      if (lease.until !== null) next = next === null ? lease.until : Math.min(next, lease.until);
    }
    if (row.sweepAt !== next) await db.batch(setSweepAt(row.id, next));
    return next;
  }

  /**
   * Who owns a live session's turn (spec "orphan_reap", and invariant 6: the turn in
   * progress holds the session): the gateway while a hand-off is in its outbox (being
   * retried, or its reply being recorded); otherwise any run of the session while it
   * is open (not finished, revoked or failed for good) and has been heard from
   * (accepted, or a heartbeat) within RUN_LEASE_MS: a superseded run still answers.
   * A current run silent for longer has vanished (`lapsed`, see `holdOf`). A cron
   * session with no run left has vanished too. `exceptRunId`: a run staged by the
   * request asking, which holds nothing yet.
   */
  async leaseOf(
    row: SessionRow,
    now: number,
    exceptRunId: string | null = null,
    exceptEventId: string | null = null,
  ): Promise<Lease> {
    if (this.outboxRunDue(row.id, exceptRunId) !== null) return { held: true, lapsed: false, until: null };
    const [runs] = await this.ctx.db.batch(selectOpenRuns(row.id));
    const hold = holdOf(runs, row.currentRunId, now);
    // An acknowledged message waiting for its run holds the session too (it is never
    // dropped by expiry); `until` still says when the run it waits behind lapses.
    if (this.ctx.waiting.count(row.id) > (exceptEventId ? this.waitingAs(row.id, exceptEventId) : 0))
      return { held: true, lapsed: false, until: hold.until };
    // A cron session with no open run left has vanished too.
    if (!hold.held && !hold.lapsed && isCronSession(row)) return { ...hold, lapsed: true };
    return hold;
  }

  /** 1 when `eventId` is one of the session's waiting messages (the request asking staged it), else 0. */
  private waitingAs(sessionId: string, eventId: string): number {
    return this.ctx.waiting.all().some((row) => row.sessionId === sessionId && row.eventId === eventId) ? 1 : 0;
  }

  /** The earliest due time of a hand-off of this session still in the outbox, if any. */
  outboxRunDue(sessionId: string, exceptRunId: string | null = null): number | null {
    const due = this.ctx.outbox
      .all("run")
      .filter((item) => item.id !== exceptRunId && item.payload.sessionId === sessionId)
      .map((item) => item.dueAt);
    return due.length === 0 ? null : Math.min(...due);
  }

  /**
   * Ends a live session for `reason` with its events and run revocations, first
   * reason wins. The one path every explicit end takes (operator, agent, cron,
   * orphan reaping).
   */
  async endNow(
    sessionId: string,
    reason: EndReason,
    now: number,
    alongside: Statement<number>[] = [],
  ): Promise<{ changed: boolean; row: SessionRow | null }> {
    const { db, entry } = this.ctx;
    const [changed, , , , , rows] = await db.batch(
      endLive(sessionId, reason, isRecoverable(reason), now),
      // Spelt out (not revokedAndEnded) so the batch keeps its tuple type for `rows`.
      revokeRuns(sessionId),
      ...endedEvents(sessionId, now, eventStatusFor(this.ctx)),
      selectSession(db, sessionId),
      markEndedNotDispatched(sessionId),
      ...alongside,
    );
    const row = rows[0] ?? null;
    // The batch writes the events of any ended row that lacks them (one ended out of
    // band, by SQL), changed here or not: they are delivered either way.
    if (row && row.endReason !== null) {
      dropEnded(this.ctx, sessionId);
      stageEvents(this.ctx, sessionId, now);
    }
    if (changed === 1 && row) {
      countEnded(reason);
      entry.learnt(
        sessionId,
        isRecoverable(reason) ? deadline(policyFor(this.ctx, row.platform, row.chatType), row.lastActiveAt) : null,
      );
    }
    return { changed: changed === 1, row };
  }

  /** The agent took the turn and answers later (202): expect to hear from it within the lease. */
  async expectHeartbeats(sessionId: string, runId: string, carried: RoutedMessage[], now: number): Promise<void> {
    const { db, entry } = this.ctx;
    // The lease runs from the acceptance, not from the first attempt (which may be
    // long ago when the agent was down): a late acceptance is not a vanished owner.
    const heard = markRunAccepted(runId, now);
    // Unfinished until its reply, revocation or lease lapse: messages arriving meanwhile
    // wait (queue mode). Recorded before the batch, so a restart after it still holds them.
    this.ctx.waiting.accept(runId, sessionId, carried, now + RUN_LEASE_MS);
    let changed: number;
    if (!entry.isLive(sessionId)) [changed] = await db.batch(heard);
    else {
      const until = now + RUN_LEASE_MS;
      const known = entry.liveDeadline;
      const next = known === undefined || known === null ? until : Math.min(known, until);
      entry.setDeadline(next);
      [changed] = await db.batch(heard, setSweepAt(sessionId, next));
    }
    // The run was already over (its reply came first): it holds nothing back.
    if (changed === 0) this.ctx.waiting.over(runId);
  }

  /**
   * The `check` handler: a recoverable row this key no longer routes to (a `/new`
   * replaced it) is still promoted when its deadline passes, and finalizes then: its
   * check stays in the outbox until the row is a boundary.
   */
  async processCheck(item: OutboxItem<"check">, now: number): Promise<void> {
    const { db, entry, mutex, outbox } = this.ctx;
    await mutex.run(async () => {
      const [rows] = await db.batch(selectSession(db, item.payload.sessionId));
      const row = rows[0];
      const next = row ? await this.settleRow(row, now) : null;
      // A row gone from D1 is no deadline either.
      entry.learnt(item.payload.sessionId, next);
      if (next === null) outbox.complete(item.id);
      else outbox.checkpoint(item, { dueAt: next });
    });
  }
}
