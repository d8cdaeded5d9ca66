/**
 * Deliveries and events: the `delivery` handler (one outbound platform call per
 * item, recorded on its `deliveries` row, retried with backoff, dead-lettered by
 * `givesUp`) and the `events` handler (a session's due lifecycle events, signed
 * and sent to the hooks).
 */
import { effectiveEnv } from "../config";
import { recordDeliveryAttempt, selectDelivery } from "../db/deliveries";
import { selectDueSessionEvents, selectNextSessionEventAt } from "../db/events";
import { attemptEvent } from "../hooks/deliver";
import { errorSummary, log } from "../log";
import { metrics } from "../metrics";
import { senderFor } from "../platforms";
import type { SendOutcome } from "../platforms/types";
import { configFor, outboundOf, type RouterContext } from "./context";
import { givesUp } from "./outbox";
import type { OutboxItem } from "./outbox-table";
import { deliveryWork, type DeliveryWork } from "./work";

export class Deliveries {
  constructor(private readonly ctx: RouterContext) {}

  /** The `delivery` handler. */
  async processDelivery(item: OutboxItem<"delivery">, now: number): Promise<void> {
    const { outbox, db } = this.ctx;
    const config = configFor(this.ctx);
    let work = item.payload;
    if (work.kind === "command" || work.beforeBatch) {
      const confirmed = await this.confirmAnswer(item);
      if (!confirmed) return;
      work = confirmed;
    }
    const sender = senderFor(work.platform);
    const outcome: SendOutcome = sender
      ? await sender.send(outboundOf(work), config, effectiveEnv(this.ctx.env))
      : {
          ok: false,
          retryable: false,
          retryAfterMs: null,
          status: null,
          error: `no sender for platform ${work.platform}`,
        };
    const attempts = item.attempts + 1;
    const retry = !outcome.ok && outcome.retryable && !givesUp(item, now);
    if (!outcome.ok) {
      log.warn("reply delivery failed", {
        session_key: work.sessionKey,
        session_id: work.sessionId,
        delivery_id: work.deliveryId,
        platform: work.platform,
        kind: work.kind,
        attempt: attempts,
        status: outcome.status,
        will_retry: retry,
        error: errorSummary(outcome.error),
      });
    }
    await db.batch(
      recordDeliveryAttempt(
        work.deliveryId,
        {
          status: outcome.ok ? "sent" : retry ? "pending" : "failed",
          lastStatus: outcome.status,
          lastError: outcome.error,
        },
        now,
      ),
    );
    if (retry) return outbox.retry(item, outcome.error ?? "failed", outcome.retryAfterMs, now);
    // Invariant 12: an answer dead-lettered is counted, and can be retried.
    if (!outcome.ok) metrics.deliveries_failed += 1;
    outbox.complete(item.id);
  }

  /**
   * A command's answer, and a run API reply, are staged before the D1 batch that
   * writes their row, like a run: sent only once that batch has stored it. Waiting
   * for the lock lets a batch in flight finish (a failed one removes the item, or
   * leaves it for D1 to decide); after a restart, D1 says, and its row is what is
   * sent. Returns the work to send, or null (the item is gone).
   */
  private async confirmAnswer(item: OutboxItem<"delivery">): Promise<DeliveryWork | null> {
    const { outbox, db, confirmedAnswers } = this.ctx;
    return this.ctx.mutex.run(async () => {
      const current = outbox.get(item.id, "delivery");
      if (!current) return null;
      if (confirmedAnswers.has(item.id)) return current.payload;
      const [rows] = await db.batch(selectDelivery(item.payload.deliveryId));
      const row = rows[0];
      if (!row || row.status !== "pending") {
        outbox.complete(item.id);
        return null;
      }
      const work = deliveryWork(row, current.payload.sessionKey);
      outbox.checkpoint(current, { payload: work });
      confirmedAnswers.add(item.id);
      return work;
    });
  }

  /** The `events` handler: one session's due lifecycle events; due again at the next retry of one. */
  async processEvents(item: OutboxItem<"events">, now: number): Promise<void> {
    const { outbox, db } = this.ctx;
    const { sessionId } = item.payload;
    const [due] = await db.batch(selectDueSessionEvents(db, sessionId, now));
    for (const event of due) await attemptEvent(db, configFor(this.ctx), event, now);
    const [[next]] = await db.batch(selectNextSessionEventAt(sessionId));
    const nextAt = next?.next ?? null;
    if (nextAt === null) outbox.complete(item.id);
    else outbox.checkpoint(item, { dueAt: Math.max(nextAt, now + 1) });
  }
}
