/**
 * The routing object's own SQLite storage: its routing entry and its outbox of
 * due work (agent hand-offs, platform deliveries, event deliveries). Tables are
 * created idempotently when the object wakes; every write is synchronous, so the
 * runtime's output gate makes it durable before anything the object sends next
 * (a D1 call, an RPC answer) leaves the object.
 */

import { recordObjectStorage } from "../metrics";

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

export type OutboxKind = "run" | "delivery" | "events" | "check";

export interface OutboxItem<P = unknown> {
  id: string;
  kind: OutboxKind;
  payload: P;
  dueAt: number;
  attempts: number;
  lastError: string | null;
  createdAt: number;
}

interface OutboxRow extends Record<string, SqlStorageValue> {
  id: string;
  kind: string;
  payload: string;
  due_at: number;
  attempts: number;
  last_error: string | null;
  created_at: number;
}

export class RouterStorage {
  constructor(private readonly sql: SqlStorage) {
    this.sql.exec(`CREATE TABLE IF NOT EXISTS entry (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL)`);
    // WITHOUT ROWID: an insert writes one row, not a row and a primary-key entry.
    // `seq` keeps the order items were staged in (two messages staged in the same
    // millisecond are handed over in order of arrival).
    this.sql.exec(`CREATE TABLE IF NOT EXISTS outbox (
      id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, due_at INTEGER NOT NULL,
      attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL,
      seq INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID`);
    try {
      this.sql.exec(`SELECT seq FROM outbox LIMIT 0`);
    } catch {
      // An outbox created before `seq` existed.
      this.sql.exec(`ALTER TABLE outbox ADD COLUMN seq INTEGER NOT NULL DEFAULT 0`);
    }
    // The outbox holds a handful of rows at a time: scanning them is cheaper than an
    // index written twice (insert and delete) for every message.
    this.sql.exec(`DROP INDEX IF EXISTS outbox_due`);
    this.lastSeq = this.sql.exec<{ last: number }>(`SELECT COALESCE(MAX(seq), 0) AS last FROM outbox`).one().last;
  }

  private lastSeq: number;

  /** Runs one statement, adding its rows read and written to the metrics (billed like D1's). */
  private run<T extends Record<string, SqlStorageValue>>(query: string, ...params: SqlStorageValue[]): T[] {
    const cursor = this.sql.exec<T>(query, ...params);
    const rows = cursor.toArray();
    recordObjectStorage(cursor.rowsRead, cursor.rowsWritten);
    return rows;
  }

  readEntry(): Entry | null {
    const row = this.run<{ data: string }>(`SELECT data FROM entry WHERE id = 1`)[0];
    return row ? (JSON.parse(row.data) as Entry) : null;
  }

  writeEntry(entry: Entry): void {
    this.run(
      `INSERT INTO entry (id, data) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET data = excluded.data`,
      JSON.stringify(entry),
    );
  }

  deleteEntry(): void {
    this.run(`DELETE FROM entry`);
  }

  /** Adds a new item (a plain insert: an upsert costs SQLite a second row written). */
  add(item: OutboxItem): void {
    this.insert(item, "");
  }

  /** Writes an item, replacing the one with its id. */
  put(item: OutboxItem): void {
    this.insert(
      item,
      `ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, payload = excluded.payload, due_at = excluded.due_at,
        attempts = excluded.attempts, last_error = excluded.last_error`,
    );
  }

  private insert(item: OutboxItem, onConflict: string): void {
    this.run(
      `INSERT INTO outbox (id, kind, payload, due_at, attempts, last_error, created_at, seq)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?) ${onConflict}`,
      item.id,
      item.kind,
      JSON.stringify(item.payload),
      item.dueAt,
      item.attempts,
      item.lastError,
      item.createdAt,
      ++this.lastSeq,
    );
  }

  get<P>(id: string): OutboxItem<P> | null {
    const row = this.run<OutboxRow>(`SELECT * FROM outbox WHERE id = ?`, id)[0];
    return row ? toItem<P>(row) : null;
  }

  delete(id: string): void {
    this.run(`DELETE FROM outbox WHERE id = ?`, id);
  }

  /** Items due at or before `now`, oldest first. */
  due(now: number, limit = 50): OutboxItem[] {
    return this.run<OutboxRow>(`SELECT * FROM outbox WHERE due_at <= ? ORDER BY due_at, seq LIMIT ?`, now, limit).map(
      (row) => toItem(row),
    );
  }

  nextDueAt(): number | null {
    const row = this.run<{ next: number | null }>(`SELECT MIN(due_at) AS next FROM outbox`)[0];
    return row?.next ?? null;
  }

  all(): OutboxItem[] {
    return this.run<OutboxRow>(`SELECT * FROM outbox ORDER BY due_at, seq`).map((row) => toItem(row));
  }
}

function toItem<P>(row: OutboxRow): OutboxItem<P> {
  return {
    id: row.id,
    kind: row.kind as OutboxKind,
    payload: JSON.parse(row.payload) as P,
    dueAt: row.due_at,
    attempts: row.attempts,
    lastError: row.last_error,
    createdAt: row.created_at,
  };
}
