/**
 * Operator calls (`/admin/...`): read the entry and what a message would meet,
 * end a session, and retry what failed for good (a run, a delivery, events).
 * Each method runs under the object's lock (the router's locked helper).
 */
import { sha256Hex } from "../crypto";
import { mayHaveCommitted } from "../db/client";
import { requeueDelivery, selectDelivery } from "../db/deliveries";
import { requeueFailedRun, selectRun } from "../db/runs";
import type { DeliveryRow, RunRow, SessionRow } from "../db/schema";
import { selectNewestForKey, selectSession } from "../db/sessions";
import type { EndReason } from "../domain/end-reasons";
import type { RoutedMessage } from "../domain/inbound";
import { deadline } from "../domain/reset-policy";
import type { AlarmPlan } from "./alarm";
import { dispatchWork, policyFor, stageEvents, type RouterContext } from "./context";
import { resetOf } from "./entry";
import { conflict, notFound, type EntryView, type ErrorBody, type ExplainState, type RpcResult } from "./results";
import type { Settlement } from "./settlement";
import type { Turns } from "./turns";
import { deliveryWork } from "./work";

export class Operator {
  constructor(
    private readonly ctx: RouterContext,
    private readonly alarm: AlarmPlan,
    private readonly settlement: Settlement,
    private readonly turns: Turns,
  ) {}

  /** `GET /admin/routes/{key}`: the entry, the live session's deadline, and the row it points at. */
  async inspect(): Promise<{ entry: EntryView | null; alarm_at: number | null; session: SessionRow | null }> {
    const { db } = this.ctx;
    const entry = this.ctx.entry.entry;
    if (!entry) return { entry: null, alarm_at: null, session: null };
    const [rows] = await db.batch(selectSession(db, entry.sessionId));
    const row = rows[0] ?? null;
    const live = row !== null && row.endReason === null;
    const policy = policyFor(this.ctx, entry.platform, entry.chatType);
    return {
      entry: {
        session_key: entry.sessionKey,
        session_id: entry.sessionId,
        platform: entry.platform,
        chat_type: entry.chatType,
        last_active_at: row?.lastActiveAt ?? null,
        parent_session_id: entry.parentId,
        reset: entry.reset,
        first_run_pending: entry.firstRunPending,
        notice_pending: row?.noticePending ?? null,
      },
      alarm_at: live ? deadline(policy, row.lastActiveAt) : null,
      session: row,
    };
  }

  /**
   * `GET /admin/routes/{key}/explain`: what a message would read, read the same way
   * (the entry's row, else the key's newest row), plus the alarm and the current
   * run's hand-off. Reads only; `explain()` in src/domain/explain.ts decides.
   */
  async explainState(key: string): Promise<ExplainState> {
    const { db, outbox } = this.ctx;
    const entry = this.ctx.entry.entry;
    const [rows] = await db.batch(entry ? selectSession(db, entry.sessionId) : selectNewestForKey(db, key));
    const row = rows[0] ?? null;
    const [runs] = row?.currentRunId ? await db.batch(selectRun(db, row.currentRunId)) : [[]];
    const item = row?.currentRunId ? outbox.get(row.currentRunId, "run") : null;
    return {
      entrySessionId: entry?.sessionId ?? null,
      row,
      alarmAt: await this.alarm.stored(),
      currentRun: runs[0] ?? null,
      handoff: item ? { attempts: item.attempts, lastError: item.lastError, dueAt: item.dueAt } : null,
      waiting: row ? this.ctx.waiting.count(row.id) : 0,
    };
  }

  /** `DELETE /admin/routes/{key}`: forget the entry and its deadline; keep D1 and the outbox. */
  forget(): void {
    this.ctx.entry.forget();
  }

