/**
 * Turns: the `run` handler of the outbox (a staged hand-off confirmed, made the
 * session's current run, handed to the agent, its reply recorded), and recording
 * a run's reply wherever it comes from (the agent's answer or the run API).
 */
import { handToAgent } from "../agent/dispatch";
import { echoAgent } from "../agent/echo";
import type { Statement } from "../db/client";
import { selectDelivery } from "../db/deliveries";
import {
  dispatchRun,
  markRunFailed,
  recordInstantTurn,
  recordReply,
  recordRunRetry,
  replyDeliveryId,
  selectRun,
  selectSessionOfRun,
} from "../db/runs";
import type { DeliveryRow, RunRow, SessionRow } from "../db/schema";
import { attachMessages, markEndedNotDispatched, setRunMessages } from "../db/overlap";
import { selectSession } from "../db/sessions";
import { CRON_PLATFORM, isCronSession } from "../domain/cron";
import type { ReplyTarget } from "../domain/inbound";
import { expiryReason, liveSince, type ResetPolicy } from "../domain/reset-policy";
import { now as clockNow } from "../clock";
import { errorSummary, log } from "../log";
import { metrics } from "../metrics";
import { confirmStaged } from "./confirm";
import { configFor, deliverable, policyFor, type RouterContext } from "./context";
import { givesUp } from "./outbox";
import type { OutboxItem } from "./outbox-table";
import type { Queue } from "./queue";
import type { Settlement } from "./settlement";
import type { TypingStart } from "./typing";
import {
  agentRequest,
  carriedBy,
  deliveryWork,
  newRunOf,
  type DeliveryWork,
  type RecordedReply,
  type RunWork,
} from "./work";

export class Turns {
  constructor(
    private readonly ctx: RouterContext,
    private readonly settlement: Settlement,
    private readonly queue: Queue,
  ) {}

  /** The `run` handler. */
  async processRun(item: OutboxItem<"run">, now: number): Promise<void> {
    const { outbox, mutex, db } = this.ctx;
    const config = configFor(this.ctx);
    const work = await confirmStaged(this.ctx, item.payload);
    if (!work) {
      outbox.complete(item.id);
      return;
    }
    let reply: string | null;
    if (work.stage === "dispatch" && !config.agentUrl) {
      // The built-in echo agent answers at once: the whole turn is one batch.
      await mutex.run(() => this.instantTurn(work, echoAgent(agentRequest(work)).text, clockNow()));
      outbox.complete(item.id);
      return;
    }
    if (work.stage === "dispatch" && config.agentUrl) {
      const dispatched = await mutex.run(async () => {
        const begun = await this.beginRun(work, now);
        // The run is its session's current run now: typing shows at once, never awaited by the hand-off.
        if (begun) this.ctx.typing.dispatched(typingStartOf(work), clockNow());
        return begun;
      });
      if (!dispatched) {
        outbox.complete(item.id);
        return;
      }
      const outcome = await handToAgent(config, config.agentUrl, agentRequest(work));
      if (outcome.kind === "accepted") {
        outbox.complete(item.id);
        await mutex.run(() =>
          this.settlement.expectHeartbeats(work.sessionId, work.runId, carriedBy(work), clockNow()),
        );
        return;
      }
      if (outcome.kind === "retry" || outcome.kind === "failed") {
        const expired = givesUp(item, now);
        log.warn("agent hand-off failed", {
          session_key: work.message.sessionKey,
          session_id: work.sessionId,
          run_id: work.runId,
          attempt: item.attempts + 1,
          will_retry: outcome.kind === "retry" && !expired,
          error: errorSummary(outcome.error),
        });
        if (outcome.kind === "retry" && !expired) {
          await db.batch(recordRunRetry(work.runId, outcome.error));
          return outbox.retry(item, outcome.error, outcome.retryAfterMs, now);
        }
        // Dead letter: the run is marked failed, where the operator sees and retries it.
        const failed = markRunFailed(work.runId, now, outcome.error);
        // A scheduled job's session has this one run: once it failed, the job is over,
        // and both are recorded in one batch (a failed batch is retried as a whole).
        if (work.message.platform === CRON_PLATFORM)
          await mutex.run(() => this.settlement.endNow(work.sessionId, "cron_complete", clockNow(), [failed]));
        else await db.batch(failed);
        // Invariant 12: a user left without an answer is counted, and can be retried.
        metrics.runs_failed += 1;
        this.ctx.typing.stop(work.runId);
        outbox.complete(item.id);
        return;
      }
      reply = outcome.text;
      // The reply is kept before it is recorded, so a restart records it rather than
      // asking the agent a second time.
      outbox.checkpoint(item, { payload: { ...work, stage: "record", reply } });
    } else {
      reply = work.reply ?? null;
    }
    // Recording stages the reply's delivery, which the running drain picks up next.
    await mutex.run(() => this.recordRunReply(work.runId, reply, clockNow(), true));
    outbox.complete(item.id);
  }

