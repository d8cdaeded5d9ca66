/**
 * The agent API (`/v1/runs/...`, `/v1/sessions/...`): a run's reply, its progress
 * notices, and ending or rotating its session, each allowed only to the run that
 * owns the session (spec invariant 8). Each method runs under the object's lock
 * (the router's locked helper), with `now` read there.
 */
import { effectiveEnv } from "../config";
import { insertDelivery } from "../db/deliveries";
import { endedEvents, startedEvents } from "../db/events";
import { moveRuns, selectOpenRuns, selectRun } from "../db/runs";
import type { SessionRow } from "../db/schema";
import { endLive, insertSession, selectSession } from "../db/sessions";
import { isCronSession } from "../domain/cron";
import type { EndReason } from "../domain/end-reasons";
import type { ReplyTarget } from "../domain/inbound";
import { isCurrentRun, ownership, revocationFor, type NotOwnedReason } from "../domain/ownership";
import { expiryReason } from "../domain/reset-policy";
import { leaseUntil } from "../domain/turn-hold";
import { newId } from "../ids";
import { errorSummary, log } from "../log";
import { countEnded, metrics } from "../metrics";
import { senderFor } from "../platforms";
import {
  configFor,
  continuationOf,
  deliveryRow,
  eventStatusFor,
  outboundOf,
  policyFor,
  stageEvents,
  type RouterContext,
} from "./context";
import { entryFromNew } from "./entry";
import { notFound, notOwned, type RpcResult } from "./results";
import type { Settlement } from "./settlement";
import type { Turns } from "./turns";

export class AgentApi {
  constructor(
    private readonly ctx: RouterContext,
    private readonly settlement: Settlement,
    private readonly turns: Turns,
  ) {}

  /** `POST /v1/runs/{id}/reply`: records and delivers the reply of a run that is not revoked. */
  async runReply(runId: string, text: string, now: number): Promise<RpcResult<{ recorded: true }>> {
    const { db } = this.ctx;
    const found = await this.turns.runWithSession(runId);
    if (!found) return notFound(`no run ${runId}`);
    const { run, session } = found;
    // A reply recorded before is delivered even if its session ended since.
    if (run.finishedAt !== null) await this.turns.restageReply(runId, session.sessionKey, now);
    // A superseded run still delivers its reply; a revoked or finished one does not.
    if (run.revokedReason) return notOwned(run.revokedReason as NotOwnedReason);
    if (session.endReason !== null) return notOwned(revocationFor(session.endReason));
    if (run.finishedAt !== null) return notOwned("finished");
    const recorded = await this.turns.recordReplyOf(found, text, now, false);
    if (!recorded.finished) return notOwned("finished");
    // The route refuses a blank reply, so a reply not added means the session or run changed.
    if (!recorded.added) {
      const [[after]] = await db.batch(selectRun(db, runId));
      return notOwned((after?.revokedReason as NotOwnedReason | null) ?? "session_ended");
    }
    return { status: 200, body: { recorded: true } };
  }

  /**
   * `POST /v1/runs/{id}/progress`: sent to the chat only while the run owns its
   * session. The check and the send happen under the lock, so no `/new` or `/stop`
   * can slip between them; a progress notice is sent once and not retried.
   */
  async progress(runId: string, text: string, now: number): Promise<RpcResult<{ owns: true; sent: boolean }>> {
    const config = configFor(this.ctx);
    const found = await this.turns.runWithSession(runId);
    if (!found) return notFound(`no run ${runId}`);
    const { run, session } = found;
    const state = ownership({ run, session });
    if (!state.owns) return notOwned(state.reason);
    // Past its deadline (the alarm has not run yet) and no longer held by this turn
    // (its lease ran out): end it by its policy now.
    if (
      expiryReason(policyFor(this.ctx, session.platform, session.chatType), session.lastActiveAt, now) &&
      leaseUntil(run) <= now
    ) {
      await this.settlement.settleAndLearn(session, now);
      return notOwned("session_ended");
    }
    const target = JSON.parse(run.replyTo) as ReplyTarget;
    const sender = senderFor(target.platform);
    const env = effectiveEnv(this.ctx.env);
    if (!sender?.canDeliver(target, config, env)) return { status: 200, body: { owns: true, sent: false } };
    const work = {
      deliveryId: newId("dl"),
      sessionId: session.id,
      sessionKey: session.sessionKey,
      platform: target.platform,
      kind: "progress" as const,
      text,
      notice: null,
      eventId: run.eventId,
      target,
    };
    const outcome = await sender.send(outboundOf(work), config, env);
    if (!outcome.ok) {
      log.warn("progress delivery failed", {
        session_key: session.sessionKey,
        session_id: session.id,
        delivery_id: work.deliveryId,
        platform: target.platform,
        status: outcome.status,
        error: errorSummary(outcome.error),
      });
    }
    await this.ctx.db.batch(
      insertDelivery(
        deliveryRow(work, {
          runId,
          status: outcome.ok ? "sent" : "failed",
          attempts: 1,
          lastStatus: outcome.status,
          lastError: outcome.error,
          target: run.replyTo,
          createdAt: now,
        }),
      ),
    );
    return { status: 200, body: { owns: true, sent: outcome.ok } };
  }

