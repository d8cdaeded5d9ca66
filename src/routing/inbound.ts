/**
 * Inbound messages: one routed message stored in the one session it may go to
 * (spec invariants 1, 2, 5 and 9), its hand-off staged in the outbox before D1
 * sees the message.
 */
import { mayHaveCommitted, type Statement } from "../db/client";
import { endedEvents, startedEvents } from "../db/events";
import { markEndedNotDispatched } from "../db/overlap";
import { revokeRuns } from "../db/runs";
import type { SessionRow } from "../db/schema";
import {
  appendUserMessage,
  insertSession,
  promoteExpired,
  reopenRecoverable,
  selectDedupe,
  selectNewestForKey,
  selectSession,
  type DedupeMark,
  type NewSession,
} from "../db/sessions";
import { parseCommand } from "../domain/commands";
import type { RoutedMessage } from "../domain/inbound";
import { deadline, liveSince, type ResetPolicy } from "../domain/reset-policy";
import { decide, type Replaced } from "../domain/routing-decision";
import { newId } from "../ids";
import { countEnded, metrics } from "../metrics";
import {
  dispatchWork,
  eventStatusFor,
  freshSession,
  MAX_ROUTING_ATTEMPTS,
  RoutingUnsettled,
  stageEvents,
  type RouterContext,
} from "./context";
import type { Commands } from "./commands";
import { dropEnded, dropRevokedRuns, type Queue } from "./queue";
import { entryFromNew, entryFromRow } from "./entry";
import type { AcceptedBody, RoutingDecisionName, RpcResult } from "./results";
import type { Settlement } from "./settlement";
import { toUserMessage, type RunWork } from "./work";

/** Where a routed message went, and which routing decision took it there (logged per message). */
interface StoredMessage {
  sessionId: string;
  duplicate: boolean;
  work: RunWork;
  decision: Exclude<RoutingDecisionName, "command">;
}

export class Inbound {
  constructor(
    private readonly ctx: RouterContext,
    private readonly settlement: Settlement,
    private readonly commands: Commands,
    private readonly queue: Queue,
  ) {}

  /** Routes one verified inbound message (or command) for this object's key. */
  async route(message: RoutedMessage, policy: ResetPolicy): Promise<RpcResult<AcceptedBody>> {
    const command = parseCommand(message.text);
    if (!command) return this.storeAndStage(message, policy);
    const answered = await this.commands.run(command, message, policy);
    if (answered.status === 200) answered.body.decision = "command";
    return answered;
  }

