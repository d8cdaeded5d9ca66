/**
 * What every flow of the routing object is built with (its dependencies, passed
 * in), and the builders of what several flows write: a new session, a hand-off,
 * a delivery row, the outbound message, the staging of a session's events.
 */
import { configOf, effectiveEnv, type Config } from "../config";
import { randomToken } from "../crypto";
import type { Database, Statement } from "../db/client";
import type { NewDelivery } from "../db/deliveries";
import { endedEvents, type InitialStatus } from "../db/events";
import { markEndedNotDispatched } from "../db/overlap";
import { revokeRuns } from "../db/runs";
import type { RunRow, SessionRow } from "../db/schema";
import type { NewSession } from "../db/sessions";
import { noticeFor } from "../domain/end-reasons";
import type { ReplyTarget, RoutedMessage } from "../domain/inbound";
import { deadline, resolvePolicy, type ResetPolicy } from "../domain/reset-policy";
import type { Replaced } from "../domain/routing-decision";
import { makeRunToken } from "../domain/run-token";
import { nextLook } from "../domain/turn-hold";
import { newId } from "../ids";
import { senderFor } from "../platforms";
import type { OutboundMessage } from "../platforms/types";
import type { BoundedSet } from "./bounded-set";
import type { EntryState } from "./entry";
import type { Mutex } from "./mutex";
import type { Outbox } from "./outbox";
import type { Typing } from "./typing";
import type { WaitingRoom } from "./waiting";
import type { DeliveryWork, RunWork } from "./work";

/** A message is never stored after this many conflicting rereads; the platform retries instead. */
export const MAX_ROUTING_ATTEMPTS = 3;

/**
 * A message or command that lost MAX_ROUTING_ATTEMPTS races: every attempt's batch
 * missed on its conditional statements, so D1 stored nothing of it (unlike a batch
 * that threw, which may have committed).
 */
export class RoutingUnsettled extends Error {
  constructor(what: string) {
    super(`${what} did not settle after ${MAX_ROUTING_ATTEMPTS} attempts`);
  }
}

/** The routing object's shared state and services, as each flow receives them. */
export interface RouterContext {
  env: Env;
  db: Database;
  /** Every state change runs under it (see mutex.ts). */
  mutex: Mutex;
  entry: EntryState;
  outbox: Outbox;
  /** Runs staged and then stored while this object is in memory (no need to ask D1 again). */
  confirmedRuns: BoundedSet;
  /** Command answers and run API replies staged and then stored, likewise. */
  confirmedAnswers: BoundedSet;
  /** Messages waiting for a run, and runs the agent accepted (spec "Overlapping messages"). */
  waiting: WaitingRoom;
  /** The chat's typing indicator while the current run works (spec "Typing"). */
  typing: Typing;
}

export const configFor = (ctx: RouterContext): Config => configOf(ctx.env);

export const policyFor = (ctx: RouterContext, platform: string, chatType: string): ResetPolicy =>
  resolvePolicy(configFor(ctx).reset, platform, chatType);

/** Lifecycle events are written pending only when there is a hook to deliver them to. */
export const eventStatusFor = (ctx: RouterContext): InitialStatus =>
  configFor(ctx).hookUrls.length > 0 ? "pending" : "skipped";

/** Whether a message to `target` has anywhere to go with this configuration. */
export function deliverable(ctx: RouterContext, target: ReplyTarget): boolean {
  return !!senderFor(target.platform)?.canDeliver(target, configFor(ctx), effectiveEnv(ctx.env));
}

/**
 * What goes with every end of a session, in the same batch: its runs revoked (a
 * revoked run's reply is never delivered), its waiting messages recorded as never
 * dispatched, and its `session.ended` events written.
 */
export function revokedAndEnded(ctx: RouterContext, sessionId: string, now: number): Statement<number>[] {
  return [
    revokeRuns(sessionId),
    markEndedNotDispatched(sessionId),
    ...endedEvents(sessionId, now, eventStatusFor(ctx)),
  ];
}

/** Queues delivery of a session's pending lifecycle events (a no-op when it has none). */
export function stageEvents(ctx: RouterContext, sessionId: string, now: number): void {
  if (eventStatusFor(ctx) === "skipped") return;
  // One item per session: staging it again brings it forward.
  ctx.outbox.stage(`events_${sessionId}`, "events", { sessionId }, now, true);
}

/** A new session for this message's key, replacing `previous` (if any). */
export function freshSession(
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

/**
 * The continuation of a rotated session: same key, `parent_session_id`, the
 * parent's last activity (a rotation never re-arms the idle clock) and current run.
 */
export function continuationOf(session: SessionRow, policy: ResetPolicy, openRuns: RunRow[], now: number): NewSession {
  return {
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
}

/** A hand-off to stage for `message`, with a fresh token. */
export function dispatchWork(
  runId: string,
  message: RoutedMessage,
  context: Pick<RunWork, "sessionId" | "isNew" | "parentId" | "reset">,
): RunWork {
  return { stage: "dispatch", runId, token: makeRunToken(runId, randomToken()), ...context, message };
}

/** The `deliveries` row of one outbound platform call. */
export function deliveryRow(
  work: Pick<DeliveryWork, "deliveryId" | "sessionId" | "eventId" | "platform" | "kind" | "text">,
  fields: Pick<NewDelivery, "runId" | "status" | "attempts" | "lastStatus" | "lastError" | "target" | "createdAt">,
): NewDelivery {
  return {
    id: work.deliveryId,
    sessionId: work.sessionId,
    eventId: work.eventId,
    platform: work.platform,
    kind: work.kind,
    text: work.text,
    notice: null,
    ...fields,
  };
}

/** The message a platform adapter is asked to send for one delivery. */
export function outboundOf(work: DeliveryWork): OutboundMessage {
  return {
    kind: work.kind,
    text: work.text,
    notice: work.notice,
    sessionKey: work.sessionKey,
    sessionId: work.sessionId,
    eventId: work.eventId,
    deliveryId: work.deliveryId,
    target: work.target,
  };
}
