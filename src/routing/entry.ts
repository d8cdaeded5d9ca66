/**
 * The routing entry (which session is live for this key, a cache of D1) and the
 * live session's deadline, with one owner: this class is the only code that
 * writes either. The entry is kept in the object's SQLite table `entry` so it
 * survives eviction; the deadline lives in memory only (undefined after a wake,
 * until the alarm reads the row again).
 */
import type { NewSession } from "../db/sessions";
import type { SessionRow } from "../db/schema";
import type { RoutedMessage } from "../domain/inbound";
import { deadline, type ResetPolicy } from "../domain/reset-policy";
import type { Replaced } from "../domain/routing-decision";
import { metered } from "./outbox-table";

/** Which session is live for this key, as the object last knew it (a cache of D1). */
export interface Entry {
  sessionKey: string;
  platform: string;
  chatType: string;
  sessionId: string;
  parentId: string | null;
  /** Why the session replaced the one before it; handed to its first run. */
  reset: { reason: string; had_activity: boolean; previous_session_id: string } | null;
  /** The session has had no run yet (its next run is `is_new`). */
  firstRunPending: boolean;
  /**
   * The session may still owe its first reply a reset notice (false once a reply
   * was added). An entry written before this field existed counts as true.
   */
  noticeOwed?: boolean;
}

/**
 * The entry of a session row read from D1. `runStaged`: a hand-off of the session
 * waits in the outbox. D1 names no current run until one goes out, so a staged
 * hand-off counts as the session's first run and the entry no longer owes one. (A
 * hand-off orphaned by a kill before its batch counts too, until confirming drops it.)
 */
export function entryFromRow(row: SessionRow, message: Pick<RoutedMessage, "sessionKey">, runStaged: boolean): Entry {
  return {
    sessionKey: message.sessionKey,
    platform: row.platform,
    chatType: row.chatType,
    sessionId: row.id,
    parentId: row.parentSessionId,
    reset: resetOf(row),
    firstRunPending: row.currentRunId === null && !runStaged,
    noticeOwed: row.noticePending !== null,
  };
}

/** Why the session replaced the one before it, as its row keeps it (null for a first session). */
export function resetOf(row: SessionRow): Entry["reset"] {
  return row.previousSessionId && row.resetReason
    ? { reason: row.resetReason, had_activity: !!row.resetHadActivity, previous_session_id: row.previousSessionId }
    : null;
}

/** The entry of a session just inserted (`replaced`: the session it replaced, if any). */
export function entryFromNew(
  session: NewSession,
  message: Pick<RoutedMessage, "sessionKey">,
  replaced: Replaced | null,
  firstRunPending = true,
): Entry {
  return {
    sessionKey: message.sessionKey,
    platform: session.platform,
    chatType: session.chatType,
    sessionId: session.id,
    parentId: session.parentSessionId,
    reset: replaced
      ? { reason: replaced.reason, had_activity: replaced.hadActivity, previous_session_id: replaced.sessionId }
      : null,
    firstRunPending,
    noticeOwed: session.noticePending !== null,
  };
}

/** The entry and the live deadline of one routing object. */
export class EntryState {
  private current: Entry | null;
  /** Deadline of the live session as last computed; undefined until known after a wake. */
  private deadline: number | null | undefined = undefined;

  constructor(private readonly sql: SqlStorage) {
    this.sql.exec(`CREATE TABLE IF NOT EXISTS entry (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL)`);
    const row = metered<{ data: string }>(this.sql, `SELECT data FROM entry WHERE id = 1`)[0];
    this.current = row ? (JSON.parse(row.data) as Entry) : null;
  }

  /** The entry, or null when this key has none (a new key, or forgotten). */
  get entry(): Entry | null {
    return this.current;
  }

  /** The live session's deadline: a time, null (none), or undefined (unknown: read the row). */
  get liveDeadline(): number | null | undefined {
    return this.deadline;
  }

  /** Whether `sessionId` is the entry's session. */
  isLive(sessionId: string): boolean {
    return this.current?.sessionId === sessionId;
  }

  /** The entry now names this session (stored at once). */
  adopt(entry: Entry): void {
    this.current = entry;
    metered(
      this.sql,
      `INSERT INTO entry (id, data) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET data = excluded.data`,
      JSON.stringify(entry),
    );
  }

  /** Changes some flags of the entry (a no-op without one). */
  update(patch: Partial<Pick<Entry, "firstRunPending" | "noticeOwed">>): void {
    if (this.current) this.adopt({ ...this.current, ...patch });
  }

  /** The live session just had activity at `now`: its deadline moves. */
  markActive(policy: ResetPolicy, now: number): void {
    this.deadline = deadline(policy, now);
  }

  /** The live session's deadline is now `at` (null: none; undefined: unknown, the alarm reads the row). */
  setDeadline(at: number | null | undefined): void {
    this.deadline = at;
  }

  /** What was learnt of one session's next look: it is the deadline only if that session is the entry's. */
  learnt(sessionId: string, at: number | null): void {
    if (this.isLive(sessionId)) this.deadline = at;
  }

  /** Forgets the entry and its deadline (D1 keeps the sessions). */
  forget(): void {
    metered(this.sql, `DELETE FROM entry`);
    this.current = null;
    this.deadline = null;
  }
}
