/**
 * The one way the gateway talks to D1: statements are built (by drizzle's query
 * builders or as SQL text), then run in a single `batch()` call, which D1 runs as
 * one transaction. Every batch adds D1's own `meta.rows_read` / `rows_written` to
 * the metrics, tagged with the path it ran on.
 *
 * drizzle's own `db.batch()` cannot take SQL text with parameters on D1, and its
 * single-statement calls use `raw()`, which returns no meta, so execution lives
 * here and drizzle is used to build queries and type rows.
 */
import { getTableColumns, type Table } from "drizzle-orm";
import { drizzle, type DrizzleD1Database } from "drizzle-orm/d1";
import { recordD1Batch, type D1Path } from "../metrics";

export interface Statement<T> {
  readonly sql: string;
  readonly params: readonly unknown[];
  readonly read: (result: D1Result) => T;
}

type Results<S extends readonly Statement<unknown>[]> = { [K in keyof S]: S[K] extends Statement<infer T> ? T : never };

/** A D1 binding bound to the path its statements count against. */
export class Database {
  /** Query builder only: never executes (execution goes through `batch`). */
  readonly q: DrizzleD1Database;

  constructor(
    private readonly binding: D1Database,
    private readonly path: D1Path,
  ) {
    this.q = drizzle(binding, { casing: "snake_case" });
  }

  /** Runs the statements as one D1 batch (one round trip, one transaction). */
  async batch<const S extends readonly Statement<unknown>[]>(...statements: S): Promise<Results<S>> {
    const prepared = statements.map((s) => this.binding.prepare(s.sql).bind(...s.params));
    const faultAt = takeFault(statements);
    if (faultAt === AFTER_COMMIT) {
      await this.binding.batch(prepared);
      throw new Error("D1 fault injected by test: the batch committed, then its caller died");
    }
    if (typeof faultAt === "function") await faultAt(this.binding);
    else if (faultAt !== null) prepared[faultAt] = this.binding.prepare(FAULT_SQL);
    const results = await this.binding.batch(prepared);
    recordD1Batch(
      this.path,
      results.map((r) => r.meta),
    );
    return statements.map((s, i) => s.read(results[i] as D1Result)) as Results<S>;
  }

  /** The same database, counted against another path. */
  on(path: D1Path): Database {
    return path === this.path ? this : new Database(this.binding, path);
  }
}

/**
 * Test seam (D1 faults): the next batch that `match` accepts has its statement at
 * `index` replaced by one D1 refuses, so real D1 fails that batch there and rolls
 * it back, as a D1 outage mid-batch would. Set only by tests (`injectD1Fault`);
 * nothing in the gateway sets it, so it is never active in production. Module
 * state: it reaches the routing objects too, which run in the tests' isolate.
 */
export interface D1Fault {
  /** Which statement of the batch fails (0-based; negative counts from the end). */
  index?: number;
  /** Which batch: by the SQL of its statements (default: the next one). */
  match?: (sql: readonly string[]) => boolean;
  /** How many matching batches fail (default 1). */
  times?: number;
  /**
   * Instead of failing a statement, let the whole batch commit and then throw, as a
   * process killed between D1's commit and what its caller does next (`index` unused).
   */
  afterCommit?: boolean;
  /**
   * Instead of failing the batch, run another writer's statements on the same D1
   * just before it, as a write that lands between the caller's read and its batch
   * (an operator's SQL, a second gateway instance). The batch then runs as usual.
   */
  before?: (db: D1Database) => Promise<unknown>;
}
const AFTER_COMMIT = -1;
const FAULT_SQL = "SELECT * FROM d1_fault_injected_by_test";
let fault: (D1Fault & { left: number; hits: number }) | null = null;

/** Tests only: arms a D1 fault (null disarms). Returns how many batches it failed so far. */
export function injectD1Fault(next: D1Fault | null): { hits: () => number } {
  fault = next ? { ...next, left: next.times ?? 1, hits: 0 } : null;
  const armed = fault;
  return { hits: () => armed?.hits ?? 0 };
}

function takeFault(statements: readonly Statement<unknown>[]): number | NonNullable<D1Fault["before"]> | null {
  if (!fault || fault.left <= 0) return null;
  const sql = statements.map((s) => s.sql);
  if (fault.match && !fault.match(sql)) return null;
  if (fault.afterCommit || fault.before) {
    fault.left -= 1;
    fault.hits += 1;
    return fault.before ?? AFTER_COMMIT;
  }
  const index = fault.index ?? 0;
  const at = index < 0 ? statements.length + index : index;
  if (at < 0 || at >= statements.length) return null;
  fault.left -= 1;
  fault.hits += 1;
  return at;
}

/**
 * Whether a batch that threw may still have committed. D1 runs a batch as one
 * transaction: when SQLite itself refused a statement (its error names a `SQLITE_`
 * code), the whole batch was rolled back. Any other failure (the connection lost, a
 * timeout, the object reset) may have come after the commit, so what was staged for
 * the batch stays, and D1's own record decides later.
 */
export function mayHaveCommitted(error: unknown): boolean {
  return !/\bSQLITE_[A-Z]+/.test(error instanceof Error ? error.message : String(error));
}

const changes = (result: D1Result) => result.meta.changes ?? 0;

/** A statement from SQL text with `?` parameters, read as its changed-row count. */
export function exec(sql: string, ...params: unknown[]): Statement<number> {
  return { sql, params, read: changes };
}

/** A statement from SQL text whose rows are returned as D1 gives them (snake_case). */
export function query<T>(sql: string, ...params: unknown[]): Statement<T[]> {
  return { sql, params, read: (result) => result.results as T[] };
}

/** A statement from a drizzle query builder, read as its changed-row count. */
export function execBuilt(builder: { toSQL(): { sql: string; params: unknown[] } }): Statement<number> {
  const { sql, params } = builder.toSQL();
  return { sql, params, read: changes };
}

/** A statement from a drizzle select on `table`, mapped to the table's typed rows. */
export function selectRows<T extends Table>(
  table: T,
  builder: { toSQL(): { sql: string; params: unknown[] } },
): Statement<T["$inferSelect"][]> {
  const { sql, params } = builder.toSQL();
  const toRow = rowMapper(table);
  return { sql, params, read: (result) => (result.results as Record<string, unknown>[]).map(toRow) };
}

/** A statement from SQL text selecting whole rows of `table`, mapped to its typed rows. */
export function selectRowsSql<T extends Table>(
  table: T,
  sql: string,
  ...params: unknown[]
): Statement<T["$inferSelect"][]> {
  const toRow = rowMapper(table);
  return { sql, params, read: (result) => (result.results as Record<string, unknown>[]).map(toRow) };
}

const snake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** Maps a D1 row (snake_case columns) to the table's typed row, decoding e.g. booleans. */
export function rowMapper<T extends Table>(table: T): (raw: Record<string, unknown>) => T["$inferSelect"] {
  const columns = Object.entries(getTableColumns(table));
  return (raw) => {
    const row: Record<string, unknown> = {};
    for (const [key, column] of columns) {
      const value = raw[snake(key)];
      row[key] = value === null || value === undefined ? null : column.mapFromDriverValue(value);
    }
    return row as T["$inferSelect"];
  };
}