  /** Makes the run its session's current run; false when its session ended before the hand-off. */
  private async beginRun(work: RunWork, now: number): Promise<boolean> {
    const { db } = this.ctx;
    const [, , , , , runs] = await db.batch(
      ...(dispatchRun(await newRunOf(work), now) as [
        Statement<number>,
        Statement<number>,
        Statement<number>,
        Statement<number>,
        Statement<number>,
      ]),
      selectRun(db, work.runId),
      ...carryStatements(work),
    );
    const run = runs[0];
    // A failed run is the operator's to retry (which clears failed_at first): an item
    // left behind by a crash after its dead letter is not handed over again.
    return !!run && run.revokedReason === null && run.finishedAt === null && run.failedAt === null;
  }

  /** A run and the session it belongs to now (a rotation moves runs to the continuation). */
  async runWithSession(runId: string): Promise<{ run: RunRow; session: SessionRow } | null> {
    const { db } = this.ctx;
    const [runs, sessions] = await db.batch(selectRun(db, runId), selectSessionOfRun(runId));
    const run = runs[0];
    const session = sessions[0];
    return run && session ? { run, session } : null;
  }

  /** A turn answered at once (the echo agent): run, reply and delivery in one batch. */
  private async instantTurn(work: RunWork, text: string, now: number): Promise<RecordedReply> {
    const { platform, chatType, replyTo, sessionKey } = work.message;
    const { entry } = this.ctx;
    const policy = policyFor(this.ctx, platform, chatType);
    // The run comes from the outbox, so it held its session (invariant 6).
    const reply = {
      runId: work.runId,
      sessionId: work.sessionId,
      text,
      liveSince: liveSince(policy, now),
      held: true,
      now,
    };
    const canDeliver = deliverable(this.ctx, replyTo);
    // The entry knows whether a reset notice can still be owed; if not, skip clearing it.
    const clearNotice = !entry.isLive(work.sessionId) || entry.entry?.noticeOwed !== false;
    const turn = recordInstantTurn(await newRunOf(work), { ...reply, deliverable: canDeliver, clearNotice });
    // The messages it carries go in before the delivery row is read back (the batch's last statement).
    const carryAt = canDeliver ? turn.length - 1 : turn.length;
    const carry = carryStatements(work);
    const all = await this.ctx.db.batch(...turn.slice(0, carryAt), ...carry, ...turn.slice(carryAt));
    const results = [...all.slice(0, carryAt), ...all.slice(carryAt + carry.length)];
    return this.afterReply({ id: work.sessionId, sessionKey, platform }, policy, results, text, canDeliver, now);
  }

  /**
   * Records a run's reply (from the agent's answer or the run API) and stages its
   * delivery. A revoked run's reply stays on the run, and nothing is delivered.
   */
  async recordRunReply(
    runId: string,
    text: string | null,
    now: number,
    fromOutbox: boolean,
  ): Promise<RecordedReply | null> {
    const found = await this.runWithSession(runId);
    return found ? this.recordReplyOf(found, text, now, fromOutbox) : null;
  }

  /**
   * `recordRunReply` for a run and session its caller has just read under the lock
   * (the run API), so they are not read twice: a row changed since is settled by the
   * batch's own conditions.
   */
  async recordReplyOf(
    found: { run: RunRow; session: SessionRow },
    text: string | null,
    now: number,
    fromOutbox: boolean,
  ): Promise<RecordedReply> {
    const { outbox } = this.ctx;
    const { run, session } = found;
    const runId = run.id;
    const policy = policyFor(this.ctx, session.platform, session.chatType);
    // Past the deadline the reply still lands while a turn holds the session open
    // (invariant 6): a hand-off from the outbox always does; through the run API, the
    // session's current run while its lease holds (this run, or another still open).
    const held =
      fromOutbox ||
      (expiryReason(policy, session.lastActiveAt, now) !== null && (await this.settlement.leaseOf(session, now)).held);
    const body = text?.trim() ? text : null;
    const target = JSON.parse(run.replyTo) as ReplyTarget;
    const canDeliver = deliverable(this.ctx, target);
    // Through the run API nothing else keeps the reply owed (a hand-off from the outbox
    // keeps its run item until the delivery is staged): stage the delivery before the
    // batch, so a kill after D1 recorded it can never leave it pending with nothing to
    // send it. It is sent only once D1 shows its row (confirmAnswer).
    const deliveryId = replyDeliveryId(runId);
    const staged = !fromOutbox && canDeliver && body !== null && !outbox.has(deliveryId);
    if (staged) {
      const early: DeliveryWork = {
        deliveryId,
        sessionId: session.id,
        sessionKey: session.sessionKey,
        platform: target.platform,
        kind: "reply",
        text: body,
        notice: null,
        eventId: run.eventId,
        target,
        beforeBatch: true,
      };
      outbox.stage(deliveryId, "delivery", early, now);
    }
    // A batch that throws may still have committed: the staged delivery stays, and D1 decides.
    const results = await this.ctx.db.batch(
      ...recordReply({
        runId,
        sessionId: session.id,
        text: body,
        liveSince: liveSince(policy, now),
        held,
        now,
        deliverable: canDeliver,
        clearNotice: true,
      }),
    );
    // The run's reply is recorded (or its run was revoked): it shows typing no more.
    this.ctx.typing.stop(runId);
    if (staged) {
      const row = (results.at(-1) as DeliveryRow[])[0];
      const item = outbox.get(deliveryId, "delivery");
      if (row?.status === "pending" && item) {
        outbox.checkpoint(item, { payload: deliveryWork(row, session.sessionKey) });
        this.ctx.confirmedAnswers.add(deliveryId);
      } else outbox.unstage(deliveryId);
    }
    const recorded = await this.afterReply(session, policy, results, body, canDeliver, now);
    // The run's turn is over: messages waiting behind it get their run (through the
    // run API; a hand-off from the outbox does so once its item is done).
    if (recorded.finished) {
      this.ctx.waiting.over(runId);
      if (!fromOutbox) {
        // A hand-off still being retried (the agent was down, then answered through the
        // API): it is owed no more, and must not keep the next message waiting behind it.
        if (outbox.get(runId, "run")?.payload.stage === "dispatch") outbox.complete(runId);
        await this.queue.pump(now);
      }
    }
    return recorded;
  }

