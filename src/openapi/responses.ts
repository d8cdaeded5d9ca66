/**
 * Zod schemas of the answers, for the OpenAPI document only (requests are
 * described by the schemas that validate them, in src/routes and src/platforms).
 */
import * as z from "zod";
import { END_REASONS } from "../domain/end-reasons";

const ms = z.number().int().describe("milliseconds since the epoch");
const nullableMs = ms.nullable();

export const errorAnswer = z.object({ error: z.object({ code: z.string(), message: z.string() }) });

export const notOwnedAnswer = z.object({
  owns: z.literal(false),
  reason: z.enum(["finished", "superseded", "stopped", "session_ended"]),
});

export const sessionRow = z.looseObject({
  id: z.string(),
  session_key: z.string(),
  started_at: ms,
  last_active_at: ms,
  ended_at: nullableMs,
  end_reason: z.enum(END_REASONS).nullable(),
  parent_session_id: z.string().nullable(),
});

export const runView = z.looseObject({
  run_id: z.string(),
  status: z.enum(["dispatching", "running", "finished", "revoked", "failed"]),
  attempts: z.number().int().nullable(),
  last_error: z.string().nullable(),
  revoked_reason: z.string().nullable(),
  created_at: ms,
  finished_at: nullableMs,
});

export const acceptedAnswer = z.object({
  accepted: z.literal(true),
  session_id: z.string().nullable(),
  duplicate: z.boolean(),
});

export const routeAnswer = z.object({
  entry: z.looseObject({ session_key: z.string(), session_id: z.string() }).nullable(),
  alarm_at: nullableMs.describe("the live session's deadline"),
  session: sessionRow.nullable(),
});

export const forgottenAnswer = z.object({ forgotten: z.literal(true), session_key: z.string() });

const message = z.looseObject({
  role: z.enum(["user", "assistant", "system"]),
  text: z.string(),
  at: ms,
  run_id: z.string().nullable().describe("the run that carries (user) or produced (assistant) it; null while it waits"),
  not_dispatched: z
    .enum(["stopped", "new_command", "session_ended"])
    .nullable()
    .describe("why a user message was never handed to the agent; null otherwise"),
});
const event = z.looseObject({ id: z.string(), type: z.string(), reason: z.string().nullable(), status: z.string() });
const delivery = z.looseObject({
  event_id: z.string().nullable(),
  platform: z.string(),
  kind: z.string(),
  status: z.enum(["pending", "sent", "failed"]),
  attempts: z.number().int(),
  last_status: z.number().int().nullable(),
  last_error: z.string().nullable(),
});

export const sessionsAnswer = z.object({ sessions: z.array(sessionRow) });
export const sessionAnswer = z.looseObject({
  session: sessionRow,
  messages: z.array(message),
  events: z.array(event),
  deliveries: z.array(delivery),
  runs: z.array(runView).optional(),
});
export const endedAnswer = z.object({ session: sessionRow, changed: z.boolean() });
export const retriedAnswer = z.looseObject({});

export const explainAnswer = z.looseObject({
  key: z.string(),
  policy: z.looseObject({
    mode: z.enum(["none", "idle", "daily", "both"]),
    source: z.enum(["default", "by_chat_type", "by_platform"]),
  }),
  overlap: z.looseObject({
    mode: z.enum(["queue", "interrupt", "concurrent"]),
    debounce_ms: z.number().int(),
    max_batch: z.number().int(),
    source: z.enum(["default", "by_chat_type", "by_platform"]),
  }),
  session: sessionRow.nullable(),
  last_active_at: nullableMs,
  deadline: z.object({
    at: nullableMs,
    reason: z.enum(["idle", "daily"]).nullable(),
    idle_at: nullableMs,
    daily_at: nullableMs,
    daily_at_local: z.string().nullable(),
    timezone: z.string(),
  }),
  alarm_at: nullableMs.describe("the routing object's one alarm as set"),
  would: z.looseObject({
    action: z.enum(["append", "reopen", "fresh"]),
    reason: z.enum(["no_session", "live", "recoverable", "expired", "ended"]),
    expire: z.object({ session_id: z.string(), reason: z.enum(["idle", "daily"]) }).optional(),
  }),
  open_run: runView.nullable(),
  waiting: z.number().int(),
});

export const metricsAnswer = z.looseObject({
  messages_routed: z.number().int(),
  sessions_created: z.number().int(),
  sessions_ended: z.record(z.string(), z.number().int()),
  events_delivered: z.number().int(),
  events_failed: z.number().int(),
  d1_rows_read: z.number().int(),
  d1_rows_written: z.number().int(),
  d1_rows_read_ingress: z.number().int(),
  d1_rows_written_ingress: z.number().int(),
});

export const ownsAnswer = z.object({ owns: z.literal(true) });
export const progressAnswer = z.looseObject({ owns: z.literal(true), sent: z.boolean() });
export const recordedAnswer = z.object({ recorded: z.literal(true) });
export const rotatedAnswer = z.object({ session_id: z.string() });
export const cronAnswer = z.object({ run_id: z.string(), session_id: z.string().nullable(), session_key: z.string() });
export const healthAnswer = z.object({ ok: z.literal(true) });
