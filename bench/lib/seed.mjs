// Direct access to a target's local D1 file (only while its wrangler dev is
// stopped): the "grown" seeding, written in bulk in one transaction with prepared
// statements, and the burst's sequence check.
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";

/** The local D1 database file under a `--persist-to` directory (the one that has a `sessions` table). */
export function findD1File(persistDir) {
  const dir = join(persistDir, "v3", "d1", "miniflare-D1DatabaseObject");
  if (!existsSync(dir)) throw new Error(`no local D1 under ${dir}`);
  const candidates = readdirSync(dir)
    .filter((name) => name.endsWith(".sqlite") && name !== "metadata.sqlite")
    .map((name) => join(dir, name))
    .filter((file) => {
      const db = new Database(file, { readonly: true });
      try {
        return db.prepare(`SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sessions'`).get() !== undefined;
      } finally {
        db.close();
      }
    });
  if (candidates.length !== 1)
    throw new Error(`expected one D1 file with a sessions table in ${dir}, found ${candidates.length}`);
  return candidates[0];
}

const DAY = 86_400_000;

/**
 * Values for the columns a seeded row may have; any other column of the table must
 * be nullable or have a default, or seeding stops and names it (the schema moved).
 */
function sessionValues(i, id, count, base) {
  const startedAt = base + i * 60_000;
  const lastActiveAt = startedAt + Math.max(0, count - 1) * 10_000;
  return {
    id,
    session_key: `generic:dm:seed-${i}`,
    platform: "generic",
    chat_type: "dm",
    started_at: startedAt,
    last_active_at: lastActiveAt,
    ended_at: lastActiveAt + DAY,
    end_reason: "idle",
    parent_session_id: null,
    message_count: count,
  };
}

function messageValues(i, sessionId, seq, startedAt) {
  const user = seq % 2 === 1;
  const text = user
    ? `seeded question ${seq} in conversation ${i}: how long until my order arrives?`
    : `echo: seeded question ${seq - 1} in conversation ${i}: how long until my order arrives?`;
  return {
    session_id: sessionId,
    seq,
    role: user ? "user" : "assistant",
    text,
    created_at: startedAt + (seq - 1) * 10_000,
    event_id: user ? `seed-${i}-${seq}` : null,
    run_id: null,
  };
}

function insertFor(db, table, sample) {
  const columns = db.prepare(`PRAGMA table_info(${table})`).all();
  const known = columns.filter((c) => c.name in sample).map((c) => c.name);
  const missing = columns.filter((c) => !(c.name in sample) && c.notnull && c.dflt_value === null && !c.pk);
  if (missing.length > 0) {
    throw new Error(`cannot seed ${table}: no value for NOT NULL column(s) ${missing.map((c) => c.name).join(", ")}`);
  }
  const sql = `INSERT INTO ${table} (${known.join(", ")}) VALUES (${known.map((c) => `@${c}`).join(", ")})`;
  const statement = db.prepare(sql);
  return (values) => statement.run(Object.fromEntries(known.map((c) => [c, values[c]])));
}

/**
 * Adds `sessions` ended sessions holding `messages` messages in all (user and
 * assistant in turn) to the D1 file, with keys no bench traffic uses.
 */
export function seedGrown(file, { sessions, messages, now = Date.now() }) {
  const started = Date.now();
  const db = new Database(file);
  try {
    db.pragma("synchronous = OFF");
    const base = now - 120 * DAY;
    const ids = Array.from({ length: sessions }, () => `ses_${randomBytes(16).toString("hex")}`).sort();
    const per = Math.floor(messages / Math.max(1, sessions));
    const extra = messages - per * sessions;
    const insertSession = insertFor(db, "sessions", sessionValues(0, "x", 1, base));
    const insertMessage = insertFor(db, "messages", messageValues(0, "x", 1, base));
    let written = 0;
    db.transaction(() => {
      ids.forEach((id, i) => {
        const count = per + (i < extra ? 1 : 0);
        const row = sessionValues(i, id, count, base);
        insertSession(row);
        for (let seq = 1; seq <= count; seq++) {
          insertMessage(messageValues(i, id, seq, row.started_at));
          written += 1;
        }
      });
    })();
    db.pragma("wal_checkpoint(TRUNCATE)");
    const totals = db
      .prepare(`SELECT (SELECT COUNT(*) FROM sessions) AS sessions, (SELECT COUNT(*) FROM messages) AS messages`)
      .get();
    return { sessions_added: sessions, messages_added: written, totals, ms: Date.now() - started };
  } finally {
    db.close();
  }
}

/** Sequence check of one session, straight from D1: seq 1..n with no gap or duplicate. */
export function checkSequence(file, sessionId) {
  const db = new Database(file, { readonly: true });
  try {
    const rows = db
      .prepare(`SELECT seq, role, text, created_at FROM messages WHERE session_id = ? ORDER BY seq`)
      .all(sessionId);
    const gaps = rows.filter((row, i) => row.seq !== i + 1).length;
    const users = rows.filter((row) => row.role === "user");
    return {
      messages: rows.length,
      user_messages: users.length,
      assistant_messages: rows.filter((row) => row.role === "assistant").length,
      seq_contiguous: gaps === 0,
      user_seq_first: users[0]?.seq ?? null,
      user_seq_last: users[users.length - 1]?.seq ?? null,
    };
  } finally {
    db.close();
  }
}

// `node bench/lib/seed.mjs <persist dir> <sessions> <messages>`: seed by hand.
if (import.meta.url === `file://${process.argv[1]}`) {
  const [dir, sessions = "100000", messages = "1000000"] = process.argv.slice(2);
  if (!dir) {
    console.error("usage: node bench/lib/seed.mjs <persist dir> [sessions] [messages]");
    process.exit(2);
  }
  console.log(seedGrown(findD1File(dir), { sessions: Number(sessions), messages: Number(messages) }));
}
