/**
 * What the routing object keeps for overlapping messages (spec "Overlapping
 * messages"), in its own SQLite so it survives a restart:
 * - `overlap_waiting`: stored user messages no run carries yet, each with the
 *   routed message (a batch's hand-off is rebuilt from it after a restart), staged
 *   before the D1 batch that stores the message and confirmed once D1 has it;
 * - `overlap_accepted`: runs the agent accepted (202) and has not finished, which
 *   keep later messages waiting in `queue` mode (a run still in the outbox does so
 *   by its outbox item), each with when its lease ends as last read: the alarm comes
 *   then, so what waits goes on once the run falls silent, entry or no entry.
 * - `overlap_marks`: per session, the newest waiting row (its seq) when a run was
 *   last dispatched from the list: what waits at or below it was left behind by
 *   `max_batch`, not sent while that run was unfinished, so it does not interrupt it.
 * Created idempotently when the object wakes; every write is synchronous.
 */
import type { RoutedMessage } from "../domain/inbound";
import { metered } from "./outbox-table";

/** One waiting message as stored. */
export interface WaitingRow {
  eventId: string;
  /** The session whose next run carries it (a rotation moves it to the continuation). */
  sessionId: string;
  /** The session D1 stored it in (its `run_id` is set there). */
  storedIn: string;
  message: RoutedMessage;
  /** D1 has the message (false only for a row staged before a batch whose outcome a restart lost). */
  confirmed: boolean;
}

interface WaitingSqlRow extends Record<string, SqlStorageValue> {
  event_id: string;
  session_id: string;
  stored_in: string;
  message: string;
  confirmed: number;
}

export class WaitingRoom {
  constructor(private readonly sql: SqlStorage) {
    sql.exec(`CREATE TABLE IF NOT EXISTS overlap_waiting (
      seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL,
      stored_in TEXT NOT NULL, received_at INTEGER NOT NULL, message TEXT NOT NULL, confirmed INTEGER NOT NULL DEFAULT 0)`);
    sql.exec(`CREATE TABLE IF NOT EXISTS overlap_accepted (
      run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, messages TEXT NOT NULL, lease_until INTEGER)`);
    try {
      sql.exec(`SELECT lease_until FROM overlap_accepted LIMIT 0`);
    } catch {
      // Accepted runs recorded before `lease_until` existed: null, so the next alarm looks at each.
      sql.exec(`ALTER TABLE overlap_accepted ADD COLUMN lease_until INTEGER`);
    }
    sql.exec(`CREATE TABLE IF NOT EXISTS overlap_marks (session_id TEXT PRIMARY KEY, seq INTEGER NOT NULL)`);
  }

  /** A run of `sessionId` was just dispatched from the list: what waits now was left behind by it. */
  markDispatched(sessionId: string): void {
    metered(
      this.sql,
      `INSERT OR REPLACE INTO overlap_marks (session_id, seq)
        VALUES (?, (SELECT COALESCE(MAX(seq), 0) FROM overlap_waiting))`,
      sessionId,
    );
  }

  /** Whether a message of `sessionId` waits that came after its last run was dispatched from the list. */
  arrivedSinceDispatch(sessionId: string): boolean {
    const rows = metered(
      this.sql,
      `SELECT 1 AS one FROM overlap_waiting WHERE session_id = ?
        AND seq > COALESCE((SELECT seq FROM overlap_marks WHERE session_id = ?), -1) LIMIT 1`,
      sessionId,
      sessionId,
    );
    return rows.length > 0;
  }

  /**
   * Stages a message that waits, before the D1 batch that stores it. False (and
   * nothing written) when it already waits: a platform's resend must not replace,
   * nor on its duplicate answer remove, the row of the message it repeats.
   */
  add(sessionId: string, message: RoutedMessage): boolean {
    const known = metered(this.sql, `SELECT 1 AS one FROM overlap_waiting WHERE event_id = ?`, message.eventId);
    if (known.length > 0) return false;
    metered(
      this.sql,
      `INSERT INTO overlap_waiting (event_id, session_id, stored_in, received_at, message, confirmed)
        VALUES (?, ?, ?, ?, ?, 0)`,
      message.eventId,
      sessionId,
      sessionId,
      message.receivedAt,
      JSON.stringify(message),
    );
    return true;
  }

  /** D1 stored the message in `sessionId`. */
  confirm(eventId: string, sessionId: string): void {
    metered(
      this.sql,
      `UPDATE overlap_waiting SET confirmed = 1, session_id = ?, stored_in = ? WHERE event_id = ?`,
      sessionId,
      sessionId,
      eventId,
    );
  }

  remove(eventIds: readonly string[]): void {
    for (const eventId of eventIds) metered(this.sql, `DELETE FROM overlap_waiting WHERE event_id = ?`, eventId);
  }

  /** Every waiting message, oldest first (arrival order within one instant). */
  all(): WaitingRow[] {
    return metered<WaitingSqlRow>(
      this.sql,
      `SELECT event_id, session_id, stored_in, message, confirmed FROM overlap_waiting ORDER BY received_at, seq`,
    ).map((row) => ({
      eventId: row.event_id,
      sessionId: row.session_id,
      storedIn: row.stored_in,
      message: JSON.parse(row.message) as RoutedMessage,
      confirmed: row.confirmed === 1,
    }));
  }