  /**
   * `POST /admin/sessions/{id}/end`: ends one of this key's sessions. Ending only
   * touches a live row: an ended row is answered as it is (first reason wins, no
   * second event).
   */
  async endSession(
    sessionId: string,
    reason: EndReason,
    now: number,
  ): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    const { changed, row } = await this.settlement.endNow(sessionId, reason, now);
    if (!row) return notFound(`no session ${sessionId}`);
    return { status: 200, body: { session: row, changed } };
  }

  /** `POST /admin/events/{id}/retry`: deliver a session's pending events now, not at the next sweep. */
  flushEvents(sessionId: string, now: number): void {
    stageEvents(this.ctx, sessionId, now);
  }

  /**
   * `POST /admin/runs/{id}/retry`: hands a failed run to the agent again through the
   * outbox: the same run id, a fresh attempt count (and a day of retries), a fresh
   * token. Only a failed run of a live session (a reply could land nowhere else).
   */
  async retryRun(runId: string, now: number): Promise<RpcResult<{ run: RunRow }> | { status: 409; body: ErrorBody }> {
    const { db, outbox } = this.ctx;
    const found = await this.turns.runWithSession(runId);
    if (!found) return notFound(`no run ${runId}`);
    const { run, session } = found;
    if (run.failedAt === null || run.finishedAt !== null || run.revokedReason !== null) {
      return conflict("not_failed", `run ${runId} has not failed`);
    }
    if (session.endReason !== null) {
      return conflict("session_ended", `the session of run ${runId} has ended: its reply could land nowhere`);
    }
    if (!run.message) return conflict("not_retryable", `run ${runId} predates retries (no message kept)`);
    // Handed over as it first went: a session's first run is still `is_new`, with its
    // reset. A run a rotation moved on is in a continuation, which has no first run.
    const isNew = run.isNew === true && session.parentSessionId === null;
    const base = dispatchWork(runId, JSON.parse(run.message) as RoutedMessage, {
      sessionId: session.id,
      isNew,
      parentId: session.parentSessionId,
      reset: isNew ? resetOf(session) : null,
    });
    // A run that carried several messages is handed over with all of them again.
    const work = run.messages ? { ...base, messages: JSON.parse(run.messages) as RoutedMessage[] } : base;
    // Staged first, like any hand-off; removed again if D1 refuses the retry.
    outbox.stage(runId, "run", work, now, true);
    let changed: number;
    let rows: RunRow[];
    try {
      [changed, rows] = await db.batch(requeueFailedRun(runId, await sha256Hex(work.token)), selectRun(db, runId));
    } catch (error) {
      // A retry whose batch may have committed stays: confirming asks D1 about its run.
      if (!mayHaveCommitted(error)) outbox.unstage(runId);
      throw error;
    }
    // Another writer got there between the read and the batch: as if asked a moment later.
    if (changed !== 1) {
      outbox.unstage(runId);
      return conflict("not_failed", `run ${runId} has not failed`);
    }
    this.ctx.confirmedRuns.add(runId);
    return { status: 200, body: { run: rows[0]! } };
  }

  /**
   * `POST /admin/deliveries/{id}/retry`: sends a failed reply or command answer
   * again through the outbox, with a fresh attempt count.
   */
  async retryDelivery(
    deliveryId: string,
    sessionKey: string,
    now: number,
  ): Promise<RpcResult<{ delivery: DeliveryRow }> | { status: 409; body: ErrorBody }> {
    const { db, outbox } = this.ctx;
    const [rows] = await db.batch(selectDelivery(deliveryId));
    const row = rows[0];
    if (!row) return notFound(`no delivery ${deliveryId}`);
    if (row.status !== "failed") return conflict("not_failed", `delivery ${deliveryId} has not failed`);
    const [changed, after] = await db.batch(requeueDelivery(deliveryId, now), selectDelivery(deliveryId));
    if (changed !== 1 || !after[0]) return conflict("not_failed", `delivery ${deliveryId} has not failed`);
    const work = deliveryWork(after[0], sessionKey);
    if (work.kind === "command") this.ctx.confirmedAnswers.add(deliveryId);
    outbox.stage(deliveryId, "delivery", work, now, true);
    return { status: 200, body: { delivery: after[0] } };
  }

  /** The sweep's poke: apply the policy to one of this key's sessions now. */
  async checkSession(sessionId: string, now: number): Promise<void> {
    await this.settlement.settleById(sessionId, now);
  }
}
