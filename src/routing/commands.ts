/**
 * Commands (`/new`, `/reset`, `/stop`): end the current row (by the policy first,
 * when it was already due), start a fresh session unless stopping, and answer in
 * the chat through the outbox, staged before the batch that stores the command.
 */
import { effectiveEnv } from "../config";
import { insertDelivery } from "../db/deliveries";
import { startedEvents } from "../db/events";
import { mayHaveCommitted, type Statement } from "../db/client";
import {
  endLive,
  insertSession,
  markCommandSeen,
  promoteExpired,
  selectDedupe,
  selectNewestForKey,
  type NewSession,
} from "../db/sessions";
import { COMMAND_REPLIES, type Command } from "../domain/commands";
import { isRecoverable, type EndReason } from "../domain/end-reasons";
import type { RoutedMessage } from "../domain/inbound";
import { deadline, expiryReason, liveSince, type ResetPolicy } from "../domain/reset-policy";
import { newId } from "../ids";
import { countEnded, metrics } from "../metrics";
import { senderFor } from "../platforms";
import {
  configFor,
  deliveryRow,
  eventStatusFor,
  freshSession,
  MAX_ROUTING_ATTEMPTS,
  revokedAndEnded,
  RoutingUnsettled,
  stageEvents,
  type RouterContext,
} from "./context";
import { entryFromNew } from "./entry";
import type { AcceptedBody, RpcResult } from "./results";
import { dropEnded } from "./queue";
import type { Settlement } from "./settlement";
import { toUserMessage, type DeliveryWork } from "./work";

export class Commands {
  constructor(
    private readonly ctx: RouterContext,
    private readonly settlement: Settlement,
  ) {}

  async run(command: Command, message: RoutedMessage, policy: ResetPolicy): Promise<RpcResult<AcceptedBody>> {
    const { entry, outbox } = this.ctx;
    const now = message.receivedAt;
    const since = liveSince(policy, now);
    const db = this.ctx.db.on("ingress");
    const eventStatus = eventStatusFor(this.ctx);
    for (let attempt = 0; attempt < MAX_ROUTING_ATTEMPTS; attempt++) {
      // The key's newest row, not the entry's (spec invariant 5): an entry left naming an
      // older row (its object was killed after D1 stored the session that followed it)
      // would have the command stop nothing, or start nothing, for good.
      const [rows, seen] = await db.batch(
        selectNewestForKey(db, message.sessionKey),
        selectDedupe(message.platform, message.eventId, now),
      );
      if (seen[0]) {
        metrics.duplicates += 1;
        return { status: 200, body: { accepted: true, session_id: seen[0].session_id, duplicate: true } };
      }
      const row = rows[0] ?? null;
      const statements: Statement<number>[] = [];
      // What ends the current row, if anything: the policy first (it was already due),
      // then the command itself for a live row.
      let endedAs: EndReason | null = null;
      if (row && (row.endReason === null || isRecoverable(row.endReason as EndReason))) {
        // A live row held open by its turn in progress (invariant 6) is not expired
        // yet: the command ends it, for its own reason, at once.
        const expired =
          expiryReason(policy, row.lastActiveAt, now) &&
          !(row.endReason === null && (await this.settlement.leaseOf(row, now)).held)
            ? expiryReason(policy, row.lastActiveAt, now)
            : null;
        if (expired) {
          endedAs = expired;
          statements.push(promoteExpired(row.id, expired, since, now));
        } else if (row.endReason === null) {
          endedAs = command === "stop" ? "suspended" : "new_command";
          statements.push(endLive(row.id, endedAs, false, now));
        }
      }
      if (row) statements.push(...revokedAndEnded(this.ctx, row.id, now));
      const stopped = command === "stop" && endedAs === "suspended";
      let fresh: NewSession | null = null;
      let insertAt = -1;
      if (command !== "stop") {
        const replaced = row
          ? { sessionId: row.id, reason: (endedAs ?? row.endReason) as EndReason, hadActivity: row.messageCount > 0 }
          : null;
        // A notice only when the row it replaces ended by an auto-reset (noticeFor):
        // never for the `new_command` this command just wrote.
        fresh = freshSession(message, row, replaced, policy, now);
        insertAt = statements.length;
        statements.push(...insertSession(fresh, null), ...startedEvents(fresh.id, now, eventStatus));
      }
      const answerSessionId = fresh?.id ?? row?.id ?? null;
      statements.push(markCommandSeen(toUserMessage(message, null), answerSessionId));
      const replyText = fresh
        ? COMMAND_REPLIES.started
        : stopped
          ? COMMAND_REPLIES.stopped
          : COMMAND_REPLIES.nothingToStop;
      const delivery = this.commandDelivery(message, answerSessionId, replyText, now);
      if (delivery) {
        // Staged before the batch, like a run: the answer is owed as soon as D1 has the command.
        statements.push(delivery.insert);
        outbox.stage(delivery.work.deliveryId, "delivery", delivery.work, now);
      }
      let results: number[];
      try {
        results = await db.batch(...statements);
      } catch (error) {
        // An answer whose batch may have committed stays: sending asks D1 for its row first.
        if (delivery && !mayHaveCommitted(error)) outbox.unstage(delivery.work.deliveryId);
        throw error;
      }
      if (endedAs && results[0] === 1) countEnded(endedAs);
      if (row) {
        // Its waiting messages were recorded as not dispatched in the batch: none is carried on.
        dropEnded(this.ctx, row.id);
        stageEvents(this.ctx, row.id, now);
      }
      if (fresh && results[insertAt] !== 1) {
        if (delivery) outbox.unstage(delivery.work.deliveryId);
        continue;
      }
      if (delivery) this.ctx.confirmedAnswers.add(delivery.work.deliveryId);
      if (fresh) {
        metrics.sessions_created += 1;
        entry.adopt(entryFromNew(fresh, message, fresh.replaced));
        stageEvents(this.ctx, fresh.id, now);
        entry.markActive(policy, now);
        if (row && !endedAs && isRecoverable(row.endReason as EndReason)) {
          // The replaced row stays recoverable until its deadline; watch it there.
          const due = deadline(policy, row.lastActiveAt);
          if (due !== null) outbox.stage(`check_${row.id}`, "check", { sessionId: row.id }, due, true);
        }
      } else if (row && endedAs) {
        entry.setDeadline(null);
      }
      return {
        status: 200,
        body: { accepted: true, session_id: answerSessionId, duplicate: false, command_reply: replyText },
      };
    }
    throw new RoutingUnsettled("command");
  }

  /** The chat answer of a command, unless the platform gives it in the webhook response itself. */
  private commandDelivery(message: RoutedMessage, sessionId: string | null, text: string, now: number) {
    const sender = senderFor(message.replyTo.platform);
    if (!sessionId || message.replyTo.answersCommandsInline) return null;
    if (!sender?.canDeliver(message.replyTo, configFor(this.ctx), effectiveEnv(this.ctx.env))) return null;
    const work: DeliveryWork = {
      deliveryId: newId("dl"),
      sessionId,
      sessionKey: message.sessionKey,
      platform: message.replyTo.platform,
      kind: "command",
      text,
      notice: null,
      eventId: message.eventId,
      target: message.replyTo,
    };
    const insert = insertDelivery(
      deliveryRow(work, {
        runId: null,
        status: "pending",
        attempts: 0,
        lastStatus: null,
        lastError: null,
        target: JSON.stringify(message.replyTo),
        createdAt: now,
      }),
    );
    return { work, insert };
  }
}
