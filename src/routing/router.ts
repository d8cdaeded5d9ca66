/**
 * The routing object: one Durable Object per session key. It holds the key's
 * routing entry (which session is live) and one alarm, and it is the only writer
 * of its key's sessions, so every change to them is serialised here.
 *
 * This class is glue: its state, the wiring of its units, `alarm()`, and one line
 * per RPC method over one locked helper. The units (docs/architecture.md):
 * - entry.ts: the routing entry and the live deadline (one owner, one writer);
 * - alarm.ts: the alarm plan (`nextAlarmAt`), the only code that sets the alarm;
 * - outbox.ts: due work staged before the D1 call that makes it owed, and drained;
 * - the flows, each built with what it needs: inbound.ts (messages), commands.ts,
 *   settlement.ts (policy and leases), turns.ts, deliveries.ts (replies and events),
 *   agent-api.ts, operator.ts, cron.ts.
 */
import { DurableObject } from "cloudflare:workers";
import { now as clockNow } from "../clock";
import { configOf } from "../config";
import { Database } from "../db/client";
import type { DeliveryRow, RunRow, SessionRow } from "../db/schema";
import type { EndReason } from "../domain/end-reasons";
import type { RoutedMessage } from "../domain/inbound";
import { resolvePolicy } from "../domain/reset-policy";
import { RUN_LEASE_MS as TURN_LEASE_MS } from "../domain/turn-hold";
import { describe } from "../http/outbound";
import { log } from "../log";
import { AgentApi } from "./agent-api";
import { AlarmPlan } from "./alarm";
import { BoundedSet } from "./bounded-set";
import { Commands } from "./commands";
import type { RouterContext } from "./context";
import { Cron } from "./cron";
import { Deliveries } from "./deliveries";
import { EntryState } from "./entry";
import { Inbound } from "./inbound";
import { Mutex } from "./mutex";
import { Operator } from "./operator";
import { Outbox } from "./outbox";
import { Queue } from "./queue";
import {
  unavailable,
  type AcceptedBody,
  type EntryView,
  type ErrorBody,
  type ExplainState,
  type RpcResult,
} from "./results";
import { Settlement } from "./settlement";
import { Turns } from "./turns";
import { Typing } from "./typing";
import { WaitingRoom } from "./waiting";

/**
 * A run the agent accepted (202) must be heard from (a heartbeat or its reply)
 * within this long, or its owner is taken to have vanished.
 */
export const RUN_LEASE_MS = TURN_LEASE_MS;

export { CRON_PLATFORM } from "../domain/cron";

/**
 * What an object remembers of staged work it saw stored. A cache: anything it has
 * forgotten is asked of D1 again, so a busy object that is never evicted stays small.
 */
const CONFIRMED_CACHE_SIZE = 1_000;