  /**
   * What follows recording a reply: the session's activity moved; a reply that
   * could not be added to a live-looking session means it expired meanwhile, so it
   * ends now (policy on every path); a cron session ends once its run finished; the
   * delivery, if one is owed, is staged.
   */
  private async afterReply(
    session: Pick<SessionRow, "id" | "sessionKey" | "platform">,
    policy: ResetPolicy,
    results: unknown[],
    text: string | null,
    canDeliver: boolean,
    now: number,
  ): Promise<RecordedReply> {
    const { entry, outbox, db } = this.ctx;
    const finished = results[0] === 1;
    const added = results[1] === 1;
    if (added && entry.isLive(session.id)) {
      entry.markActive(policy, now);
      // The first reply took the notice, if there was one.
      if (entry.entry?.noticeOwed !== false) entry.update({ noticeOwed: false });
    }
    // Nothing added: the session may be past its deadline (expired meanwhile, or held
    // by this very turn, which is now over), so the policy looks at it now.
    if (!added && finished) {
      const [rows] = await db.batch(selectSession(db, session.id));
      if (rows[0]) await this.settlement.settleAndLearn(rows[0], now);
    }
    if (finished && isCronSession(session)) await this.settlement.endNow(session.id, "cron_complete", now);
    const row = canDeliver ? (results.at(-1) as DeliveryRow[])[0] : undefined;
    let delivery: DeliveryWork | null = null;
    if (row && row.status === "pending") {
      delivery = deliveryWork(row, session.sessionKey);
      if (!outbox.has(delivery.deliveryId)) outbox.stage(delivery.deliveryId, "delivery", delivery, now);
    }
    return { finished, added, delivery };
  }

  /**
   * The agent retried the reply of a run already finished: should its delivery be
   * pending with nothing in the outbox to send it (a kill between recording and
   * staging), it is staged again, so a reply recorded is never left unsent.
   */
  async restageReply(runId: string, sessionKey: string, now: number): Promise<void> {
    const { outbox, db } = this.ctx;
    const deliveryId = replyDeliveryId(runId);
    if (outbox.has(deliveryId)) return;
    const [[row]] = await db.batch(selectDelivery(deliveryId));
    if (row?.status === "pending") outbox.stage(deliveryId, "delivery", deliveryWork(row, sessionKey), now);
  }
}

/** What typing needs of a hand-off: its run, session, chat, and the newest message it answers. */
function typingStartOf(work: RunWork): TypingStart {
  return { runId: work.runId, sessionId: work.sessionId, target: work.message.replyTo, eventId: work.message.eventId };
}

/**
 * What goes in the batch that writes a run dispatched from the waiting list (after
 * its insert): it takes its messages (their `run_id`) and records them in
 * `runs.messages`, oldest first; should its session have ended meanwhile (the run is
 * revoked), they are recorded as never dispatched. Nothing for a run staged with its
 * one message, whose `run_id` was written with it (`runs.message` holds it), so
 * that path costs what it always did.
 */
function carryStatements(work: RunWork): Statement<number>[] {
  if (!work.messages) return [];
  const carried = carriedBy(work);
  const eventIds = carried.map((m) => m.eventId);
  // Where its messages are stored: this session, or a parent a rotation moved them on from.
  const storedIn = [...new Set([work.sessionId, ...(work.movedFrom ?? [])])];
  return [
    ...storedIn.map((sessionId) => attachMessages(sessionId, work.runId, eventIds)),
    // The routed messages (as `runs.message` holds one), so an operator retry rebuilds the same hand-off.
    setRunMessages(work.runId, carried),
    markEndedNotDispatched(work.sessionId),
  ];
}
