/**
 * The outbox's own SQLite table in the routing object: one row per item of due
 * work (agent hand-offs, platform deliveries, event deliveries, policy checks).
 * Created idempotently when the object wakes; every write is synchronous, so the
 * runtime's output gate makes it durable before anything the object sends next
 * (a D1 call, an RPC answer) leaves the object. Only the outbox (outbox.ts) and
 * tests that set up what a restart leaves behind use it.
 */
import { recordObjectStorage } from "../metrics";
import type { CheckWork, DeliveryWork, EventsWork, RunWork } from "./work";

/** The payload of each kind of item. */
export interface OutboxPayloads {
  run: RunWork;
  delivery: DeliveryWork;
  events: EventsWork;
  check: CheckWork;
}

export type OutboxKind = keyof OutboxPayloads;

const KINDS: readonly OutboxKind[] = ["run", "delivery", "events", "check"];

/** One item of one kind (`K`), as stored. */
export interface OutboxItem<K extends OutboxKind = OutboxKind> {
  id: string;
  kind: K;
  payload: OutboxPayloads[K];
  dueAt: number;
  attempts: number;
  lastError: string | null;
  createdAt: number;
}

/** Any item, as a union narrowed by its `kind`. */
export type AnyOutboxItem = { [K in OutboxKind]: OutboxItem<K> }[OutboxKind];

interface OutboxRow extends Record<string, SqlStorageValue> {
  id: string;
  kind: string;
  payload: string;
  due_at: number;
  attempts: number;
  last_error: string | null;
  created_at: number;
  seq: number;
}

/** Runs one statement, adding its rows read and written to the metrics (billed like D1's). */
export function metered<T extends Record<string, SqlStorageValue>>(
  sql: SqlStorage,
  query: string,
  ...params: SqlStorageValue[]
): T[] {
  const cursor = sql.exec<T>(query, ...params);
  const rows = cursor.toArray();
  recordObjectStorage(cursor.rowsRead, cursor.rowsWritten);
  return rows;
}

export class OutboxTable {
  private lastSeq: number;

  constructor(private readonly sql: SqlStorage) {
    // WITHOUT ROWID: an insert writes one row, not a row and a primary-key entry.
    // `seq` keeps the order items were staged in (two messages staged in the same
    // millisecond are handed over in order of arrival).
    this.sql.exec(`CREATE TABLE IF NOT EXISTS outbox (
      id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, due_at INTEGER NOT NULL,
      attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL,
      seq INTEGER NOT NULL DEFAULT 0, session_id TEXT) WITHOUT ROWID`);
    try {
      this.sql.exec(`SELECT seq FROM outbox LIMIT 0`);
    } catch {
      // An outbox created before `seq` existed.
      this.sql.exec(`ALTER TABLE outbox ADD COLUMN seq INTEGER NOT NULL DEFAULT 0`);
    }
    try {
      this.sql.exec(`SELECT session_id FROM outbox LIMIT 0`);
    } catch {
      // An outbox created before `session_id` existed: its hand-offs learn their session.
      this.sql.exec(`ALTER TABLE outbox ADD COLUMN session_id TEXT`);
      this.sql.exec(`UPDATE outbox SET session_id = json_extract(payload, '$.sessionId') WHERE kind = 'run'`);
    }
    // The outbox holds a handful of rows at a time: scanning them is cheaper than an
    // index written twice (insert and delete) for every message.
    this.sql.exec(`DROP INDEX IF EXISTS outbox_due`);
    this.lastSeq = this.sql.exec<{ last: number }>(`SELECT COALESCE(MAX(seq), 0) AS last FROM outbox`).one().last;
  }

  /**
   * Adds a new item. A plain insert: its callers stage only fresh ids, and one that
   * is already staged would fail loudly here rather than be overwritten unseen.
   */
  add(item: OutboxItem): void {
    this.insert(item, "");
  }

  /** Writes an item, replacing the one with its id. */
  put(item: OutboxItem): void {
    this.insert(
      item,
      `ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, payload = excluded.payload, due_at = excluded.due_at,
        attempts = excluded.attempts, last_error = excluded.last_error, session_id = excluded.session_id`,
    );
  }

  private insert(item: OutboxItem, onConflict: string): void {
    metered(
      this.sql,
      `INSERT INTO outbox (id, kind, payload, due_at, attempts, last_error, created_at, seq, session_id)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ${onConflict}`,
      item.id,
      item.kind,
      JSON.stringify(item.payload),
      item.dueAt,
      item.attempts,
      item.lastError,
      item.createdAt,
      ++this.lastSeq,
      // A hand-off names its session in a column of its own, so whether a session has
      // one is asked of SQLite without parsing every payload (WaitingRoom.busy).
      item.kind === "run" ? (item.payload as RunWork).sessionId : null,
    );
  }

  /** The item with this id, of any kind. */
  get(id: string): AnyOutboxItem | null {
    const row = metered<OutboxRow>(this.sql, `SELECT * FROM outbox WHERE id = ?`, id)[0];
    return row ? toItem(row) : null;
  }

  delete(id: string): void {
    metered(this.sql, `DELETE FROM outbox WHERE id = ?`, id);
  }

  /** Items due at or before `now`, oldest first. */
  due(now: number, limit = 50): AnyOutboxItem[] {
    // Sorted here, not by SQLite: with no index to order by, its sorter counts a row
    // read per item on top of the scan, and the drain asks this after every item.
    return metered<OutboxRow>(this.sql, `SELECT * FROM outbox WHERE due_at <= ?`, now)
      .sort((a, b) => a.due_at - b.due_at || a.seq - b.seq)
      .slice(0, limit)
      .map(toItem);
  }

  nextDueAt(): number | null {
    const row = metered<{ next: number | null }>(this.sql, `SELECT MIN(due_at) AS next FROM outbox`)[0];
    return row?.next ?? null;
  }

  /** Whether a hand-off of the session other than `exceptId` is here (asked of its column, no payload parsed). */
  hasRunOf(sessionId: string, exceptId: string | null): boolean {
    return (
      metered(
        this.sql,
        `SELECT 1 FROM outbox WHERE kind = 'run' AND session_id = ? AND id IS NOT ? LIMIT 1`,
        sessionId,
        exceptId,
      ).length > 0
    );
  }

  all(): AnyOutboxItem[] {
    return metered<OutboxRow>(this.sql, `SELECT * FROM outbox ORDER BY due_at, seq`).map(toItem);
  }
}

function toItem(row: OutboxRow): AnyOutboxItem {
  const kind = KINDS.find((k) => k === row.kind);
  // Only this table's own writes put rows here; an unknown kind is a bug, not data to guess at.
  if (!kind) throw new Error(`outbox item ${row.id} has an unknown kind ${row.kind}`);
  const base = {
    id: row.id,
    payload: JSON.parse(row.payload),
    dueAt: row.due_at,
    attempts: row.attempts,
    lastError: row.last_error,
    createdAt: row.created_at,
  };
  return { ...base, kind };
}