export class SessionRouter extends DurableObject<Env> {
  private readonly mutex = new Mutex();
  private readonly entry: EntryState;
  private readonly outboxUnit: Outbox;
  private readonly alarmPlan: AlarmPlan;
  private readonly settlement: Settlement;
  private readonly inbound: Inbound;
  private readonly turns: Turns;
  private readonly agentApi: AgentApi;
  private readonly operator: Operator;
  private readonly cron: Cron;
  private readonly queue: Queue;
  private readonly typing: Typing;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.entry = new EntryState(ctx.storage.sql);
    this.outboxUnit = new Outbox({
      sql: ctx.storage.sql,
      mode: () => configOf(env).outboxDrain,
      armBy: (at, now) => this.alarmPlan.armBy(at, now),
      waitUntil: (work) => ctx.waitUntil(work),
      afterDrain: () => this.mutex.run(() => this.alarmPlan.rearm(clockNow())),
    });
    this.alarmPlan = new AlarmPlan(ctx.storage, () => ({
      nextDueAt: this.outboxUnit.nextDueAt(),
      draining: this.outboxUnit.draining,
      liveDeadline: this.entry.liveDeadline,
      hasEntry: this.entry.entry !== null,
      waitingDueAt: this.queue.dueAt(clockNow()),
      typingDueAt: this.typing.dueAt(),
    }));
    const waiting = new WaitingRoom(ctx.storage.sql);
    this.typing = new Typing({
      sql: ctx.storage.sql,
      env,
      entry: this.entry,
      outbox: this.outboxUnit,
      waiting,
      armBy: (at, now) => this.alarmPlan.armBy(at, now),
      waitUntil: (work) => ctx.waitUntil(work),
    });
    const context: RouterContext = {
      env,
      db: new Database(env.DB, "background"),
      mutex: this.mutex,
      entry: this.entry,
      outbox: this.outboxUnit,
      confirmedRuns: new BoundedSet(CONFIRMED_CACHE_SIZE),
      confirmedAnswers: new BoundedSet(CONFIRMED_CACHE_SIZE),
      waiting,
      typing: this.typing,
    };
    this.queue = new Queue(context);
    this.settlement = new Settlement(context, this.alarmPlan, this.queue);
    this.turns = new Turns(context, this.settlement, this.queue);
    this.inbound = new Inbound(context, this.settlement, new Commands(context, this.settlement), this.queue);
    this.agentApi = new AgentApi(context, this.settlement, this.turns);
    this.operator = new Operator(context, this.alarmPlan, this.settlement, this.turns);
    this.cron = new Cron(context, this.inbound);
    const deliveries = new Deliveries(context);
    this.outboxUnit.register({
      // A run's item done (finished, failed for good, accepted or dropped): what waits behind it may go.
      run: async (item, now) => {
        await this.turns.processRun(item, now);
        await this.mutex.run(() => this.queue.pump(clockNow()));
      },
      delivery: (item, now) => deliveries.processDelivery(item, now),
      events: (item, now) => deliveries.processEvents(item, now),
      check: (item, now) => this.settlement.processCheck(item, now),
    });
    // Storage only, no network: safe inside blockConcurrencyWhile.
    void ctx.blockConcurrencyWhile(() => this.alarmPlan.load());
  }

  /**
   * Runs one call under the lock, with `now` read there, and re-arms the alarm at
   * its end (unless `rearm` is false). Without `rearm` or `catchAs`, a throw reaches
   * the worker as it is.
   */
  private exclusive<R>(task: (now: number) => R | Promise<R>, rearm = true): Promise<R> {
    return this.mutex.run(async () => {
      const now = clockNow();
      try {
        return await task(now);
      } finally {
        if (rearm) await this.alarmPlan.rearm(now);
      }
    });
  }

  /** `exclusive`, with a throw (D1 down) answered 503 so the caller retries. */
  private locked<R>(
    task: (now: number) => Promise<R>,
    rearm = true,
    failed?: (error: unknown) => void,
  ): Promise<R | ReturnType<typeof unavailable>> {
    return this.exclusive(async (now) => {
      try {
        return await task(now);
      } catch (error) {
        failed?.(error);
        return unavailable(error);
      }
    }, rearm);
  }

  async alarm(): Promise<void> {
    const now = clockNow();
    this.alarmPlan.fired();
    await this.mutex
      .run(async () => {
        await this.settlement.settleLiveSession(now);
        // Messages staged before a restart, or waiting behind a run whose lease lapsed.
        await this.queue.pump(now);
      })
      .catch((error) => {
        this.alarmPlan.settleFailed();
        this.entry.setDeadline(undefined);
        log.error("alarm: could not check the live session", {
          session_key: this.entry.entry?.sessionKey,
          error: describe(error),
        });
      });
    // Typing due now, asked of each run's ownership after the settling above (an end, a lapsed lease).
    await this.mutex
      .run(async () => this.typing.tick(clockNow()))
      .catch((error) => log.error("alarm: could not look at typing", { error: describe(error) }));
    // Once a run types, the drain (a hand-off waiting for a slow agent's 200) is not
    // waited for to its end: the alarm must come back in 4 s to type again. The drain
    // is kept alive, and re-arms the alarm when it ends.
    const drain = this.outboxUnit.run();
    this.ctx.waitUntil(drain);
    await Promise.race([drain, this.typing.whenTyping()]);
    await this.typing.settled();
    await this.mutex.run(() => this.alarmPlan.rearm(clockNow()));
  }

  // ---------------------------------------------------------------- ingress

  /** Routes one verified inbound message (or command) for this object's key. */
  route(message: Omit<RoutedMessage, "receivedAt">): Promise<RpcResult<AcceptedBody>> {
    const failed = (error: unknown) =>
      log.error("route failed", { session_key: message.sessionKey, error: describe(error) });
    // Read before the lock's try, as ever: an invalid configuration rejects the call (it is no 503 to retry).
    const policy = resolvePolicy(configOf(this.env).reset, message.platform, message.chatType);
    return this.locked((now) => this.inbound.route({ ...message, receivedAt: now }, policy), true, failed);
  }

  /** `POST /v1/cron/runs`: runs a scheduled job's text as the first message of its own session. */
  startCron(jobId: string, runId: string, text: string): Promise<RpcResult<AcceptedBody>> {
    return this.locked((now) => this.cron.start(jobId, runId, text, now));
  }

  /** The sweep's poke: apply the policy to one of this key's sessions now. */
  checkSession(sessionId: string): Promise<void> {
    return this.exclusive((now) => this.operator.checkSession(sessionId, now));
  }

  // ---------------------------------------------------------------- operator

  /** `GET /admin/routes/{key}`: the entry, the live session's deadline, and the row it points at. */
  inspect(): Promise<{ entry: EntryView | null; alarm_at: number | null; session: SessionRow | null }> {
    return this.exclusive(() => this.operator.inspect(), false);
  }

  /** `GET /admin/routes/{key}/explain`: what a message for this key would read now. */
  explainState(key: string): Promise<ExplainState> {
    return this.exclusive(() => this.operator.explainState(key), false);
  }

  /** `DELETE /admin/routes/{key}`: forget the entry and its deadline; keep D1 and the outbox. */
  forget(): Promise<void> {
    return this.exclusive(() => this.operator.forget());
  }

  /** `POST /admin/sessions/{id}/end`: ends one of this key's sessions (first reason wins). */
  endSession(sessionId: string, reason: EndReason): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    return this.locked((now) => this.operator.endSession(sessionId, reason, now));
  }

  /** `POST /admin/events/{id}/retry`: deliver a session's pending events now, not at the next sweep. */
  flushEvents(sessionId: string): Promise<void> {
    return this.exclusive((now) => this.operator.flushEvents(sessionId, now));
  }

  /** `POST /admin/runs/{id}/retry`: hands a failed run of a live session to the agent again. */
  retryRun(runId: string): Promise<RpcResult<{ run: RunRow }> | { status: 409; body: ErrorBody }> {
    return this.locked((now) => this.operator.retryRun(runId, now));
  }

  /** `POST /admin/deliveries/{id}/retry`: sends a failed reply or command answer again. */
  retryDelivery(
    deliveryId: string,
    sessionKey: string,
  ): Promise<RpcResult<{ delivery: DeliveryRow }> | { status: 409; body: ErrorBody }> {
    return this.locked((now) => this.operator.retryDelivery(deliveryId, sessionKey, now));
  }

  // ---------------------------------------------------------------- agent API

  /** `POST /v1/runs/{id}/reply`: records and delivers the reply of a run that is not revoked. */
  runReply(runId: string, text: string): Promise<RpcResult<{ recorded: true }>> {
    return this.locked((now) => this.agentApi.runReply(runId, text, now));
  }

  /** `POST /v1/runs/{id}/progress`: sent to the chat only while the run owns its session (never re-arms). */
  progress(runId: string, text: string): Promise<RpcResult<{ owns: true; sent: boolean }>> {
    return this.locked((now) => this.agentApi.progress(runId, text, now), false);
  }

  /** `POST /v1/sessions/{id}/end` by the session's current run. */
  agentEnd(
    sessionId: string,
    runId: string,
    reason: EndReason,
  ): Promise<RpcResult<{ session: SessionRow; changed: boolean }>> {
    return this.locked((now) => this.agentApi.agentEnd(sessionId, runId, reason, now));
  }

  /** `POST /v1/sessions/{id}/rotate`: ends the session as `compression` and starts its continuation. */
  rotate(sessionId: string, runId: string): Promise<RpcResult<{ session_id: string }>> {
    return this.locked((now) => this.agentApi.rotate(sessionId, runId, now));
  }

  // ---------------------------------------------------------------- diagnostics

  /**
   * Resolves once no drain of the outbox nor typing call is running (tests and diagnostics: wait for
   * work started in the background of a request without reaching into the object).
   */
  async drained(): Promise<void> {
    await this.outboxUnit.drained();
    await this.typing.settled();
  }

  /** The outbox as a list (tests and diagnostics); run tokens are left out. */
  async outbox(): Promise<{ id: string; kind: string; dueAt: number; attempts: number; lastError: string | null }[]> {
    return this.outboxUnit.table
      .all()
      .map(({ id, kind, dueAt, attempts, lastError }) => ({ id, kind, dueAt, attempts, lastError }));
  }
}
