/**
 * The routing object: one Durable Object per session key. It holds the key's
 * routing entry (which session is live) and one alarm, and it is the only writer
 * of its key's sessions, so every change to them is serialised here.
 *
 * For each message it checks the entry's D1 row before reuse, applies the reset
 * policy against D1's own last activity, and stores the message in one D1 batch.
 * Work that follows the acknowledgement (the agent hand-off, the reply, lifecycle
 * events) is written to the object's outbox first, then drained in the background
 * of the request that staged it (OUTBOX_DRAIN=inline) or by the alarm, which is
 * also set no later than the live session's deadline.
 */
import { DurableObject } from "cloudflare:workers";
import { now as clockNow } from "../clock";
import { configOf, effectiveEnv, type Config } from "../config";
import { randomToken, sha256Hex } from "../crypto";
import { Database, type Statement } from "../db/client";
import {
  endedEvents,
  startedEvents,
  selectDueSessionEvents,
  selectNextSessionEventAt,
  type InitialStatus,
} from "../db/events";
import { insertDelivery, recordDeliveryAttempt, requeueDelivery, selectDelivery } from "../db/deliveries";
import {
  dispatchRun,
  markRunFailed,
  moveRuns,
  recordInstantTurn,
  recordReply,
  revokeRuns,
  selectOpenRuns,
  selectRun,
  markRunAccepted,
  recordRunRetry,
  replyDeliveryId,
  requeueFailedRun,
  selectSessionOfRun,
} from "../db/runs";
import type { DeliveryRow, RunRow, SessionRow } from "../db/schema";
import {
  appendUserMessage,
  clearSweepAt,
  endLive,
  insertSession,
  markCommandSeen,
  promoteExpired,
  reopenRecoverable,
  selectDedupe,
  selectNewestForKey,
  selectSession,
  setSweepAt,
  type DedupeMark,
  type NewSession,
} from "../db/sessions";
import { COMMAND_REPLIES, parseCommand, type Command } from "../domain/commands";
import { isRecoverable, noticeFor, type EndReason } from "../domain/end-reasons";
import type { ReplyTarget, RoutedMessage } from "../domain/inbound";
import { isCurrentRun, ownership, revocationFor, type NotOwnedReason } from "../domain/ownership";
import { cronSessionKey } from "../domain/session-key";
import { makeRunToken } from "../domain/run-token";
import { holdOf, leaseUntil, nextLook, RUN_LEASE_MS as TURN_LEASE_MS } from "../domain/turn-hold";
import { decide, type Replaced } from "../domain/routing-decision";
import { deadline, expiryReason, liveSince, resolvePolicy, type ResetPolicy } from "../domain/reset-policy";
import { handToAgent } from "../agent/dispatch";
import { echoAgent } from "../agent/echo";
import { attemptEvent } from "../hooks/deliver";
import { backoffDelay } from "../http/backoff";
import { describe } from "../http/outbound";
import { errorSummary, log } from "../log";
import { newId } from "../ids";
import { countEnded, metrics } from "../metrics";
import { senderFor } from "../platforms";
import { BoundedSet } from "./bounded-set";
import { Mutex } from "./mutex";
import {
  conflict,
  notFound,
  notOwned,
  unavailable,
  type AcceptedBody,
  type EntryView,
  type RoutingDecisionName,
  type ExplainState,
  type ErrorBody,
  type RpcResult,
} from "./results";
import {
  agentRequest,
  deliveryWork,
  newRunOf,
  entryFromNew,
  entryFromRow,
  toUserMessage,
  type DeliveryWork,
  type CheckWork,
  type EventsWork,
  type RecordedReply,
  type RunWork,
} from "./work";
import { RouterStorage, type Entry, type OutboxItem } from "./storage";

/**
 * A run the agent accepted (202) must be heard from (a heartbeat or its reply)
 * within this long, or its owner is taken to have vanished.
 */
export const RUN_LEASE_MS = TURN_LEASE_MS;

/** A message is never stored after this many conflicting rereads; the platform retries instead. */
const MAX_ROUTING_ATTEMPTS = 3;

/** Where a routed message went, and which routing decision took it there (logged per message). */
interface StoredMessage {
  sessionId: string;
  duplicate: boolean;
  work: RunWork;
  decision: Exclude<RoutingDecisionName, "command">;
}

/** How long one drain keeps picking up newly due outbox items while others are in flight. */
const DRAIN_WINDOW_MS = 60_000;
/**
 * With OUTBOX_DRAIN=inline (the default), staged work is drained at once, in the
 * background of the request that staged it; the alarm comes this much later as the
 * safety net (should the object be evicted before it finished), so a busy key costs
 * an alarm per burst, not per message.
 */
const INLINE_GRACE_MS = 10_000;
/**
 * What an object remembers of staged work it saw stored. A cache: anything it has
 * forgotten is asked of D1 again, so a busy object that is never evicted stays small.
 */
const CONFIRMED_CACHE_SIZE = 1_000;
/** Hand-offs are retried for a day; after that the run is marked failed. */
const RUN_GIVE_UP_MS = 24 * 60 * 60_000;
/** Platform deliveries are retried this many times before they are marked failed. */
const DELIVERY_MAX_ATTEMPTS = 10;

/** The platform name of scheduled jobs' sessions (`cron:{job_id}:{run_id}`). */
export const CRON_PLATFORM = "cron";
const isCronSession = (row: Pick<SessionRow, "platform">) => row.platform === CRON_PLATFORM;