  /** How many messages of `sessionId` wait (all sessions when omitted). */
  count(sessionId?: string): number {
    const rows =
      sessionId === undefined
        ? metered<{ n: number }>(this.sql, `SELECT COUNT(*) AS n FROM overlap_waiting`)
        : metered<{ n: number }>(this.sql, `SELECT COUNT(*) AS n FROM overlap_waiting WHERE session_id = ?`, sessionId);
    return rows[0]?.n ?? 0;
  }

  /** The session ended: nothing of it waits any more (D1 records them not dispatched in the ending batch). */
  dropSession(sessionId: string): void {
    metered(this.sql, `DELETE FROM overlap_waiting WHERE session_id = ?`, sessionId);
    metered(this.sql, `DELETE FROM overlap_accepted WHERE session_id = ?`, sessionId);
    metered(this.sql, `DELETE FROM overlap_marks WHERE session_id = ?`, sessionId);
  }

  /** A rotation: what waits in `from`, and its accepted runs, go on in the continuation `to`. */
  moveSession(from: string, to: string): void {
    metered(this.sql, `UPDATE overlap_waiting SET session_id = ? WHERE session_id = ?`, to, from);
    metered(this.sql, `UPDATE overlap_accepted SET session_id = ? WHERE session_id = ?`, to, from);
    metered(this.sql, `UPDATE overlap_marks SET session_id = ? WHERE session_id = ?`, to, from);
  }

  /** The agent accepted `runId` (202): it is unfinished until its reply, revocation or lease lapse (`leaseUntil`). */
  accept(runId: string, sessionId: string, messages: readonly RoutedMessage[], leaseUntil: number): void {
    metered(
      this.sql,
      `INSERT OR REPLACE INTO overlap_accepted (run_id, session_id, messages, lease_until) VALUES (?, ?, ?, ?)`,
      runId,
      sessionId,
      JSON.stringify(messages),
      leaseUntil,
    );
  }

  /** The accepted run is still open in D1, its lease (heartbeats) running to `leaseUntil`. */
  heardUntil(runId: string, leaseUntil: number): void {
    metered(this.sql, `UPDATE overlap_accepted SET lease_until = ? WHERE run_id = ?`, leaseUntil, runId);
  }

  /** The messages an accepted run carries (an interrupt hands them to the run that replaces it). */
  acceptedMessages(runId: string): RoutedMessage[] {
    const [row] = metered<{ messages: string }>(
      this.sql,
      `SELECT messages FROM overlap_accepted WHERE run_id = ?`,
      runId,
    );
    return row ? (JSON.parse(row.messages) as RoutedMessage[]) : [];
  }

  /** The accepted run is over (finished, revoked, failed or lapsed). */
  over(runId: string): void {
    metered(this.sql, `DELETE FROM overlap_accepted WHERE run_id = ?`, runId);
  }

  /**
   * Whether `sessionId` has an unfinished run (its hand-off in the outbox, by the
   * outbox's `session_id` column, or accepted by the agent) or, with `orWaiting`,
   * messages already waiting. One statement, with no payload parsed: it runs on
   * every message in `queue` mode. The three tables hold a handful of rows each and
   * are scanned, not indexed: an index on `session_id` would add rows written to
   * every hand-off, waiting message and accepted run (priced a thousand times a row
   * read), to save the one row read that scanning an empty table costs.
   */
  busy(sessionId: string, orWaiting: boolean): boolean {
    const [row] = metered<{ busy: number }>(
      this.sql,
      `SELECT EXISTS (SELECT 1 FROM outbox WHERE kind = 'run' AND session_id = ?1)
          OR EXISTS (SELECT 1 FROM overlap_accepted WHERE session_id = ?1)
          OR (?2 AND EXISTS (SELECT 1 FROM overlap_waiting WHERE session_id = ?1)) AS busy`,
      sessionId,
      orWaiting ? 1 : 0,
    );
    return row?.busy === 1;
  }

  /**
   * What holds `sessionId`'s waiting messages back: a hand-off in the outbox (its
   * outcome pumps them), and the earliest lease end of its accepted runs (null: none;
   * 0 for a run whose lease was never recorded). One statement, as `busy`.
   */
  holds(sessionId: string): { staged: boolean; leaseEnd: number | null } {
    const [row] = metered<{ staged: number; lease_end: number | null }>(
      this.sql,
      `SELECT EXISTS (SELECT 1 FROM outbox WHERE kind = 'run' AND session_id = ?1) AS staged,
          (SELECT MIN(COALESCE(lease_until, 0)) FROM overlap_accepted WHERE session_id = ?1) AS lease_end`,
      sessionId,
    );
    return { staged: row?.staged === 1, leaseEnd: row?.lease_end ?? null };
  }

  /** The session of some accepted run believed unfinished, if any. */
  acceptedSession(): string | undefined {
    return metered<{ session_id: string }>(this.sql, `SELECT session_id FROM overlap_accepted LIMIT 1`)[0]?.session_id;
  }

  /** Accepted runs of `sessionId` believed unfinished. */
  accepted(sessionId: string): string[] {
    return metered<{ run_id: string }>(
      this.sql,
      `SELECT run_id FROM overlap_accepted WHERE session_id = ?`,
      sessionId,
    ).map((row) => row.run_id);
  }
}
