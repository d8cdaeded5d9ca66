/**
 * Delivery of lifecycle events to HOOK_URLS (spec "Lifecycle events"): signed
 * POSTs, at least once, the same id on every attempt, backoff between attempts,
 * and a dead letter (`failed`) after a bounded number of them. The routing object
 * delivers its own sessions' events as soon as they are written; the sweep picks
 * up any whose attempt is overdue. A claim on the row keeps the two from
 * delivering the same event at the same moment.
 */
import type { Config } from "../config";
import { hmacSha256Hex } from "../crypto";
import type { Database } from "../db/client";
import { claimEvent, recordEventAttempt } from "../db/events";
import type { EventRow } from "../db/schema";
import { selectMessages } from "../db/sessions";
import { backoffDelay } from "../http/backoff";
import { callJson, redactUrl } from "../http/outbound";
import { errorSummary, log } from "../log";
import { metrics } from "../metrics";
import { standardWebhookHeaders } from "./standard-webhooks";
import { boundTranscript, transcriptLine } from "./transcript";

/** Attempts before an event is dead-lettered (about 19 minutes of retrying). */
export const EVENT_MAX_ATTEMPTS = 12;
/** How long a claim keeps others off an event while one attempt is under way. */
export const EVENT_CLAIM_MS = 60_000;
const HOOK_TIMEOUT_MS = 10_000;

/** The JSON body of an event as hooks receive it (the transcript is added for `session.finalized`). */
export async function eventBody(db: Database, event: EventRow): Promise<string> {
  const body = JSON.parse(event.payload) as Record<string, unknown>;
  if (event.type === "session.finalized") {
    const [rows] = await db.batch(selectMessages(db, event.sessionId));
    const { transcript, truncated } = boundTranscript(rows.map(transcriptLine));
    body.transcript = transcript;
    body.truncated = truncated;
  }
  return JSON.stringify(body);
}

/** One attempt at an event: claims it, POSTs it to every hook that has not acknowledged it yet, records the outcome. */
export async function attemptEvent(
  db: Database,
  config: Config,
  event: EventRow,
  now: number,
): Promise<"sent" | "pending" | "failed" | "skipped"> {
  const [claimed] = await db.batch(claimEvent(event.id, now, now + EVENT_CLAIM_MS));
  if (claimed === 0) return "skipped";
  const attempts = event.attempts + 1;
  const delivered = new Set<string>(JSON.parse(event.deliveredTo) as string[]);
  const body = await eventBody(db, event);
  const signature = `sha256=${await hmacSha256Hex(config.hookSecret ?? "", body)}`;
  // Standard Webhooks: the event id as webhook-id, this attempt's time as its timestamp.
  const standard = await standardWebhookHeaders(config.hookSecret ?? "", event.id, now, body);
  let lastStatus: number | null = null;
  let lastError: string | null = null;
  let retryAfterMs: number | null = null;
  for (const url of config.hookUrls) {
    if (delivered.has(url)) continue;
    const outcome = await callJson(url, body, {
      headers: { "x-sessiongate-event": event.id, "x-sessiongate-signature": signature, ...standard },
      timeoutMs: HOOK_TIMEOUT_MS,
    });
    lastStatus = outcome.status;
    if (outcome.ok) {
      delivered.add(url);
      continue;
    }
    metrics.events_failed += 1;
    log.warn("event delivery failed", {
      session_id: event.sessionId,
      event_id: event.id,
      type: event.type,
      hook: redactUrl(url), // scheme and host only: a hook URL may carry a credential
      attempt: attempts,
      status: outcome.status,
      will_retry: attempts < EVENT_MAX_ATTEMPTS,
      error: errorSummary(outcome.error),
    });
    // Scheme and host only: a hook URL may carry a credential (user:password, a token).
    lastError = `${redactUrl(url)}: ${outcome.error ?? "failed"}`;
    // Even a 4xx is retried on the schedule: a receiver can be fixed by its
    // operator, and the cap dead-letters the event if it is not.
    retryAfterMs = outcome.retryAfterMs ?? retryAfterMs;
  }
  const done = config.hookUrls.every((url) => delivered.has(url));
  const status = done ? "sent" : attempts >= EVENT_MAX_ATTEMPTS ? "failed" : "pending";
  if (done) metrics.events_delivered += 1;
  await db.batch(
    recordEventAttempt(event.id, {
      status,
      nextAttemptAt: status === "pending" ? now + backoffDelay(attempts, retryAfterMs) : null,
      lastStatus,
      lastError: done ? null : lastError,
      deliveredTo: [...delivered],
    }),
  );
  return status;
}
