/**
 * Overlapping messages (spec "Overlapping messages", invariant 11): whether a
 * message waits instead of getting its own run, and the one run that carries the
 * waiting messages once nothing of their session is unfinished. The messages wait
 * in the object's own storage (waiting.ts); the run that carries them is staged in
 * the same outbox as every hand-off, in the same synchronous step that takes them
 * out of the waiting list, so no message is carried twice nor lost by a restart.
 */
import { releaseMessages, revokeInterrupted } from "../db/overlap";
import { selectRun } from "../db/runs";
import { selectDedupe, selectSession } from "../db/sessions";
import { CRON_PLATFORM } from "../domain/cron";
import type { RoutedMessage } from "../domain/inbound";
import { resolveOverlap, type OverlapView } from "../domain/overlap";
import { isOpenRun, leaseUntil } from "../domain/turn-hold";
import { newId } from "../ids";
import { configFor, dispatchWork, type RouterContext } from "./context";
import { entryFromRow } from "./entry";
import type { WaitingRow } from "./waiting";
import { carriedBy, type RunWork } from "./work";

/** What a run tells the agent of its session beyond its id. */
type RunContext = Pick<RunWork, "isNew" | "parentId" | "reset">;

export class Queue {
  constructor(private readonly ctx: RouterContext) {}

  /** The effective OVERLAP settings of a platform and chat type. */
  settingsFor(platform: string, chatType: string): OverlapView {
    return resolveOverlap(configFor(this.ctx).overlap, platform, chatType);
  }

  /**
   * Whether a message for `sessionId` (the entry's session) waits: in `queue` mode
   * (and `interrupt`, until it revokes), while a run of that session is unfinished
   * or other messages already wait. Reads only the object's storage, so a waiting
   * message costs the webhook's path no D1 round trip.
   */
  shouldWait(message: RoutedMessage, sessionId: string | undefined): boolean {
    if (message.platform === CRON_PLATFORM) return false;
    const settings = this.settingsFor(message.platform, message.chatType);
    // With debounce_ms every message waits: the alarm dispatches the window's run.
    if (settings.debounce_ms > 0) return true;
    if (!sessionId || settings.mode === "concurrent") return false;
    return this.ctx.waiting.busy(sessionId, true);
  }

  /** With `debounce_ms`, once nothing new came for that long after the newest waiting message; else null. */
  private quietAt(sessionId: string, waiting = this.ctx.waiting.all()): number | null {
    const rows = waiting.filter((row) => row.sessionId === sessionId);
    const newest = rows[rows.length - 1];
    if (!newest) return null;
    const { debounce_ms } = this.settingsFor(newest.message.platform, newest.message.chatType);
    if (debounce_ms === 0) return null;
    return Math.max(...rows.map((row) => row.message.receivedAt)) + debounce_ms;
  }

  /**
   * With no routing entry (forgotten, or storage lost), the session a message will
   * most likely land in: the one this object still has a hand-off, an accepted run
   * or waiting messages for (one key, so one conversation). Without it, a message
   * would get a run beside the unfinished one in `queue` mode.
   */
  sessionWithWork(): string | undefined {
    const { outbox, waiting } = this.ctx;
    const runs = outbox.all("run");
    return runs[runs.length - 1]?.payload.sessionId ?? waiting.all().at(-1)?.sessionId ?? waiting.acceptedSession();
  }

  /** A run of the session is unfinished: its hand-off is in the outbox, or the agent accepted it. */
  unfinishedIn(sessionId: string): boolean {
    return this.ctx.waiting.busy(sessionId, false);
  }

  /**
   * Dispatches what waits wherever nothing is unfinished any more: one run per
   * session, carrying its waiting messages oldest first (at most `max_batch`; more
   * wait for the next run). Accepted runs are checked against D1 first (finished,
   * revoked, failed for good or past their lease: over), and messages staged before
   * a restart are confirmed against their dedupe mark (never stored: dropped).
   */
  async pump(now: number): Promise<void> {
    const { waiting, db } = this.ctx;
    if (waiting.count() === 0) return;
    for (const row of waiting.all().filter((r) => !r.confirmed)) {
      // Asked on the day the mark was written (the message's): a late alarm still finds it.
      const [seen] = await db.batch(selectDedupe(row.message.platform, row.eventId, row.message.receivedAt));
      const mark = seen[0];
      if (mark?.session_id && mark.run_id === null) waiting.confirm(row.eventId, mark.session_id);
      else waiting.remove([row.eventId]);
    }
    const sessions = [...new Set(waiting.all().map((row) => row.sessionId))];
    for (const sessionId of sessions) {
      for (const runId of waiting.accepted(sessionId)) {
        const [runs] = await db.batch(selectRun(db, runId));
        const run = runs[0];
        if (!run || !isOpenRun(run) || leaseUntil(run) <= now) waiting.over(runId);
        // Still heard from (heartbeats): the alarm looks again when this lease ends.
        else waiting.heardUntil(runId, leaseUntil(run));
      }
      const quietAt = this.quietAt(sessionId);
      if (quietAt !== null && now < quietAt) continue;
      // concurrent: runs never wait for each other (only for the debounce window).
      if (this.modeOf(sessionId) === "concurrent" || !this.unfinishedIn(sessionId))
        this.dispatch(sessionId, now, [], await this.runContextOf(sessionId));
      else if (this.interrupts(sessionId)) await this.interrupt(sessionId, now);
    }
  }