export class SessionRouter extends DurableObject<Env> {
  private readonly mutex = new Mutex();
  private readonly store: RouterStorage;
  private readonly db: Database;
  private entry: Entry | null;
  /** Deadline of the live session as last computed; undefined until known after a wake. */
  private liveDeadline: number | null | undefined = undefined;
  /** The alarm as last set (undefined until read after a wake). */
  private alarmAt: number | null | undefined = undefined;
  /** Runs staged and then stored while this object is in memory (no need to ask D1 again). */
  private readonly confirmedRuns = new BoundedSet(CONFIRMED_CACHE_SIZE);
  /** Command answers staged and then stored while this object is in memory, likewise. */
  private readonly confirmedAnswers = new BoundedSet(CONFIRMED_CACHE_SIZE);
  /** Consecutive failures to read the live session in the alarm, for its own backoff. */
  private settleFailures = 0;
  /** The drain running now, if any (in the background of a request, or in the alarm). */
  private activeDrain: Promise<void> | null = null;
  /** Wakes the running drain so newly staged work starts without waiting. */
  private wakeDrain: (() => void) | null = null;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.store = new RouterStorage(ctx.storage.sql);
    this.db = new Database(env.DB, "background");
    this.entry = this.store.readEntry();
    // Storage only, no network: safe inside blockConcurrencyWhile.
    void ctx.blockConcurrencyWhile(async () => {
      this.alarmAt = await ctx.storage.getAlarm();
    });
  }

  private get config(): Config {
    return configOf(this.env);
  }

  private policy(platform: string, chatType: string): ResetPolicy {
    return resolvePolicy(this.config.reset, platform, chatType);
  }

  private get eventStatus(): InitialStatus {
    return this.config.hookUrls.length > 0 ? "pending" : "skipped";
  }

  // ---------------------------------------------------------------- ingress

  /** Routes one verified inbound message (or command) for this object's key. */
  async route(message: Omit<RoutedMessage, "receivedAt">): Promise<RpcResult<AcceptedBody>> {
    return this.mutex.run(async () => {
      const routed: RoutedMessage = { ...message, receivedAt: clockNow() };
      const policy = this.policy(routed.platform, routed.chatType);
      const command = parseCommand(routed.text);
      try {
        if (!command) return await this.storeAndStage(routed, policy);
        const answered = await this.runCommand(command, routed, policy);
        if (answered.status === 200) answered.body.decision = "command";
        return answered;
      } catch (error) {
        log.error("route failed", { session_key: routed.sessionKey, error: describe(error) });
        return unavailable(error);
      } finally {
        await this.rearm(routed.receivedAt);
      }
    });
  }

  private async storeAndStage(
    message: RoutedMessage,
    policy: ResetPolicy,
    runId = newId("run"),
  ): Promise<RpcResult<AcceptedBody>> {
    const now = message.receivedAt;
    // Stage the hand-off before D1 sees the message: the output gate makes this write
    // durable first, so a stored message can never be left without its hand-off.
    const predicted = this.entry;
    const work: RunWork = {
      stage: "dispatch",
      runId,
      token: makeRunToken(runId, randomToken()),
      sessionId: predicted?.sessionId ?? "",
      isNew: predicted?.firstRunPending ?? true,
      parentId: predicted?.parentId ?? null,
      reset: predicted?.firstRunPending ? predicted.reset : null,
      message,
    };
    this.stage(work.runId, "run", work, now);
    let stored: StoredMessage;
    try {
      stored = await this.storeMessage(message, work, policy);
    } catch (error) {
      this.store.delete(work.runId);
      throw error;
    }
    const decision = stored.decision;
    if (stored.duplicate) {
      this.store.delete(work.runId);
      metrics.duplicates += 1;
      return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: true, decision } };
    }
    if (stored.work !== work) this.store.put({ ...this.store.get(work.runId)!, payload: stored.work });
    this.confirmedRuns.add(work.runId);
    metrics.messages_routed += 1;
    return { status: 200, body: { accepted: true, session_id: stored.sessionId, duplicate: false, decision } };
  }

  /**
   * Stores the message in the one session it may go to. The steady state is one
   * batch on the entry's session; anything else (no entry, an ended or expired row,
   * a duplicate) rereads the row and decides, and a conditional statement that
   * misses sends it round again.
   */
  private async storeMessage(message: RoutedMessage, work: RunWork, policy: ResetPolicy): Promise<StoredMessage> {
    const now = message.receivedAt;
    const since = liveSince(policy, now);
    const userMessage = toUserMessage(message, work.runId);
    const ingress = this.db.on("ingress");
    let alreadyRead: [SessionRow[], DedupeMark[]] | null = null;
    if (this.entry) {
      const [bumped] = await ingress.batch(...appendUserMessage(this.entry.sessionId, userMessage, since));
      if (bumped === 1) {
        // The staged context was predicted from this same entry, so it stands as written.
        if (this.entry.firstRunPending) this.adopt({ ...this.entry, firstRunPending: false });
        this.markActive(policy, now);
        return { sessionId: this.entry.sessionId, duplicate: false, work, decision: "append" };
      }
    } else {
      // No entry most often means a brand-new key: start its first session in the same
      // batch that reads the key's newest row, so that a new key costs one round trip too.
      const session = this.freshSession(message, null, null, policy, now);
      const results = await ingress.batch(
        ...insertSession(session, userMessage, null, { keyMustBeNew: true }),
        ...startedEvents(session.id, now, this.eventStatus),
        selectNewestForKey(ingress, message.sessionKey),
        selectDedupe(message.platform, message.eventId, now),
      );
      if (results[0] === 1) return { ...this.started(session, message, null, work, policy, now), decision: "fresh" };
      alreadyRead = [results.at(-2) as SessionRow[], results.at(-1) as DedupeMark[]];
    }
    // Once a fresh session's insert missed, the entry is stale: the key's newest row decides.
    let readNewest = false;
    for (let attempt = 0; attempt < MAX_ROUTING_ATTEMPTS; attempt++) {
      const [rows, seen] =
        alreadyRead ??
        (await ingress.batch(
          this.entry && !readNewest
            ? selectSession(ingress, this.entry.sessionId)
            : selectNewestForKey(ingress, message.sessionKey),
          selectDedupe(message.platform, message.eventId, now),
        ));
      alreadyRead = null;
      if (seen[0]) {
        await this.repairEntry(seen[0].session_id, message);
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
        (await this.leaseOf(row, now, work.runId)).held;
      if (decision.kind === "append" || decision.kind === "reopen" || heldOpen) {
        const reopen =
          decision.kind === "reopen"
            ? [reopenRecoverable(decision.sessionId, since, deadline(policy, row!.lastActiveAt))]
            : [];
        const results = await ingress.batch(
          ...reopen,
          ...appendUserMessage(row!.id, userMessage, heldOpen ? Number.NEGATIVE_INFINITY : since),
        );
        if (results[reopen.length] !== 1) continue;
        this.adopt(entryFromRow(row!, message));
        this.markActive(policy, now);
        return {
          sessionId: row!.id,
          duplicate: false,
          work: this.claimFirstRun({ ...work, sessionId: row!.id }),
          decision: decision.kind,
        };
      }
      const session = this.freshSession(message, row, decision.replaced, policy, now);
      const statements: Statement<number>[] = [];
      if (decision.expire) {
        statements.push(
          promoteExpired(decision.expire.sessionId, decision.expire.reason, since, now),
          revokeRuns(decision.expire.sessionId),
        );
      }
      if (row) statements.push(...endedEvents(row.id, now, this.eventStatus));
      const insertAt = statements.length;
      statements.push(...insertSession(session, userMessage), ...startedEvents(session.id, now, this.eventStatus));
      const results = await ingress.batch(...statements);
      if (decision.expire && results[0] === 1) countEnded(decision.expire.reason);
      if (row) this.stageEvents(row.id, now);
      if (results[insertAt] !== 1) {
        readNewest = true;
        continue;
      }
      // "promoted": the old session was past its deadline and this message ended it.
      const kind = decision.expire ? "promoted" : "fresh";
      return { ...this.started(session, message, decision.replaced, work, policy, now), decision: kind };
    }
    throw new Error(`routing did not settle after ${MAX_ROUTING_ATTEMPTS} attempts`);
  }

  /**
   * A platform's resend whose dedupe mark names another session than the entry's:
   * the object was killed after D1 stored a new session and before the entry
   * adopted it. The key's newest row (invariant 5) becomes the entry again.
   */
  private async repairEntry(markedSessionId: string | null, message: RoutedMessage): Promise<void> {
    if (!this.entry || !markedSessionId || markedSessionId === this.entry.sessionId) return;
    const db = this.db.on("ingress");
    const [[newest]] = await db.batch(selectNewestForKey(db, message.sessionKey));
    if (!newest || newest.id === this.entry.sessionId) return;
    this.adopt(entryFromRow(newest, message));
    // Its deadline is learnt by the alarm, which reads the row again.
    this.liveDeadline = undefined;
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
    this.adopt(entryFromNew(session, message, replaced));
    this.stageEvents(session.id, now);
    this.markActive(policy, now);
    return { sessionId: session.id, duplicate: false, work: this.claimFirstRun({ ...work, sessionId: session.id }) };
  }

  private freshSession(
    message: Pick<RoutedMessage, "sessionKey" | "platform" | "chatType">,
    previous: SessionRow | null,
    replaced: Replaced | null,
    policy: ResetPolicy,
    now: number,
  ): NewSession {
    // Keep started_at strictly increasing per key, so "newest row" is never a tie.
    const startedAt = Math.max(now, (previous?.startedAt ?? Number.NEGATIVE_INFINITY) + 1);
    return {
      id: newId("ses"),
      sessionKey: message.sessionKey,
      platform: message.platform,
      chatType: message.chatType,
      startedAt,
      parentSessionId: null,
      replaced,
      noticePending: replaced ? noticeFor(replaced.reason, replaced.hadActivity) : null,
      sweepAt: deadline(policy, startedAt),
    };
  }

  /** The run context of the first run in the entry's session, which the entry then no longer owes. */
  private claimFirstRun(work: RunWork): RunWork {
    const entry = this.entry!;
    const claimed = {
      ...work,
      isNew: entry.firstRunPending,
      parentId: entry.parentId,
      reset: entry.firstRunPending ? entry.reset : null,
    };
    if (entry.firstRunPending) this.adopt({ ...entry, firstRunPending: false });
    return claimed;
  }

  // ---------------------------------------------------------------- commands

  private async runCommand(
    command: Command,
    message: RoutedMessage,
    policy: ResetPolicy,
  ): Promise<RpcResult<AcceptedBody>> {
    const now = message.receivedAt;
    const since = liveSince(policy, now);
    const db = this.db.on("ingress");
    for (let attempt = 0; attempt < MAX_ROUTING_ATTEMPTS; attempt++) {
      const [rows, seen] = await db.batch(
        this.entry ? selectSession(db, this.entry.sessionId) : selectNewestForKey(db, message.sessionKey),
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
          !(row.endReason === null && (await this.leaseOf(row, now)).held)
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
      if (row) statements.push(revokeRuns(row.id), ...endedEvents(row.id, now, this.eventStatus));
      const stopped = command === "stop" && endedAs === "suspended";
      let fresh: NewSession | null = null;
      let insertAt = -1;
      if (command !== "stop") {
        const replaced = row
          ? { sessionId: row.id, reason: (endedAs ?? row.endReason) as EndReason, hadActivity: row.messageCount > 0 }
          : null;
        // A notice only when the row it replaces ended by an auto-reset (noticeFor):
        // never for the `new_command` this command just wrote.
        fresh = this.freshSession(message, row, replaced, policy, now);
        insertAt = statements.length;
        statements.push(...insertSession(fresh, null), ...startedEvents(fresh.id, now, this.eventStatus));
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
        this.stage(delivery.work.deliveryId, "delivery", delivery.work, now);
      }
      let results: number[];
      try {
        results = await db.batch(...statements);
      } catch (error) {
        if (delivery) this.store.delete(delivery.work.deliveryId);
        throw error;
      }
      if (endedAs && results[0] === 1) countEnded(endedAs);
      if (row) this.stageEvents(row.id, now);
      if (fresh && results[insertAt] !== 1) {
        if (delivery) this.store.delete(delivery.work.deliveryId);
        continue;
      }
      if (delivery) this.confirmedAnswers.add(delivery.work.deliveryId);
      if (fresh) {
        metrics.sessions_created += 1;
        this.adopt(entryFromNew(fresh, message, fresh.replaced));
        this.stageEvents(fresh.id, now);
        this.markActive(policy, now);
        if (row && !endedAs && isRecoverable(row.endReason as EndReason)) {
          // The replaced row stays recoverable until its deadline; watch it there.
          const due = deadline(policy, row.lastActiveAt);
          if (due !== null) {
            this.stage(`check_${row.id}`, "check", { sessionId: row.id } satisfies CheckWork, due, true);
          }
        }
      } else if (row && endedAs) {
        this.liveDeadline = null;
      }
      return {
        status: 200,
        body: { accepted: true, session_id: answerSessionId, duplicate: false, command_reply: replyText },
      };
    }
    throw new Error(`command did not settle after ${MAX_ROUTING_ATTEMPTS} attempts`);
  }

  /** The chat answer of a command, unless the platform gives it in the webhook response itself. */
  private commandDelivery(message: RoutedMessage, sessionId: string | null, text: string, now: number) {
    const sender = senderFor(message.replyTo.platform);
    if (!sessionId || message.replyTo.answersCommandsInline) return null;
    if (!sender?.canDeliver(message.replyTo, this.config, effectiveEnv(this.env))) return null;
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
    const insert = insertDelivery({
      id: work.deliveryId,
      sessionId,
      runId: null,
      eventId: message.eventId,
      platform: work.platform,
      kind: "command",
      status: "pending",
      attempts: 0,
      lastStatus: null,
      lastError: null,
      text,
      notice: null,
      target: JSON.stringify(message.replyTo),
      createdAt: now,
    });
    return { work, insert };
  }

  // ---------------------------------------------------------------- entry and alarm

  private adopt(entry: Entry): void {
    this.entry = entry;
    this.store.writeEntry(entry);
  }

  /** The live session just had activity at `now`: its deadline moves. */
  private markActive(policy: ResetPolicy, now: number): void {
    this.liveDeadline = deadline(policy, now);
  }

  /**
   * Writes one item to the outbox and makes sure the alarm comes by its due time.
   * Both writes are issued together, so on the ingress path they share one commit
   * before the D1 call leaves the object, and nothing is left to write after it.
   */
  private stage(id: string, kind: OutboxItem["kind"], payload: unknown, dueAt: number, replace = false): void {
    const item = { id, kind, payload, dueAt, attempts: 0, lastError: null, createdAt: clockNow() };
    if (replace) this.store.put(item);
    else this.store.add(item);
    if (this.config.outboxDrain === "inline") {
      this.armBy(dueAt + INLINE_GRACE_MS);
      this.kickDrain();
    } else {
      this.armBy(dueAt);
      this.wakeDrain?.();
    }
  }

  /** Starts draining in the background, or wakes the drain already running. */
  private kickDrain(): void {
    if (this.activeDrain) this.wakeDrain?.();
    else this.ctx.waitUntil(this.runDrain());
  }

  /**
   * One drain at a time: a caller while one runs wakes it and waits for it. When it
   * ends, the alarm is set to the exact next due time (retries keep their backoff).
   */
  private runDrain(): Promise<void> {
    if (this.activeDrain) {
      this.wakeDrain?.();
      return this.activeDrain;
    }
    this.activeDrain = (async () => {
      try {
        await this.drain();
      } finally {
        this.activeDrain = null;
        await this.mutex
          .run(() => this.rearm(clockNow()))
          .catch((error) => log.error("could not re-arm after draining", { error: describe(error) }));
      }
    })();
    return this.activeDrain;
  }

  /** Brings the alarm forward to `at` if it is not already due by then; never pushes it back. */
  private armBy(at: number): void {
    // An alarm set for "now" from inside alarm() is dropped by the local runtime.
    const target = Math.max(at, clockNow() + 1);
    if (this.alarmAt !== null && this.alarmAt !== undefined && this.alarmAt <= target) return;
    this.alarmAt = target;
    this.ctx.storage
      .setAlarm(target)
      .catch((error) => log.error("could not set the alarm", { error: describe(error) }));
  }

  /** Queues delivery of a session's pending lifecycle events (a no-op when it has none). */
  private stageEvents(sessionId: string, now: number): void {
    if (this.eventStatus === "skipped") return;
    // One item per session: staging it again brings it forward.
    this.stage(`events_${sessionId}`, "events", { sessionId } satisfies EventsWork, now, true);
  }

  /**
   * Sets the one alarm to the earliest due work: the live session's deadline (spec:
   * no later than it) or the next outbox item. An alarm already set earlier is left
   * alone (it fires, finds little to do, and re-arms), so a busy key does not
   * rewrite its alarm on every message.
   */
  private async rearm(now: number): Promise<void> {
    if (this.alarmAt === undefined) this.alarmAt = await this.ctx.storage.getAlarm();
    const nextDue = this.store.nextDueAt();
    // While a drain runs, it takes what is due; the alarm is only its safety net.
    const candidates = [nextDue !== null && this.activeDrain ? Math.max(nextDue, now + INLINE_GRACE_MS) : nextDue];
    if (this.liveDeadline !== undefined) candidates.push(this.liveDeadline);
    // The deadline is unknown (D1 could not be read): look again soon, backing off.
    else if (this.entry) candidates.push(now + backoffDelay(this.settleFailures + 1));
    const due = candidates.filter((t): t is number => t !== null);
    if (due.length === 0) {
      if (this.alarmAt !== null) await this.ctx.storage.deleteAlarm();
      this.alarmAt = null;
      return;
    }
    // An alarm set for "now" from inside alarm() is dropped by the local runtime.
    const at = Math.max(Math.min(...due), now + 1);
    if (this.alarmAt === null || this.alarmAt === undefined || this.alarmAt > at) {
      await this.ctx.storage.setAlarm(at);
      this.alarmAt = at;
    }
  }

  async alarm(): Promise<void> {
    const now = clockNow();
    this.alarmAt = null;
    await this.mutex
      .run(() => this.settleLiveSession(now))
      .catch((error) => {
        this.settleFailures += 1;
        this.liveDeadline = undefined;
        log.error("alarm: could not check the live session", {
          session_key: this.entry?.sessionKey,
          error: describe(error),
        });
      });
    await this.runDrain();
    await this.mutex.run(() => this.rearm(clockNow()));
  }

  /**
   * The alarm's deadline check (spec invariant 6): re-read the live session, end it
   * by its policy when due, otherwise learn its current deadline.
   */
  private async settleLiveSession(now: number): Promise<void> {
    if (!this.entry) {
      this.liveDeadline = null;
      return;
    }
    if (this.liveDeadline !== undefined && (this.liveDeadline === null || this.liveDeadline > now)) return;
    const [rows] = await this.db.batch(selectSession(this.db, this.entry.sessionId));
    const row = rows[0];
    this.liveDeadline = row ? await this.settleRow(row, now) : null;
    this.settleFailures = 0;
  }

  /**
   * Applies the policy to one row of this key against its real last activity: ends
   * it when expired (live or recoverable), ends a live one whose run owner vanished
   * (its lease ran out), writes the events of an end found out of band, and
   * otherwise records when to look at it next. Returns that time (null: never).
   */
  private async settleRow(row: SessionRow, now: number): Promise<number | null> {
    const policy = this.policy(row.platform, row.chatType);
    const reason = row.endReason as EndReason | null;
    if (reason !== null && !isRecoverable(reason)) {
      await this.db.batch(revokeRuns(row.id), clearSweepAt(row.id), ...endedEvents(row.id, now, this.eventStatus));
      this.stageEvents(row.id, now);
      return null;
    }
    const expired = expiryReason(policy, row.lastActiveAt, now);
    // Expiry waits for the turn in progress (invariant 6): look again when it is over.
    const held = expired && reason === null ? await this.leaseOf(row, now) : null;
    if (held?.held) {
      const next = held.until ?? this.outboxRunDue(row.id) ?? now + 1;
      if (row.sweepAt !== next) await this.db.batch(setSweepAt(row.id, next));
      return next;
    }
    if (expired) {
      const [promoted] = await this.db.batch(
        promoteExpired(row.id, expired, liveSince(policy, now), now),
        revokeRuns(row.id),
        ...endedEvents(row.id, now, this.eventStatus),
      );
      if (promoted === 1) countEnded(expired);
      this.stageEvents(row.id, now);
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
        await this.db.batch(setSweepAt(row.id, next));
        return next;
      }
      if (lease.until !== null) next = next === null ? lease.until : Math.min(next, lease.until);
    }
    if (row.sweepAt !== next) await this.db.batch(setSweepAt(row.id, next));
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
  private async leaseOf(
    row: SessionRow,
    now: number,
    exceptRunId: string | null = null,
  ): Promise<{ held: boolean; lapsed: boolean; until: number | null }> {
    if (this.outboxRunDue(row.id, exceptRunId) !== null) return { held: true, lapsed: false, until: null };
    const [runs] = await this.db.batch(selectOpenRuns(row.id));
    const hold = holdOf(runs, row.currentRunId, now);
    // A cron session with no open run left has vanished too.
    if (!hold.held && !hold.lapsed && isCronSession(row)) return { ...hold, lapsed: true };
    return hold;
  }

  /** The earliest due time of a hand-off of this session still in the outbox, if any. */
  private outboxRunDue(sessionId: string, exceptRunId: string | null = null): number | null {
    const due = this.store
      .all()
      .filter((item) => item.kind === "run" && item.id !== exceptRunId)
      .filter((item) => (item.payload as RunWork).sessionId === sessionId)
      .map((item) => item.dueAt);
    return due.length === 0 ? null : Math.min(...due);
  }

  /**
   * Ends a live session for `reason` with its events and run revocations, first
   * reason wins. The one path every explicit end takes (operator, agent, cron,
   * orphan reaping).
   */
  private async endNow(
    sessionId: string,
    reason: EndReason,
    now: number,
    alongside: Statement<number>[] = [],
  ): Promise<{ changed: boolean; row: SessionRow | null }> {
    const [changed, , , , , rows] = await this.db.batch(
      endLive(sessionId, reason, isRecoverable(reason), now),
      revokeRuns(sessionId),
      ...endedEvents(sessionId, now, this.eventStatus),
      selectSession(this.db, sessionId),
      ...alongside,
    );
    const row = rows[0] ?? null;
    if (changed === 1 && row) {
      countEnded(reason);
      this.stageEvents(sessionId, now);
      if (this.entry?.sessionId === sessionId) {
        this.liveDeadline = isRecoverable(reason)
          ? deadline(this.policy(row.platform, row.chatType), row.lastActiveAt)
          : null;
      }
    }
    return { changed: changed === 1, row };
  }

  /** The agent took the turn and answers later (202): expect to hear from it within the lease. */
  private async expectHeartbeats(sessionId: string, runId: string, now: number): Promise<void> {
    // The lease runs from the acceptance, not from the first attempt (which may be
    // long ago when the agent was down): a late acceptance is not a vanished owner.
    const heard = markRunAccepted(runId, now);
    if (this.entry?.sessionId !== sessionId) {
      await this.db.batch(heard);
      return;
    }
    const until = now + RUN_LEASE_MS;
    const next =
      this.liveDeadline === undefined || this.liveDeadline === null ? until : Math.min(this.liveDeadline, until);
    this.liveDeadline = next;
    await this.db.batch(heard, setSweepAt(sessionId, next));
  }

  // ---------------------------------------------------------------- outbox

  /**
   * Runs due outbox items concurrently; a failing item records its attempt and
   * never fails the others. While items are in flight (a slow agent), items that
   * become due (a new message staged by `route`, which wakes this loop) start at
   * once instead of waiting for the next alarm. New items stop being picked up
   * after DRAIN_WINDOW_MS so that one alarm never runs for ever.
   */
  private async drain(): Promise<void> {
    const started = clockNow();
    const running = new Map<string, { kind: OutboxItem["kind"]; done: Promise<void> }>();
    try {
      for (;;) {
        const now = clockNow();
        if (now - started < DRAIN_WINDOW_MS) {
          for (const item of this.store.due(now)) {
            if (running.has(item.id)) continue;
            // Lifecycle events go out one session at a time, in the order they were
            // staged (an old session's end before its replacement's start).
            if (item.kind === "events" && [...running.values()].some((r) => r.kind === "events")) continue;
            const done = this.process(item, now)
              .catch((error) => {
                log.error("outbox item failed", { kind: item.kind, item_id: item.id, error: describe(error) });
                this.reschedule(item, describe(error), null, now);
              })
              .finally(() => running.delete(item.id));
            running.set(item.id, { kind: item.kind, done });
          }
        }
        if (running.size === 0) return;
        const woken = new Promise<void>((resolve) => (this.wakeDrain = resolve));
        await Promise.race([woken, ...[...running.values()].map((r) => r.done)]);
        this.wakeDrain = null;
      }
    } finally {
      // Should the drain fail (storage could not reschedule an item), it ends only
      // when its items in flight have: the next drain must not start them again.
      await Promise.allSettled([...running.values()].map((r) => r.done));
    }
  }

  private async process(item: OutboxItem, now: number): Promise<void> {
    if (item.kind === "run") return this.processRun(item as OutboxItem<RunWork>, now);
    if (item.kind === "delivery") return this.processDelivery(item as OutboxItem<DeliveryWork>, now);
    if (item.kind === "check") return this.processCheck(item as OutboxItem<CheckWork>, now);
    return this.processEvents(item as OutboxItem<EventsWork>, now);
  }

  /**
   * A recoverable row this key no longer routes to (a `/new` replaced it) is still
   * promoted when its deadline passes, and finalizes then: its check stays in the
   * outbox until the row is a boundary.
   */
  private async processCheck(item: OutboxItem<CheckWork>, now: number): Promise<void> {
    await this.mutex.run(async () => {
      const [rows] = await this.db.batch(selectSession(this.db, item.payload.sessionId));
      const row = rows[0];
      const next = row ? await this.settleRow(row, now) : null;
      if (this.entry?.sessionId === item.payload.sessionId) this.liveDeadline = next;
      if (next === null) this.store.delete(item.id);
      else this.store.put({ ...item, dueAt: next });
    });
  }

  private reschedule(item: OutboxItem, error: string, retryAfterMs: number | null, now: number): void {
    const attempts = item.attempts + 1;
    const current = this.store.get(item.id);
    if (!current) return;
    this.store.put({ ...current, attempts, lastError: error, dueAt: now + backoffDelay(attempts, retryAfterMs) });
  }

  /**
   * The run as it stands once its storing has finished (under the lock, so a route
   * call that staged it is done): its payload read again, since storing may have
   * rewritten it (a fresh session changes `is_new` and `reset`). A run staged before
   * this object restarted is confirmed against its dedupe mark in D1, or dropped.
   */
  private async confirmStaged(work: RunWork, now: number): Promise<RunWork | null> {
    return this.mutex.run(async () => {
      const current = this.store.get<RunWork>(work.runId)?.payload;
      if (!current) return null;
      if (this.confirmedRuns.has(work.runId)) return current;
      const message = current.message;
      const [seen] = await this.db.batch(selectDedupe(message.platform, message.eventId, now));
      const mark = seen[0];
      if (!mark || mark.run_id !== work.runId || !mark.session_id) return null;
      // A rotation moved the hand-off on from the session its message was stored in.
      const moved = current.movedFrom?.includes(mark.session_id) ?? false;
      const confirmed = moved ? current : { ...current, sessionId: mark.session_id };
      // Kept as confirmed: once cached, later attempts (a retried hand-off) read the
      // stored payload, and a session predicted from a stale entry would revoke the run.
      if (current.sessionId !== mark.session_id) {
        const item = this.store.get<RunWork>(work.runId);
        if (item) this.store.put({ ...item, payload: confirmed });
      }
      this.confirmedRuns.add(work.runId);
      return confirmed;
    });
  }

  private async processRun(item: OutboxItem<RunWork>, now: number): Promise<void> {
    const work = await this.confirmStaged(item.payload, now);
    if (!work) {
      this.store.delete(item.id);
      return;
    }
    let reply: string | null;
    if (work.stage === "dispatch" && !this.config.agentUrl) {
      // The built-in echo agent answers at once: the whole turn is one batch.
      await this.mutex.run(() => this.instantTurn(work, echoAgent(agentRequest(work)).text, clockNow()));
      this.store.delete(item.id);
      return;
    }
    if (work.stage === "dispatch") {
      const dispatched = await this.mutex.run(() => this.beginRun(work, now));
      if (!dispatched) {
        this.store.delete(item.id);
        return;
      }
      const outcome = await handToAgent(this.config, agentRequest(work));
      if (outcome.kind === "accepted") {
        this.store.delete(item.id);
        await this.mutex.run(() => this.expectHeartbeats(work.sessionId, work.runId, clockNow()));
        return;
      }
      if (outcome.kind === "retry" || outcome.kind === "failed") {
        const expired = now - item.createdAt > RUN_GIVE_UP_MS;
        log.warn("agent hand-off failed", {
          session_key: work.message.sessionKey,
          session_id: work.sessionId,
          run_id: work.runId,
          attempt: item.attempts + 1,
          will_retry: outcome.kind === "retry" && !expired,
          error: errorSummary(outcome.error),
        });
        if (outcome.kind === "retry" && !expired) {
          await this.db.batch(recordRunRetry(work.runId, outcome.error));
          return this.reschedule(item, outcome.error, outcome.retryAfterMs, now);
        }
        const failed = markRunFailed(work.runId, now, outcome.error);
        // A scheduled job's session has this one run: once it failed, the job is over,
        // and both are recorded in one batch (a failed batch is retried as a whole).
        if (work.message.platform === CRON_PLATFORM)
          await this.mutex.run(() => this.endNow(work.sessionId, "cron_complete", clockNow(), [failed]));
        else await this.db.batch(failed);
        // Invariant 12: a user left without an answer is counted, and can be retried.
        metrics.runs_failed += 1;
        this.store.delete(item.id);
        return;
      }
      reply = outcome.text;
      // The reply is kept before it is recorded, so a restart records it rather than
      // asking the agent a second time.
      this.store.put({ ...item, payload: { ...work, stage: "record", reply } });
    } else {
      reply = work.reply ?? null;
    }
    // Recording stages the reply's delivery, which the running drain picks up next.
    await this.mutex.run(() => this.recordRunReply(work.runId, reply, clockNow(), true));
    this.store.delete(item.id);
  }

  /** Makes the run its session's current run; false when its session ended before the hand-off. */
  private async beginRun(work: RunWork, now: number): Promise<boolean> {
    const [, , , , , runs] = await this.db.batch(
      ...(dispatchRun(await newRunOf(work), now) as [
        Statement<number>,
        Statement<number>,
        Statement<number>,
        Statement<number>,
        Statement<number>,
      ]),
      selectRun(this.db, work.runId),
    );
    const run = runs[0];
    return !!run && run.revokedReason === null && run.finishedAt === null;
  }

  /** A run and the session it belongs to now (a rotation moves runs to the continuation). */
  private async runWithSession(runId: string): Promise<{ run: RunRow; session: SessionRow } | null> {
    const [runs, sessions] = await this.db.batch(selectRun(this.db, runId), selectSessionOfRun(runId));
    const run = runs[0];
    const session = sessions[0];
    return run && session ? { run, session } : null;
  }

  /** A turn answered at once (the echo agent): run, reply and delivery in one batch. */
  private async instantTurn(work: RunWork, text: string, now: number): Promise<RecordedReply> {
    const { platform, chatType, replyTo, sessionKey } = work.message;
    const policy = this.policy(platform, chatType);
    // The run comes from the outbox, so it held its session (invariant 6).
    const reply = {
      runId: work.runId,
      sessionId: work.sessionId,
      text,
      liveSince: liveSince(policy, now),
      held: true,
      now,
    };
    const deliverable = this.deliverable(replyTo);
    // The entry knows whether a reset notice can still be owed; if not, skip clearing it.
    const clearNotice = this.entry?.sessionId !== work.sessionId || this.entry.noticeOwed !== false;
    const results = await this.db.batch(
      ...recordInstantTurn(await newRunOf(work), { ...reply, deliverable, clearNotice }),
    );
    return this.afterReply({ id: work.sessionId, sessionKey, platform }, policy, results, text, deliverable, now);
  }

  /**
   * Records a run's reply (from the agent's answer or the run API) and stages its
   * delivery. A revoked run's reply stays on the run, and nothing is delivered.
   */
  private async recordRunReply(
    runId: string,
    text: string | null,
    now: number,
    fromOutbox: boolean,
  ): Promise<RecordedReply | null> {
    const found = await this.runWithSession(runId);
    if (!found) return null;
    const { run, session } = found;
    const policy = this.policy(session.platform, session.chatType);
    // Past the deadline the reply still lands while a turn holds the session open
    // (invariant 6): a hand-off from the outbox always does; through the run API, the
    // session's current run while its lease holds (this run, or another still open).
    const held =
      fromOutbox ||
      (expiryReason(policy, session.lastActiveAt, now) !== null && (await this.leaseOf(session, now)).held);
    const body = text?.trim() ? text : null;
    const target = JSON.parse(run.replyTo) as ReplyTarget;
    const deliverable = this.deliverable(target);
    // Through the run API nothing else keeps the reply owed (a hand-off from the outbox
    // keeps its run item until the delivery is staged): stage the delivery before the
    // batch, so a kill after D1 recorded it can never leave it pending with nothing to
    // send it. It is sent only once D1 shows its row (confirmAnswer).
    const deliveryId = replyDeliveryId(runId);
    const staged = !fromOutbox && deliverable && body !== null && !this.store.get(deliveryId);
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
      this.stage(deliveryId, "delivery", early, now);
    }
    // A batch that throws may still have committed: the staged delivery stays, and D1 decides.
    const results = await this.db.batch(
      ...recordReply({
        runId,
        sessionId: session.id,
        text: body,
        liveSince: liveSince(policy, now),
        held,
        now,
        deliverable,
        clearNotice: true,
      }),
    );
    if (staged) {
      const row = (results.at(-1) as DeliveryRow[])[0];
      const item = this.store.get<DeliveryWork>(deliveryId);
      if (row?.status === "pending" && item) {
        this.store.put({ ...item, payload: deliveryWork(row, session.sessionKey) });
        this.confirmedAnswers.add(deliveryId);
      } else this.store.delete(deliveryId);
    }
    return this.afterReply(session, policy, results, body, deliverable, now);
  }

  private deliverable(target: ReplyTarget): boolean {
    return !!senderFor(target.platform)?.canDeliver(target, this.config, effectiveEnv(this.env));
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
    deliverable: boolean,
    now: number,
  ): Promise<RecordedReply> {
    const finished = results[0] === 1;
    const added = results[1] === 1;
    if (added && this.entry?.sessionId === session.id) {
      this.markActive(policy, now);
      // The first reply took the notice, if there was one.
      if (this.entry.noticeOwed !== false) this.adopt({ ...this.entry, noticeOwed: false });
    }
    // Nothing added: the session may be past its deadline (expired meanwhile, or held
    // by this very turn, which is now over), so the policy looks at it now.
    if (!added && finished) {
      const [rows] = await this.db.batch(selectSession(this.db, session.id));
      if (rows[0]) {
        const due = await this.settleRow(rows[0], now);
        if (this.entry?.sessionId === session.id) this.liveDeadline = due;
      }
    }
    if (finished && isCronSession(session)) await this.endNow(session.id, "cron_complete", now);
    const row = deliverable ? (results.at(-1) as DeliveryRow[])[0] : undefined;
    let delivery: DeliveryWork | null = null;
    if (row && row.status === "pending") {
      delivery = deliveryWork(row, session.sessionKey);
      if (!this.store.get(delivery.deliveryId)) this.stage(delivery.deliveryId, "delivery", delivery, now);
    }
    return { finished, added, delivery };
  }

  /**
   * A command's answer, and a run API reply, are staged before the D1 batch that
   * writes their row, like a run: sent only once that batch has stored it. Waiting
   * for the lock lets a batch in flight finish (a failed one removes the item, or
   * leaves it for D1 to decide); after a restart, D1 says, and its row is what is
   * sent. Returns the work to send, or null (the item is gone).
   */
  private async confirmAnswer(item: OutboxItem<DeliveryWork>): Promise<DeliveryWork | null> {
    return this.mutex.run(async () => {
      const current = this.store.get<DeliveryWork>(item.id);
      if (!current) return null;
      if (this.confirmedAnswers.has(item.id)) return current.payload;
      const [rows] = await this.db.batch(selectDelivery(item.payload.deliveryId));
      const row = rows[0];
      if (!row || row.status !== "pending") {
        this.store.delete(item.id);
        return null;
      }
      const work = deliveryWork(row, current.payload.sessionKey);
      this.store.put({ ...current, payload: work });
      this.confirmedAnswers.add(item.id);
      return work;
    });
  }

  private async processDelivery(item: OutboxItem<DeliveryWork>, now: number): Promise<void> {
    let work = item.payload;
    if (work.kind === "command" || work.beforeBatch) {
      const confirmed = await this.confirmAnswer(item);
      if (!confirmed) return;
      work = confirmed;
    }
    const sender = senderFor(work.platform);
    const outcome = sender
      ? await sender.send(
          {
            kind: work.kind,
            text: work.text,
            notice: work.notice,
            sessionKey: work.sessionKey,
            sessionId: work.sessionId,
            eventId: work.eventId,
            deliveryId: work.deliveryId,
            target: work.target,
          },
          this.config,
          effectiveEnv(this.env),
        )
      : {
          ok: false,
          retryable: false,
          retryAfterMs: null,
          status: null,
          error: `no sender for platform ${work.platform}`,
        };
    const attempts = item.attempts + 1;
    const retry = !outcome.ok && outcome.retryable && attempts < DELIVERY_MAX_ATTEMPTS;
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
    await this.db.batch(
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
    if (retry) return this.reschedule(item, outcome.error ?? "failed", outcome.retryAfterMs, now);
    // Invariant 12: an answer dead-lettered is counted, and can be retried.
    if (!outcome.ok) metrics.deliveries_failed += 1;
    this.store.delete(item.id);
  }

  private async processEvents(item: OutboxItem<EventsWork>, now: number): Promise<void> {
    const { sessionId } = item.payload;
    const [due] = await this.db.batch(selectDueSessionEvents(this.db, sessionId, now));
    for (const event of due) await attemptEvent(this.db, this.config, event, now);
    const [[next]] = await this.db.batch(selectNextSessionEventAt(sessionId));
    const nextAt = next?.next ?? null;
    if (nextAt === null) this.store.delete(item.id);
    else this.store.put({ ...item, dueAt: Math.max(nextAt, now + 1) });
  }

  // ---------------------------------------------------------------- operator and agent

  /** `GET /admin/routes/{key}`: the entry, the live session's deadline, and the row it points at. */
  async inspect(): Promise<{ entry: EntryView | null; alarm_at: number | null; session: SessionRow | null }> {
    return this.mutex.run(async () => {
      if (!this.entry) return { entry: null, alarm_at: null, session: null };
      const [rows] = await this.db.batch(selectSession(this.db, this.entry.sessionId));
      const row = rows[0] ?? null;
      const live = row !== null && row.endReason === null;
      const policy = this.policy(this.entry.platform, this.entry.chatType);
      return {
        entry: {
          session_key: this.entry.sessionKey,
          session_id: this.entry.sessionId,
          platform: this.entry.platform,
          chat_type: this.entry.chatType,
          last_active_at: row?.lastActiveAt ?? null,
          parent_session_id: this.entry.parentId,
          reset: this.entry.reset,
          first_run_pending: this.entry.firstRunPending,
          notice_pending: row?.noticePending ?? null,
        },
        alarm_at: live ? deadline(policy, row.lastActiveAt) : null,
        session: row,
      };
    });
  }

  /**
   * `GET /admin/routes/{key}/explain`: what a message would read, read the same way
   * (the entry's row, else the key's newest row), plus the alarm and the current
   * run's hand-off. Reads only; `explain()` in src/domain/explain.ts decides.
   */
  async explainState(key: string): Promise<ExplainState> {
    return this.mutex.run(async () => {
      const [rows] = await this.db.batch(
        this.entry ? selectSession(this.db, this.entry.sessionId) : selectNewestForKey(this.db, key),
      );
      const row = rows[0] ?? null;
      const [runs] = row?.currentRunId ? await this.db.batch(selectRun(this.db, row.currentRunId)) : [[]];
      const item = row?.currentRunId ? this.store.get(row.currentRunId) : undefined;
      return {
        entrySessionId: this.entry?.sessionId ?? null,
        row,
        alarmAt: await this.ctx.storage.getAlarm(),
        currentRun: runs[0] ?? null,
        handoff:
          item?.kind === "run" ? { attempts: item.attempts, lastError: item.lastError, dueAt: item.dueAt } : null,
      };
    });
  }

  /** `DELETE /admin/routes/{key}`: forget the entry and its deadline; keep D1 and the outbox. */
  async forget(): Promise<void> {
    await this.mutex.run(async () => {
      this.store.deleteEntry();
      this.entry = null;
      this.liveDeadline = null;
      await this.rearm(clockNow());
    });
  }

  /**
   * `POST /admin/sessions/{id}/end`: ends one of this key's sessions. Ending only
   * touches a live row: an ended row is answered as it is (first reason wins, no
   * second event).
   */
  async endSession(
    sessionId: string,
    reason: EndReason,
  ): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const { changed, row } = await this.endNow(sessionId, reason, now);
        if (!row) return notFound(`no session ${sessionId}`);
        return { status: 200, body: { session: row, changed } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /** `POST /admin/events/{id}/retry`: deliver a session's pending events now, not at the next sweep. */
  async flushEvents(sessionId: string): Promise<void> {
    await this.mutex.run(async () => {
      const now = clockNow();
      this.stageEvents(sessionId, now);
      await this.rearm(now);
    });
  }

  /**
   * `POST /admin/runs/{id}/retry`: hands a failed run to the agent again through the
   * outbox: the same run id, a fresh attempt count (and a day of retries), a fresh
   * token. Only a failed run of a live session (a reply could land nowhere else).
   */
  async retryRun(runId: string): Promise<RpcResult<{ run: RunRow }> | { status: 409; body: ErrorBody }> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const found = await this.runWithSession(runId);
        if (!found) return notFound(`no run ${runId}`);
        const { run, session } = found;
        if (run.failedAt === null || run.finishedAt !== null || run.revokedReason !== null) {
          return conflict("not_failed", `run ${runId} has not failed`);
        }
        if (session.endReason !== null) {
          return conflict("session_ended", `the session of run ${runId} has ended: its reply could land nowhere`);
        }
        if (!run.message) return conflict("not_retryable", `run ${runId} predates retries (no message kept)`);
        const work: RunWork = {
          stage: "dispatch",
          runId,
          token: makeRunToken(runId, randomToken()),
          sessionId: session.id,
          isNew: false,
          parentId: session.parentSessionId,
          reset: null,
          message: JSON.parse(run.message) as RoutedMessage,
        };
        // Staged first, like any hand-off; removed again if D1 refuses the retry.
        this.stage(runId, "run", work, now, true);
        let rows: RunRow[];
        try {
          const [changed, after] = await this.db.batch(
            requeueFailedRun(runId, await sha256Hex(work.token)),
            selectRun(this.db, runId),
          );
          if (changed !== 1) throw new Error(`run ${runId} changed meanwhile`);
          rows = after;
        } catch (error) {
          this.store.delete(runId);
          throw error;
        }
        this.confirmedRuns.add(runId);
        return { status: 200, body: { run: rows[0]! } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /**
   * `POST /admin/deliveries/{id}/retry`: sends a failed reply or command answer
   * again through the outbox, with a fresh attempt count.
   */
  async retryDelivery(
    deliveryId: string,
    sessionKey: string,
  ): Promise<RpcResult<{ delivery: DeliveryRow }> | { status: 409; body: ErrorBody }> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const [rows] = await this.db.batch(selectDelivery(deliveryId));
        const row = rows[0];
        if (!row) return notFound(`no delivery ${deliveryId}`);
        if (row.status !== "failed") return conflict("not_failed", `delivery ${deliveryId} has not failed`);
        const [changed, after] = await this.db.batch(requeueDelivery(deliveryId, now), selectDelivery(deliveryId));
        if (changed !== 1 || !after[0]) return conflict("not_failed", `delivery ${deliveryId} has not failed`);
        const work = deliveryWork(after[0], sessionKey);
        if (work.kind === "command") this.confirmedAnswers.add(deliveryId);
        this.stage(deliveryId, "delivery", work, now, true);
        return { status: 200, body: { delivery: after[0] } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /** The sweep's poke: apply the policy to one of this key's sessions now. */
  async checkSession(sessionId: string): Promise<void> {
    await this.mutex.run(async () => {
      const now = clockNow();
      const [rows] = await this.db.batch(selectSession(this.db, sessionId));
      const row = rows[0];
      if (row) {
        const due = await this.settleRow(row, now);
        if (this.entry?.sessionId === sessionId) this.liveDeadline = due;
      }
      await this.rearm(now);
    });
  }

  // ---------------------------------------------------------------- agent API

  /** `POST /v1/runs/{id}/reply`: records and delivers the reply of a run that is not revoked. */
  async runReply(runId: string, text: string): Promise<RpcResult<{ recorded: true }>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const found = await this.runWithSession(runId);
        if (!found) return notFound(`no run ${runId}`);
        const { run, session } = found;
        // A reply recorded before is delivered even if its session ended since.
        if (run.finishedAt !== null) await this.restageReply(runId, session.sessionKey, now);
        // A superseded run still delivers its reply; a revoked or finished one does not.
        if (run.revokedReason) return notOwned(run.revokedReason as NotOwnedReason);
        if (session.endReason !== null) return notOwned(revocationFor(session.endReason));
        if (run.finishedAt !== null) return notOwned("finished");
        const recorded = await this.recordRunReply(runId, text, now, false);
        if (!recorded?.finished) return notOwned("finished");
        if (!recorded.added && text.trim() !== "") {
          const [[after]] = await this.db.batch(selectRun(this.db, runId));
          return notOwned((after?.revokedReason as NotOwnedReason | null) ?? "session_ended");
        }
        return { status: 200, body: { recorded: true } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /**
   * The agent retried the reply of a run already finished: should its delivery be
   * pending with nothing in the outbox to send it (a kill between recording and
   * staging), it is staged again, so a reply recorded is never left unsent.
   */
  private async restageReply(runId: string, sessionKey: string, now: number): Promise<void> {
    const deliveryId = replyDeliveryId(runId);
    if (this.store.get(deliveryId)) return;
    const [[row]] = await this.db.batch(selectDelivery(deliveryId));
    if (row?.status === "pending") this.stage(deliveryId, "delivery", deliveryWork(row, sessionKey), now);
  }

  /**
   * `POST /v1/runs/{id}/progress`: sent to the chat only while the run owns its
   * session. The check and the send happen under the lock, so no `/new` or `/stop`
   * can slip between them; a progress notice is sent once and not retried.
   */
  async progress(runId: string, text: string): Promise<RpcResult<{ owns: true; sent: boolean }>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const found = await this.runWithSession(runId);
        if (!found) return notFound(`no run ${runId}`);
        const { run, session } = found;
        const state = ownership({ run, session });
        if (!state.owns) return notOwned(state.reason);
        // Past its deadline (the alarm has not run yet) and no longer held by this turn
        // (its lease ran out): end it by its policy now.
        if (
          expiryReason(this.policy(session.platform, session.chatType), session.lastActiveAt, now) &&
          leaseUntil(run) <= now
        ) {
          const next = await this.settleRow(session, now);
          if (this.entry?.sessionId === session.id) this.liveDeadline = next;
          return notOwned("session_ended");
        }
        const target = JSON.parse(run.replyTo) as ReplyTarget;
        const sender = senderFor(target.platform);
        const env = effectiveEnv(this.env);
        if (!sender?.canDeliver(target, this.config, env)) return { status: 200, body: { owns: true, sent: false } };
        const deliveryId = newId("dl");
        const outcome = await sender.send(
          {
            kind: "progress",
            text,
            notice: null,
            sessionKey: session.sessionKey,
            sessionId: session.id,
            eventId: run.eventId,
            deliveryId,
            target,
          },
          this.config,
          env,
        );
        if (!outcome.ok) {
          log.warn("progress delivery failed", {
            session_key: session.sessionKey,
            session_id: session.id,
            delivery_id: deliveryId,
            platform: target.platform,
            status: outcome.status,
            error: errorSummary(outcome.error),
          });
        }
        await this.db.batch(
          insertDelivery({
            id: deliveryId,
            sessionId: session.id,
            runId,
            eventId: run.eventId,
            platform: target.platform,
            kind: "progress",
            status: outcome.ok ? "sent" : "failed",
            attempts: 1,
            lastStatus: outcome.status,
            lastError: outcome.error,
            text,
            notice: null,
            target: run.replyTo,
            createdAt: now,
          }),
        );
        return { status: 200, body: { owns: true, sent: outcome.ok } };
      } catch (error) {
        return unavailable(error);
      }
    });
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
  ): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const [runs, sessions] = await this.db.batch(selectRun(this.db, runId), selectSession(this.db, sessionId));
        const run = runs[0];
        const session = sessions[0];
        if (!run || !session) return notFound(`no session ${sessionId}`);
        if (session.endReason !== null) return { status: 200, body: { session, changed: false } };
        if (!isCurrentRun({ run, session })) {
          const state = ownership({ run, session });
          return notOwned(state.owns ? "superseded" : state.reason);
        }
        const { changed, row } = await this.endNow(sessionId, isCronSession(session) ? "cron_complete" : reason, now);
        return { status: 200, body: { session: row ?? session, changed } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /**
   * `POST /v1/sessions/{id}/rotate`: ends the session as `compression` and starts its
   * continuation (same key, `parent_session_id`, the parent's last activity, the
   * current run moved over), adopted before the answer so the next message lands there.
   */
  async rotate(sessionId: string, runId: string): Promise<RpcResult<{ session_id: string }>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        const [runs, sessions, openRuns] = await this.db.batch(
          selectRun(this.db, runId),
          selectSession(this.db, sessionId),
          selectOpenRuns(sessionId),
        );
        const run = runs[0];
        const session = sessions[0];
        if (!run || !session) return notFound(`no session ${sessionId}`);
        const state = ownership({ run, session });
        if (session.endReason !== null || !isCurrentRun({ run, session })) {
          return notOwned(state.owns ? "superseded" : state.reason);
        }
        const policy = this.policy(session.platform, session.chatType);
        const continuation: NewSession = {
          id: newId("ses"),
          sessionKey: session.sessionKey,
          platform: session.platform,
          chatType: session.chatType,
          startedAt: Math.max(now, session.startedAt + 1),
          parentSessionId: session.id,
          replaced: null,
          // A reset notice still owed is owed by the conversation, which goes on here.
          noticePending: session.noticePending,
          sweepAt: nextLook(deadline(policy, session.lastActiveAt), openRuns, session.currentRunId, now),
          lastActiveAt: session.lastActiveAt,
          currentRunId: session.currentRunId,
        };
        const [ended, , , inserted] = await this.db.batch(
          endLive(session.id, "compression", false, now),
          ...moveRuns(session.id, continuation.id),
          ...insertSession(continuation, null, { sessionId: session.id, reason: "compression" }),
          ...endedEvents(session.id, now, this.eventStatus),
          ...startedEvents(continuation.id, now, this.eventStatus),
        );
        if (ended !== 1 || inserted !== 1) return notOwned("session_ended");
        countEnded("compression");
        metrics.sessions_created += 1;
        this.adopt({
          sessionKey: session.sessionKey,
          platform: session.platform,
          chatType: session.chatType,
          sessionId: continuation.id,
          parentId: session.id,
          reset: null,
          firstRunPending: false,
          noticeOwed: session.noticePending !== null,
        });
        this.liveDeadline = continuation.sweepAt;
        this.moveStagedRuns(session.id, continuation.id);
        this.stageEvents(session.id, now);
        this.stageEvents(continuation.id, now);
        return { status: 200, body: { session_id: continuation.id } };
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /**
   * A rotation moves the turn, still current, to the continuation: D1 moves the runs
   * rows (moveRuns), and this moves the hand-offs still in the outbox, which have no
   * row yet. Otherwise they would be handed over naming the ended parent, hold no
   * session open, and their replies would be recorded nowhere.
   */
  private moveStagedRuns(fromSessionId: string, toSessionId: string): void {
    for (const item of this.store.all()) {
      if (item.kind !== "run") continue;
      const work = item.payload as RunWork;
      if (work.sessionId !== fromSessionId) continue;
      const movedFrom = [...(work.movedFrom ?? []), fromSessionId];
      const payload: RunWork = { ...work, sessionId: toSessionId, parentId: fromSessionId, movedFrom };
      this.store.put({ ...item, payload });
    }
  }

  /**
   * `POST /v1/cron/runs`: runs a scheduled job's text as the first message of its own
   * session (`cron:{job_id}:{run_id}`), handed to the agent like any message.
   */
  async startCron(jobId: string, runId: string, text: string): Promise<RpcResult<AcceptedBody>> {
    return this.mutex.run(async () => {
      const now = clockNow();
      const message: RoutedMessage = {
        platform: CRON_PLATFORM,
        eventId: `cron:${runId}`,
        chatId: jobId,
        chatType: "dm",
        userId: "cron",
        threadId: null,
        text,
        sentAt: null,
        replyTo: { platform: CRON_PLATFORM },
        sessionKey: cronSessionKey(jobId, runId),
        receivedAt: now,
      };
      try {
        return await this.storeAndStage(message, this.policy(CRON_PLATFORM, "dm"), runId);
      } catch (error) {
        return unavailable(error);
      } finally {
        await this.rearm(now);
      }
    });
  }

  /**
   * Resolves once no drain of the outbox is running (tests and diagnostics: wait for
   * work started in the background of a request without reaching into the object).
   */
  async drained(): Promise<void> {
    while (this.activeDrain) await this.activeDrain.catch(() => undefined);
  }

  /** The outbox as a list (tests and diagnostics); run tokens are left out. */
  async outbox(): Promise<{ id: string; kind: string; dueAt: number; attempts: number; lastError: string | null }[]> {
    return this.store
      .all()
      .map(({ id, kind, dueAt, attempts, lastError }) => ({ id, kind, dueAt, attempts, lastError }));
  }
}
