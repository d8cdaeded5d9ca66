/**
 * The D1 schema. `sessions` and `messages` (and their column names) are part of
 * the product contract: operators edit them by SQL. Every time column holds
 * integer milliseconds since the epoch. Column names come out snake_case
 * (`casing: "snake_case"` here and in drizzle.config.ts).
 *
 * The migrations declare `sessions`, `messages` and `inbound_events` WITHOUT
 * ROWID (drizzle cannot say so): each insert then writes one b-tree row instead
 * of a table row plus a primary-key index entry, which is a third of the rows
 * written on the hot path.
 */
import { sql } from "drizzle-orm";
import { index, integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";

export const sessions = sqliteTable(
  "sessions",
  {
    id: text().primaryKey(),
    sessionKey: text().notNull(),
    platform: text().notNull(),
    chatType: text().notNull(),
    startedAt: integer().notNull(),
    /** Newest `created_at` of the session's user and assistant messages (started_at while empty). */
    lastActiveAt: integer().notNull(),
    endedAt: integer(),
    /** Null exactly while the session is live. */
    endReason: text(),
    /** The session this one continues after a rotation (`compression`). */
    parentSessionId: text(),
    /** The session this one replaced after an end (reset, command, operator). */
    previousSessionId: text(),
    /** The end reason of `previous_session_id`, and whether it had activity. */
    resetReason: text(),
    resetHadActivity: integer({ mode: "boolean" }),
    /** The reset notice still owed to the first reply (spec invariant 10); cleared once sent. */
    noticePending: text(),
    /** User and assistant messages stored; also the `seq` of the newest one. */
    messageCount: integer().notNull().default(0),
    /** The latest run dispatched in this session (spec "current run"). */
    currentRunId: text(),
    /**
     * When someone must look at this row again (its deadline, as the routing object
     * last knew it); null once the row is a durable boundary. The sweep finds
     * sessions whose routing object missed this moment.
     */
    sweepAt: integer(),
  },
  (table) => [
    index("sessions_key_started").on(table.sessionKey, table.startedAt),
    index("sessions_started").on(table.startedAt),
    index("sessions_sweep")
      .on(table.sweepAt)
      .where(sql`${table.sweepAt} IS NOT NULL`),
  ],
);

export const messages = sqliteTable(
  "messages",
  {
    sessionId: text().notNull(),
    /** 1, 2, 3… within the session, in order of storage. */
    seq: integer().notNull(),
    role: text({ enum: ["user", "assistant", "system"] }).notNull(),
    text: text().notNull(),
    createdAt: integer().notNull(),
    /** The platform event the user message came from (its dedupe id). */
    eventId: text(),
    /**
     * The run that produced (assistant) or carries (user) this message; null while a
     * user message waits for a run (spec "Overlapping messages").
     */
    runId: text(),
    /**
     * Why a user message was never handed to the agent (`stopped`, `new_command`,
     * `session_ended`: spec invariant 11); null for every other message.
     */
    notDispatched: text({ enum: ["stopped", "new_command", "session_ended"] }),
    /**
     * JSON list of the user's media, as the operator API shows them
     * (`[{id, kind, mime_type, name, size}]`); null for a message without any.
     */
    attachments: text(),
  },
  (table) => [primaryKey({ columns: [table.sessionId, table.seq] })],
);

/**
 * Where each attachment's bytes are (spec "Attachments"): the platform reference
 * behind a gateway id, read only by `GET /v1/attachments/{id}`, never handed to the
 * agent. Written in the message's own batch, only for messages with media, so a
 * text-only message costs what it did. WITHOUT ROWID in the migration (one b-tree
 * row per attachment).
 */
export const attachments = sqliteTable("attachments", {
  id: text().primaryKey(),
  /** The session whose message carries it: its runs may fetch it. */
  sessionId: text().notNull(),
  platform: text().notNull(),
  /** Telegram file_id, Slack url_private_download, Discord URL, WhatsApp media id, generic URL. */
  ref: text().notNull(),
  kind: text().notNull(),
  mimeType: text(),
  name: text(),
  size: integer(),
  createdAt: integer().notNull(),
});

/**
 * Dedupe marks of inbound platform events, written in the same D1 batch as the
 * message they stored. Event ids are remembered per platform (spec invariant 9).
 * Keyed by the UTC day first so that pruning old marks is a range delete on the
 * primary key with no extra index to write on every message.
 */
export const inboundEvents = sqliteTable(
  "inbound_events",
  {
    day: integer().notNull(),
    platform: text().notNull(),
    eventId: text().notNull(),
    sessionKey: text().notNull(),
    /** The session the event went to (null for a command that found none). */
    sessionId: text(),
    runId: text(),
    receivedAt: integer().notNull(),
  },
  (table) => [primaryKey({ columns: [table.day, table.platform, table.eventId] })],
);

/**
 * Lifecycle events, an outbox: each row is written in the same batch as the state
 * change it reports, with an id derived from that change so that writing it twice
 * is a no-op, then delivered to HOOK_URLS at least once.
 */
export const events = sqliteTable(
  "events",
  {
    id: text().primaryKey(),
    type: text().notNull(),
    sessionId: text().notNull(),
    sessionKey: text().notNull(),
    reason: text(),
    occurredAt: integer().notNull(),
    /** The event's JSON body without the transcript, which is read at delivery. */
    payload: text().notNull(),
    status: text({ enum: ["pending", "sent", "failed", "skipped"] })
      .notNull()
      .default("pending"),
    attempts: integer().notNull().default(0),
    nextAttemptAt: integer(),
    lastStatus: integer(),
    lastError: text(),
    /** JSON array of the hook URLs that already acknowledged this event. */
    deliveredTo: text().notNull().default("[]"),
    createdAt: integer().notNull(),
  },
  (table) => [
    index("events_session").on(table.sessionId, table.createdAt),
    index("events_due")
      .on(table.nextAttemptAt)
      .where(sql`${table.status} = 'pending'`),
  ],
);

/**
 * Runs: one turn handed to the agent. The token is kept only as its SHA-256.
 * A run is revoked (`revoked_reason`) when its session ends (`/new` and `/reset`:
 * superseded, `/stop`: stopped, any other end: session_ended); a revoked run's
 * reply is kept here for audit and never added to a session.
 */
export const runs = sqliteTable(
  "runs",
  {
    id: text().primaryKey(),
    sessionId: text().notNull(),
    sessionKey: text().notNull(),
    /** The inbound event (or cron job run) that started it. */
    eventId: text().notNull(),
    tokenHash: text().notNull(),
    /** JSON: where the reply goes (the platform adapter's coordinates). */
    replyTo: text().notNull(),
    createdAt: integer().notNull(),
    dispatchedAt: integer(),
    lastHeartbeatAt: integer(),
    finishedAt: integer(),
    replyText: text(),
    revokedReason: text(),
    failedAt: integer(),
    lastError: text(),
    /** Hand-off attempts since it was staged (or since an operator retry). */
    attempts: integer().notNull().default(0),
    /** When the agent accepted it with 202 (it replies later through the run API). */
    acceptedAt: integer(),
    /**
     * JSON: the routed message it hands over (without the token), so an operator can
     * hand a failed run to the agent again.
     */
    message: text(),
    /**
     * JSON: every routed message the run carries, oldest first (the hand-off's
     * `messages`); null for a run that carries only `message`.
     */
    messages: text(),
    /**
     * Whether its hand-off said `is_new` (the session's first run), so an operator's
     * retry hands it over as it first went; null for a run written before it existed.
     */
    isNew: integer({ mode: "boolean" }),
  },
  // Only unfinished, unrevoked runs are ever looked up by session (to revoke or move
  // them), so only they are indexed: a run answered at once costs no index write.
  (table) => [
    index("runs_open")
      .on(table.sessionId)
      .where(sql`${table.finishedAt} IS NULL AND ${table.revokedReason} IS NULL`),
  ],
);

/**
 * Outbound platform calls (spec `deliveries`): replies, progress and command
 * answers, with their attempts. A reply's row is written with the reply itself.
 */
export const deliveries = sqliteTable(
  "deliveries",
  {
    id: text().primaryKey(),
    sessionId: text().notNull(),
    runId: text(),
    /** The inbound event this answers. */
    eventId: text(),
    platform: text().notNull(),
    kind: text({ enum: ["reply", "progress", "command"] }).notNull(),
    status: text({ enum: ["pending", "sent", "failed"] })
      .notNull()
      .default("pending"),
    attempts: integer().notNull().default(0),
    lastStatus: integer(),
    lastError: text(),
    text: text().notNull(),
    /** The reset notice carried by this reply (spec invariant 10), if any. */
    notice: text(),
    /** JSON: the reply coordinates handed to the platform adapter. */
    target: text().notNull(),
    createdAt: integer().notNull(),
    updatedAt: integer().notNull(),
  },
  (table) => [index("deliveries_session").on(table.sessionId, table.createdAt)],
);

export type SessionRow = typeof sessions.$inferSelect;
export type MessageRow = typeof messages.$inferSelect;
export type EventRow = typeof events.$inferSelect;
export type RunRow = typeof runs.$inferSelect;
export type DeliveryRow = typeof deliveries.$inferSelect;
export type AttachmentRow = typeof attachments.$inferSelect;