  /**
   * When waiting messages are due for their run, for the alarm plan: now, while a
   * session in `interrupt` mode has a message waiting behind an unfinished run (the
   * webhook's path only stores it; the alarm carries the interrupt out, so the
   * webhook costs what it always did); and when the lease of the accepted run they
   * wait behind ends (a silent agent's run is over then, and nothing else may wake
   * the object: the entry may be forgotten); and now, for messages that nothing holds
   * back any more (a pump that failed between ending a run and staging the next left
   * them so), or they would wait for the next message. An interrupt that fails is
   * not backed off here: it fails the alarm's pass, and the alarm plan backs off.
   */
  dueAt(now: number): number | null {
    const { waiting } = this.ctx;
    if (waiting.count() === 0) return null;
    const due: number[] = [];
    // Read (and parsed) once: this runs on every re-arm while messages wait.
    const rows = waiting.all();
    for (const id of new Set(rows.map((row) => row.sessionId))) {
      const mode = this.modeOf(id, rows);
      const quietAt = this.quietAt(id, rows);
      // queue: behind an unfinished run, the run's end dispatches what waits: a hand-off's
      // outcome, or an accepted run's reply or lease lapse (the clock: the alarm looks then).
      // interrupt: the same for messages left behind by max_batch (they do not interrupt).
      const holds = mode === "concurrent" ? null : waiting.holds(id);
      const unfinished = holds !== null && (holds.staged || holds.leaseEnd !== null);
      const interrupts = unfinished && mode === "interrupt" && waiting.arrivedSinceDispatch(id);
      if (unfinished && !interrupts) {
        if (!holds.staged && holds.leaseEnd !== null) due.push(holds.leaseEnd);
        continue;
      }
      // An interrupt to carry out, or nothing holds them: due when their debounce window
      // ends, else now.
      due.push(quietAt ?? now);
    }
    return due.length === 0 ? null : Math.min(...due);
  }

  /**
   * `interrupt`: a message that came while a run is unfinished revokes it. Messages
   * that `max_batch` left behind when that run was dispatched are older than it: they
   * wait for it (as in `queue`), or its hand-off, in flight, would be revoked by them.
   */
  private interrupts(sessionId: string): boolean {
    return (
      this.modeOf(sessionId) === "interrupt" &&
      this.unfinishedIn(sessionId) &&
      this.ctx.waiting.arrivedSinceDispatch(sessionId)
    );
  }

  /** The mode of a session's waiting messages (they share one conversation, so one platform and chat type). */
  private modeOf(sessionId: string, waiting = this.ctx.waiting.all()): string {
    const first = waiting.find((row) => row.sessionId === sessionId);
    return first ? this.settingsFor(first.message.platform, first.message.chatType).mode : "queue";
  }

  /**
   * `interrupt`: the session's unfinished runs are revoked as `superseded` (their
   * heartbeat says so; a reply, even a 200 already on its way, is never recorded nor
   * delivered) and their messages wait again in D1; then one run carries them and
   * the waiting ones. The revoked runs leave the outbox (or the accepted list) in
   * the same synchronous step that stages their replacement, so a restart between
   * the D1 batch and that step simply does the interrupt again.
   */
  private async interrupt(sessionId: string, now: number): Promise<void> {
    const { outbox, waiting, db } = this.ctx;
    const items = outbox.all("run").filter((item) => item.payload.sessionId === sessionId);
    const acceptedIds = waiting.accepted(sessionId);
    const carried = [
      ...items.flatMap((item) => carriedBy(item.payload)),
      ...acceptedIds.flatMap((runId) => waiting.acceptedMessages(runId)),
    ];
    const revoked = [...items.map((item) => item.id), ...acceptedIds];
    await db.batch(...revoked.flatMap((runId) => [revokeInterrupted(runId), releaseMessages(sessionId, runId)]));
    for (const item of items) outbox.complete(item.id);
    for (const runId of acceptedIds) waiting.over(runId);
    this.dispatch(sessionId, now, carried);
  }