  /**
   * `POST /v1/sessions/{id}/end` by a run: only the session's current run (finished
   * or not) may end a live session; an ended row is answered unchanged to any run
   * of the session. A cron session always ends as `cron_complete`.
   */
  async agentEnd(
    sessionId: string,
    runId: string,
    reason: EndReason,
    now: number,
  ): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    const { db } = this.ctx;
    const [runs, sessions] = await db.batch(selectRun(db, runId), selectSession(db, sessionId));
    const run = runs[0];
    const session = sessions[0];
    if (!run || !session) return notFound(`no session ${sessionId}`);
    if (session.endReason !== null) return { status: 200, body: { session, changed: false } };
    if (!isCurrentRun({ run, session })) {
      const state = ownership({ run, session });
      return notOwned(state.owns ? "superseded" : state.reason);
    }
    const ending = isCronSession(session) ? "cron_complete" : reason;
    const { changed, row } = await this.settlement.endNow(sessionId, ending, now);
    return { status: 200, body: { session: row ?? session, changed } };
  }

  /**
   * `POST /v1/sessions/{id}/rotate`: ends the session as `compression` and starts its
   * continuation (same key, `parent_session_id`, the parent's last activity, the
   * current run moved over), adopted before the answer so the next message lands there.
   */
  async rotate(sessionId: string, runId: string, now: number): Promise<RpcResult<{ session_id: string }>> {
    const { db, entry } = this.ctx;
    const eventStatus = eventStatusFor(this.ctx);
    const [runs, sessions, openRuns] = await db.batch(
      selectRun(db, runId),
      selectSession(db, sessionId),
      selectOpenRuns(sessionId),
    );
    const run = runs[0];
    const session = sessions[0];
    if (!run || !session) return notFound(`no session ${sessionId}`);
    const state = ownership({ run, session });
    if (session.endReason !== null || !isCurrentRun({ run, session })) {
      return notOwned(state.owns ? "superseded" : state.reason);
    }
    const policy = policyFor(this.ctx, session.platform, session.chatType);
    const continuation = continuationOf(session, policy, openRuns, now);
    const [ended, inserted] = await db.batch(
      endLive(session.id, "compression", false, now),
      ...insertSession(continuation, null, { sessionId: session.id, reason: "compression" }, { endedJustBefore: true }),
      ...moveRuns(session.id, continuation.id),
      ...endedEvents(session.id, now, eventStatus),
      ...startedEvents(continuation.id, now, eventStatus),
    );
    if (ended !== 1 || inserted !== 1) return notOwned("session_ended");
    countEnded("compression");
    metrics.sessions_created += 1;
    // The continuation has its parent's run already: no first run pending, no reset context.
    entry.adopt(entryFromNew(continuation, session, null, false));
    entry.setDeadline(continuation.sweepAt);
    this.moveStagedRuns(session.id, continuation.id);
    stageEvents(this.ctx, session.id, now);
    stageEvents(this.ctx, continuation.id, now);
    return { status: 200, body: { session_id: continuation.id } };
  }

  /**
   * A rotation moves the turn, still current, to the continuation: D1 moves the runs
   * rows (moveRuns), and this moves the hand-offs still in the outbox, which have no
   * row yet. Otherwise they would be handed over naming the ended parent, hold no
   * session open, and their replies would be recorded nowhere.
   */
  private moveStagedRuns(fromSessionId: string, toSessionId: string): void {
    const { outbox } = this.ctx;
    for (const item of outbox.all("run")) {
      const work = item.payload;
      if (work.sessionId !== fromSessionId) continue;
      const movedFrom = [...(work.movedFrom ?? []), fromSessionId];
      outbox.checkpoint(item, { payload: { ...work, sessionId: toSessionId, parentId: fromSessionId, movedFrom } });
    }
    // Messages waiting in the parent are carried by the continuation's next run.
    this.ctx.waiting.moveSession(fromSessionId, toSessionId);
    this.ctx.typing.moveSession(fromSessionId, toSessionId);
  }
}