  /** Stores one message (not a command) and stages its hand-off. */
  async storeAndStage(
    message: RoutedMessage,
    policy: ResetPolicy,
    runId = newId("run"),
  ): Promise<RpcResult<AcceptedBody>> {
    const { outbox, entry } = this.ctx;
    const now = message.receivedAt;
    const expected = entry.entry?.sessionId ?? this.queue.sessionWithWork();
    if (this.queue.shouldWait(message, expected)) return this.storeWaiting(message, policy, runId);
    // Stage the hand-off before D1 sees the message: the output gate makes this write
    // durable first, so a stored message can never be left without its hand-off.
    const predicted = entry.entry;
    const work = dispatchWork(runId, message, {
      sessionId: predicted?.sessionId ?? "",
      isNew: predicted?.firstRunPending ?? true,
      parentId: predicted?.parentId ?? null,
      reset: predicted?.firstRunPending ? predicted.reset : null,
    });
    outbox.stage(work.runId, "run", work, now);
    let stored: StoredMessage;
    try {
      stored = await this.storeMessage(message, work, policy);
    } catch (error) {
      // Removed only when D1 surely stored nothing: a batch that may have committed
      // keeps its hand-off, which confirming asks D1 about (the platform's retry is then
      // a duplicate, so nothing else would hand the message over).
      if (error instanceof RoutingUnsettled || !mayHaveCommitted(error)) outbox.unstage(work.runId);
      throw error;
    }
    const decision = stored.decision;
    if (stored.duplicate) {
      outbox.unstage(work.runId);
      metrics.duplicates += 1;
      return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: true, decision } };
    }
    if (stored.work !== work) outbox.checkpoint(outbox.get(work.runId, "run")!, { payload: stored.work });
    this.ctx.confirmedRuns.add(work.runId);
    metrics.messages_routed += 1;
    return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: false, decision } };
  }

  /**
   * Stores a message that waits for a run (spec "Overlapping messages": a run of the
   * entry's session is unfinished). It is staged in the waiting list before D1 sees
   * it, as a hand-off is, and stored with no `run_id`: the webhook's answer and its
   * cost are those of any message. Should it land in another session (the entry's
   * had ended), nothing is unfinished there, and its run is staged at once.
   */
  private async storeWaiting(
    message: RoutedMessage,
    policy: ResetPolicy,
    runId: string,
  ): Promise<RpcResult<AcceptedBody>> {
    const { outbox, entry, waiting } = this.ctx;
    const now = message.receivedAt;
    const predicted = {
      sessionId: entry.entry?.sessionId ?? this.queue.sessionWithWork() ?? "",
      parentId: entry.entry?.parentId ?? null,
    };
    const work = dispatchWork(runId, message, {
      sessionId: predicted.sessionId,
      isNew: false,
      parentId: predicted.parentId,
      reset: null,
    });
    // Storing claims the session's first run for this message's run; a waiting message
    // has none, so the claim is given back for the run that will carry it.
    const firstPending = entry.entry?.firstRunPending ?? false;
    const added = waiting.add(predicted.sessionId, message);
    // A batch that throws may still have committed (the platform's retry is then a
    // duplicate): the row stays unconfirmed, and the pump asks D1's dedupe mark
    // whether the message was stored (carried) or not (dropped).
    const stored = await this.storeMessage(message, work, policy, null);
    const decision = stored.decision;
    if (stored.duplicate) {
      if (added) waiting.remove([message.eventId]);
      metrics.duplicates += 1;
      return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: true, decision } };
    }
    const debounced = this.queue.settingsFor(message.platform, message.chatType).debounce_ms > 0;
    if (stored.sessionId === predicted.sessionId) {
      waiting.confirm(message.eventId, stored.sessionId);
      // The reopen revoked the row's runs (an SQL end had not): what this object still
      // counted unfinished holds nothing back, and the alarm carries what waits at once.
      if (decision === "reopen") dropRevokedRuns(this.ctx, stored.sessionId, now);
      // stored.work.isNew: an entry rebuilt from D1 (it had been forgotten) made the claim.
      if (firstPending || stored.work.isNew) entry.update({ firstRunPending: true });
    } else if (debounced) {
      // A new session: the message waits there for its window (the end of the old one dropped its row).
      waiting.add(stored.sessionId, message);
      waiting.confirm(message.eventId, stored.sessionId);
      // Its first run, dispatched by the alarm, is still the session's first (is_new, reset).
      if (stored.work.isNew) entry.update({ firstRunPending: true });
    } else {
      // One synchronous step: off the list, into the outbox as the run that carries it.
      waiting.remove([message.eventId]);
      outbox.stage(runId, "run", { ...stored.work, messages: [message] }, now);
      this.ctx.confirmedRuns.add(runId);
    }
    metrics.messages_routed += 1;
    return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: false, decision } };
  }

  /**
   * Stores the message in the one session it may go to. The steady state is one
   * batch on the entry's session; anything else (no entry, an ended or expired row,
   * a duplicate) rereads the row and decides, and a conditional statement that
   * misses sends it round again.
   */
  private async storeMessage(
    message: RoutedMessage,
    work: RunWork,
    policy: ResetPolicy,
    carriedBy: string | null = work.runId,
  ): Promise<StoredMessage> {
    const { entry } = this.ctx;
    const now = message.receivedAt;
    const since = liveSince(policy, now);
    const userMessage = toUserMessage(message, carriedBy);
    const ingress = this.ctx.db.on("ingress");
    const eventStatus = eventStatusFor(this.ctx);
    let alreadyRead: [SessionRow[], DedupeMark[]] | null = null;
    const current = entry.entry;
    if (current) {
      const [bumped] = await ingress.batch(...appendUserMessage(current.sessionId, userMessage, since));
      if (bumped === 1) {
        // The staged context was predicted from this same entry, so it stands as written.
        if (current.firstRunPending) entry.update({ firstRunPending: false });
        entry.markActive(policy, now);
        return { sessionId: current.sessionId, duplicate: false, work, decision: "append" };
      }
    } else {
      // No entry most often means a brand-new key: start its first session in the same
      // batch that reads the key's newest row, so that a new key costs one round trip too.
      const session = freshSession(message, null, null, policy, now);
      const results = await ingress.batch(
        ...insertSession(session, userMessage, null),
        ...startedEvents(session.id, now, eventStatus),
        selectNewestForKey(ingress, message.sessionKey),
        selectDedupe(message.platform, message.eventId, now),
      );
      if (results[0] === 1) return { ...this.started(session, message, null, work, policy, now), decision: "fresh" };
      alreadyRead = [results.at(-2) as SessionRow[], results.at(-1) as DedupeMark[]];
    }
    // Once a fresh session's insert missed, the entry is stale: the key's newest row decides.
    let readNewest = false;
    for (let attempt = 0; attempt < MAX_ROUTING_ATTEMPTS; attempt++) {
      const known = entry.entry;
      const [rows, seen] =
        alreadyRead ??
        (await ingress.batch(
          known && !readNewest
            ? selectSession(ingress, known.sessionId)
            : selectNewestForKey(ingress, message.sessionKey),
          selectDedupe(message.platform, message.eventId, now),
        ));
      alreadyRead = null;
      if (seen[0]) {
        await this.repairEntry(seen[0].session_id, message, work.runId);
        return { sessionId: seen[0].session_id ?? "", duplicate: true, work, decision: "duplicate" };
      }
      const row = rows[0] ?? null;
      const decision = decide(row, policy, now);
      // A live row past its deadline whose turn is still in progress is not ended by
      // the policy (invariant 6): the message joins it, as the alarm would not end it.
      const heldOpen =
        decision.kind === "fresh" &&
        decision.expire !== null &&
        row?.endReason === null &&
        (await this.settlement.leaseOf(row, now, work.runId, carriedBy === null ? message.eventId : null)).held;
      if (decision.kind === "append" || decision.kind === "reopen" || heldOpen) {
        const reopen =
          decision.kind === "reopen"
            ? [
                // An end written by SQL did not revoke the row's runs: they end with it
                // before it reopens (a no-op when the gateway ended it).
                revokeRuns(decision.sessionId),
                reopenRecoverable(decision.sessionId, message.sessionKey, since, deadline(policy, row!.lastActiveAt)),
              ]
            : [];
        const results = await ingress.batch(
          ...reopen,
          ...appendUserMessage(row!.id, userMessage, heldOpen ? Number.NEGATIVE_INFINITY : since),
        );
        if (results[reopen.length] !== 1) {
          // The row changed under us, or it is not the key's newest (a stale entry): the
          // key's newest row decides the next attempt.
          readNewest = true;
          continue;
        }
        entry.adopt(entryFromRow(row!, message, this.ctx.outbox.hasRunOf(row!.id, work.runId)));
        entry.markActive(policy, now);
        return {
          sessionId: row!.id,
          duplicate: false,
          work: this.claimFirstRun({ ...work, sessionId: row!.id }),
          // Held open: the message joined the live row, whatever the policy said of it.
          decision: heldOpen ? "append" : decision.kind,
        };
      }
      const session = freshSession(message, row, decision.replaced, policy, now);
      const statements: Statement<number>[] = [];
      if (decision.expire) {
        statements.push(
          promoteExpired(decision.expire.sessionId, decision.expire.reason, since, now),
          revokeRuns(decision.expire.sessionId),
        );
      }
      // What waited in the old session is never carried into the new one.
      if (row) statements.push(markEndedNotDispatched(row.id), ...endedEvents(row.id, now, eventStatus));
      const insertAt = statements.length;
      statements.push(...insertSession(session, userMessage), ...startedEvents(session.id, now, eventStatus));
      const results = await ingress.batch(...statements);
      if (decision.expire && results[0] === 1) countEnded(decision.expire.reason);
      if (row) {
        dropEnded(this.ctx, row.id);
        stageEvents(this.ctx, row.id, now);
      }
      if (results[insertAt] !== 1) {
        readNewest = true;
        continue;
      }
      // "promoted": the old session was past its deadline and this message ended it.
      const kind = decision.expire ? "promoted" : "fresh";
      return { ...this.started(session, message, decision.replaced, work, policy, now), decision: kind };
    }
    throw new RoutingUnsettled("routing");
  }

  /**
   * A platform's resend whose dedupe mark names another session than the entry's:
   * the object was killed after D1 stored a new session and before the entry
   * adopted it. The key's newest row (invariant 5) becomes the entry again.
   */
  private async repairEntry(markedSessionId: string | null, message: RoutedMessage, ownRunId: string): Promise<void> {
    const { entry } = this.ctx;
    const current = entry.entry;
    if (!current || !markedSessionId || markedSessionId === current.sessionId) return;
    const db = this.ctx.db.on("ingress");
    const [[newest]] = await db.batch(selectNewestForKey(db, message.sessionKey));
    if (!newest || newest.id === current.sessionId) return;
    entry.adopt(entryFromRow(newest, message, this.ctx.outbox.hasRunOf(newest.id, ownRunId)));
    // Its deadline is learnt by the alarm, which reads the row again.
    entry.setDeadline(undefined);
  }

  /** A session was just inserted with this message as its first: it becomes the entry's. */
  private started(
    session: NewSession,
    message: RoutedMessage,
    replaced: Replaced | null,
    work: RunWork,
    policy: ResetPolicy,
    now: number,
  ): { sessionId: string; duplicate: false; work: RunWork } {
    metrics.sessions_created += 1;
    this.ctx.entry.adopt(entryFromNew(session, message, replaced));
    stageEvents(this.ctx, session.id, now);
    this.ctx.entry.markActive(policy, now);
    return { sessionId: session.id, duplicate: false, work: this.claimFirstRun({ ...work, sessionId: session.id }) };
  }

  /** The run context of the first run in the entry's session, which the entry then no longer owes. */
  private claimFirstRun(work: RunWork): RunWork {
    const entry = this.ctx.entry.entry!;
    const claimed = {
      ...work,
      isNew: entry.firstRunPending,
      parentId: entry.parentId,
      reset: entry.firstRunPending ? entry.reset : null,
    };
    if (entry.firstRunPending) this.ctx.entry.update({ firstRunPending: false });
    return claimed;
  }
}