  /**
   * The session's next run context (is_new, parent, reset): the entry's when it names
   * the session; else (the entry was forgotten while messages waited) the D1 row's and
   * the outbox's, as the recovery path rebuilds it: a fresh session's first run still
   * says is_new, and a run staged beside it (concurrent mode) takes that first run.
   * Only that path reads D1.
   */
  private async runContextOf(sessionId: string): Promise<RunContext | undefined> {
    const { entry, db } = this.ctx;
    if (entry.isLive(sessionId)) return undefined;
    const [rows] = await db.batch(selectSession(db, sessionId));
    const row = rows[0];
    if (!row) return undefined;
    const rebuilt = entryFromRow(row, row, this.ctx.outbox.hasRunOf(sessionId));
    const isNew = rebuilt.firstRunPending;
    return { isNew, parentId: rebuilt.parentId, reset: isNew ? rebuilt.reset : null };
  }

  /**
   * Stages one run carrying the session's oldest waiting messages, and takes them off
   * the list. `context`: the run context when the entry does not name the session.
   */
  private dispatch(sessionId: string, now: number, revoked: RoutedMessage[] = [], context?: RunContext): void {
    const { waiting, outbox, entry, confirmedRuns } = this.ctx;
    const rows: WaitingRow[] = waiting.all().filter((row) => row.sessionId === sessionId && row.confirmed);
    const first = rows[0];
    if (!first) return;
    const settings = this.settingsFor(first.message.platform, first.message.chatType);
    // An interrupt's new run carries every message of the runs it revoked (never left behind), then the waiting ones.
    const carried = [
      ...revoked,
      ...rows.slice(0, Math.max(settings.max_batch - revoked.length, 1)).map((row) => row.message),
    ];
    const newest = carried[carried.length - 1]!;
    // Messages stored before a rotation keep their rows in the parent (their run_id is set there).
    const movedFrom = [...new Set(rows.map((row) => row.storedIn))].filter((id) => id !== sessionId);
    const current = entry.entry;
    const isEntrySession = current?.sessionId === sessionId;
    const firstRun = isEntrySession && current.firstRunPending;
    const work = {
      ...dispatchWork(newId("run"), newest, {
        sessionId,
        isNew: firstRun,
        parentId: isEntrySession ? current.parentId : null,
        reset: firstRun ? current.reset : null,
        ...(isEntrySession ? {} : context),
      }),
      messages: carried,
      ...(movedFrom.length > 0 ? { movedFrom } : {}),
    };
    // One synchronous step: the run is staged and its messages leave the list together.
    outbox.stage(work.runId, "run", work, now);
    waiting.remove(carried.map((m) => m.eventId));
    waiting.markDispatched(sessionId);
    confirmedRuns.add(work.runId);
    if (firstRun) entry.update({ firstRunPending: false });
  }
}

/**
 * A session ended (the batch that ended it is done): nothing of it waits any more,
 * and a run staged for its waiting messages leaves the outbox with them, in the same
 * synchronous step. That batch recorded those messages as not dispatched (the run
 * was not in D1 yet) or revoked the run that took them, so the run must never be
 * handed over, nor its messages carried on by an interrupt, should the session
 * reopen (a recoverable end). So does a hand-off already attempted (the agent was
 * down): its run is in D1, revoked. A run staged with its one message and never
 * attempted keeps its item: it is not in D1 yet, and goes out if the session reopens.
 */
export function dropEnded(ctx: RouterContext, sessionId: string): void {
  ctx.waiting.dropSession(sessionId);
  dropRevokedRuns(ctx, sessionId);
}

/**
 * A batch revoked every run of `sessionId` in D1: its end, or the reopen of a row an
 * SQL end had not revoked. This object stops counting them unfinished, so nothing
 * waits behind them: accepted runs go (an accepted run is in D1, so revoked), and
 * typing stops. On an end, hand-offs already attempted go too (owed no more) and so
 * do runs staged for waiting messages (the end recorded those not dispatched). On a
 * reopen (`reopenedAt`) an attempted hand-off is kept and retried at once instead: a
 * failed attempt may have thrown before D1 had its run, and then it alone carries
 * its messages; its retry finds the run revoked and leaves, or hands them over.
 */
export function dropRevokedRuns(ctx: RouterContext, sessionId: string, reopenedAt?: number): void {
  for (const runId of ctx.waiting.accepted(sessionId)) ctx.waiting.over(runId);
  ctx.typing.sessionEnded(sessionId);
  for (const item of ctx.outbox.all("run")) {
    const work = item.payload;
    if (work.sessionId !== sessionId || work.stage !== "dispatch") continue;
    const attempted = item.attempts > 0;
    if (reopenedAt === undefined && (attempted || work.messages)) ctx.outbox.complete(item.id);
    else if (reopenedAt !== undefined && attempted) ctx.outbox.checkpoint(item, { dueAt: reopenedAt });
  }
}
