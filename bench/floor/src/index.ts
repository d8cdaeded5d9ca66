/**
 * The floor: the least any gateway must do per message, to compare sessiongate
 * against (`npm run bench`). Per message it checks the same `X-Signature-256`
 * HMAC as `POST /webhooks/generic`, calls one Durable Object by key, which runs
 * one D1 batch that reads the key's session row and stores the message (creating
 * the row when there is none), and answers. After the answer, the echo reply is
 * stored as a second message. No dedupe, no reset policy, no runs, no events, no
 * durability of the reply: those are what the gateway adds.
 *
 * `GET /admin/metrics` uses the gateway's counter names, summed from D1's own
 * result meta, so the two can be compared figure by figure.
 */
import { DurableObject } from "cloudflare:workers";

interface Env {
  DB: D1Database;
  FLOOR: DurableObjectNamespace<FloorRouter>;
  GENERIC_WEBHOOK_SECRET?: string;
  ADMIN_TOKEN?: string;
}

type Path = "ingress" | "background";

/** Counters since the isolate started (in wrangler dev the worker and every object share it). */
const metrics = {
  messages_routed: 0,
  d1_batches: 0,
  d1_queries: 0,
  d1_rows_read: 0,
  d1_rows_written: 0,
  d1_batches_ingress: 0,
  d1_queries_ingress: 0,
  d1_rows_read_ingress: 0,
  d1_rows_written_ingress: 0,
};

async function batch(db: D1Database, path: Path, statements: D1PreparedStatement[]): Promise<D1Result[]> {
  const results = await db.batch(statements);
  let read = 0;
  let written = 0;
  for (const { meta } of results) {
    read += meta.rows_read ?? 0;
    written += meta.rows_written ?? 0;
  }
  metrics.d1_batches += 1;
  metrics.d1_queries += results.length;
  metrics.d1_rows_read += read;
  metrics.d1_rows_written += written;
  if (path === "ingress") {
    metrics.d1_batches_ingress += 1;
    metrics.d1_queries_ingress += results.length;
    metrics.d1_rows_read_ingress += read;
    metrics.d1_rows_written_ingress += written;
  }
  return results;
}

// ------------------------------------------------------------------ the routing object

/** The newest live session of a key: read through the (session_key, started_at) index. */
const NEWEST_LIVE = `session_key = ?2 AND end_reason IS NULL ORDER BY started_at DESC LIMIT 1`;

export class FloorRouter extends DurableObject<Env> {
  /** The key's live session as last seen; D1 is checked on every message all the same. */
  private sessionId: string | null = null;

  async route(key: string, text: string): Promise<{ sessionId: string }> {
    const db = this.env.DB;
    const now = Date.now();
    let stored: string | null = null;
    if (this.sessionId !== null) {
      // Known session: bump the row only while it is live, and store the message only if it was.
      const id = this.sessionId;
      const [, inserted] = await batch(db, "ingress", [
        db
          .prepare(
            `UPDATE sessions SET message_count = message_count + 1, last_active_at = MAX(last_active_at, ?1)
              WHERE id = ?2 AND end_reason IS NULL`,
          )
          .bind(now, id),
        db
          .prepare(
            `INSERT INTO messages (session_id, seq, role, text, created_at)
              SELECT id, message_count, 'user', ?1, ?2 FROM sessions WHERE id = ?3 AND changes() = 1`,
          )
          .bind(text, now, id),
      ]);
      if (inserted!.meta.changes === 1) stored = id;
    }
    if (stored === null) {
      // Unknown (or ended) session: create a row unless the key has a live one, then append to the newest live row.
      const fresh = `ses_${crypto.randomUUID().replaceAll("-", "")}`;
      const [, bumped] = await batch(db, "ingress", [
        db
          .prepare(
            `INSERT INTO sessions (id, session_key, started_at, last_active_at, message_count)
              SELECT ?1, ?2, ?3, ?3, 0 WHERE NOT EXISTS (SELECT 1 FROM sessions WHERE session_key = ?2 AND end_reason IS NULL)`,
          )
          .bind(fresh, key, now),
        db
          .prepare(
            `UPDATE sessions SET message_count = message_count + 1, last_active_at = MAX(last_active_at, ?1)
              WHERE id = (SELECT id FROM sessions WHERE ${NEWEST_LIVE}) RETURNING id`,
          )
          .bind(now, key),
        db
          .prepare(
            `INSERT INTO messages (session_id, seq, role, text, created_at)
              SELECT id, message_count, 'user', ?3, ?1 FROM sessions WHERE ${NEWEST_LIVE}`,
          )
          .bind(now, key, text),
      ]);
      const row = bumped!.results[0] as { id: string } | undefined;
      if (!row) throw new Error(`no live session for ${key}`);
      stored = row.id;
      this.sessionId = stored;
    }
    metrics.messages_routed += 1;
    this.ctx.waitUntil(this.reply(stored, `echo: ${text}`));
    return { sessionId: stored };
  }

  /** After the acknowledgement: the echo reply, stored as the session's next message. */
  private async reply(sessionId: string, text: string): Promise<void> {
    const db = this.env.DB;
    const now = Date.now();
    try {
      await batch(db, "background", [
        db
          .prepare(
            `UPDATE sessions SET message_count = message_count + 1, last_active_at = MAX(last_active_at, ?1)
              WHERE id = ?2 AND end_reason IS NULL`,
          )
          .bind(now, sessionId),
        db
          .prepare(
            `INSERT INTO messages (session_id, seq, role, text, created_at)
              SELECT id, message_count, 'assistant', ?1, ?2 FROM sessions WHERE id = ?3 AND changes() = 1`,
          )
          .bind(text, now, sessionId),
      ]);
    } catch (error) {
      console.error("floor: reply not stored", sessionId, String(error));
    }
  }
}

// ------------------------------------------------------------------ the worker

const encoder = new TextEncoder();
const SIGNATURE = /^sha256=([0-9a-fA-F]{64})$/;
const CHAT_TYPES = new Set(["dm", "group", "channel"]);
const MAX_BODY_BYTES = 128 * 1024;

let cachedKey: { secret: string; key: Promise<CryptoKey> } | null = null;

function hmacKey(secret: string): Promise<CryptoKey> {
  if (cachedKey?.secret !== secret) {
    const key = crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, [
      "verify",
    ]);
    cachedKey = { secret, key };
  }
  return cachedKey.key;
}

function fromHex(hex: string): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(i * 2, i * 2 + 2), 16);
  return bytes;
}

function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

const error = (status: number, code: string, message: string) => json({ error: { code, message } }, status);

const isId = (value: unknown): value is string | number =>
  (typeof value === "string" && value.length > 0 && value.length <= 512) ||
  (typeof value === "number" && Number.isInteger(value));

const keyPart = (id: string | number) => String(id).replaceAll("%", "%25").replaceAll(":", "%3A");

async function webhook(request: Request, env: Env): Promise<Response> {
  const secret = env.GENERIC_WEBHOOK_SECRET;
  if (!secret) return error(404, "not_configured", "GENERIC_WEBHOOK_SECRET is not set");
  const raw = await request.arrayBuffer();
  if (raw.byteLength > MAX_BODY_BYTES) return error(413, "payload_too_large", "body too large");
  const match = SIGNATURE.exec(request.headers.get("x-signature-256")?.trim() ?? "");
  if (!match || !(await crypto.subtle.verify("HMAC", await hmacKey(secret), fromHex(match[1]!), raw))) {
    return error(401, "bad_signature", "missing or invalid X-Signature-256");
  }
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(new TextDecoder().decode(raw)) as Record<string, unknown>;
  } catch {
    return error(400, "invalid_json", "body is not JSON");
  }
  const { event_id, chat_id, chat_type, user_id, text } = body ?? {};
  if (
    !isId(event_id) ||
    !isId(chat_id) ||
    !isId(user_id) ||
    typeof chat_type !== "string" ||
    !CHAT_TYPES.has(chat_type) ||
    typeof text !== "string" ||
    text.length < 1 ||
    text.length > 32_768
  ) {
    return error(400, "invalid_body", "event_id, chat_id, chat_type, user_id and text are required");
  }
  const key = `generic:${chat_type}:${keyPart(chat_id)}`;
  try {
    const { sessionId } = await env.FLOOR.getByName(key).route(key, text);
    return json({ accepted: true, session_id: sessionId, duplicate: false });
  } catch (cause) {
    console.error("floor: not stored", key, String(cause));
    return error(503, "unavailable", "not stored, retry later");
  }
}

async function admin(request: Request, env: Env, url: URL): Promise<Response> {
  const auth = request.headers.get("authorization") ?? "";
  if (!env.ADMIN_TOKEN || auth !== `Bearer ${env.ADMIN_TOKEN}`) return error(401, "unauthorized", "bad token");
  const path = url.pathname.slice("/admin".length);
  if (path === "/metrics") return json(metrics);
  const db = env.DB;
  if (path === "/sessions") {
    const key = url.searchParams.get("key");
    const statement = key
      ? db.prepare(`SELECT * FROM sessions WHERE session_key = ? ORDER BY started_at DESC LIMIT 100`).bind(key)
      : db.prepare(`SELECT * FROM sessions ORDER BY started_at DESC LIMIT 100`);
    const [rows] = await batch(db, "background", [statement]);
    return json({ sessions: rows!.results });
  }
  const one = /^\/sessions\/([^/]+)$/.exec(path);
  if (one) {
    const id = decodeURIComponent(one[1]!);
    const [rows, messages] = await batch(db, "background", [
      db.prepare(`SELECT * FROM sessions WHERE id = ?`).bind(id),
      db.prepare(`SELECT seq, role, text, created_at FROM messages WHERE session_id = ? ORDER BY seq`).bind(id),
    ]);
    const session = rows!.results[0];
    if (!session) return error(404, "not_found", `no session ${id}`);
    const list = (messages!.results as { seq: number; role: string; text: string; created_at: number }[]).map((m) => ({
      role: m.role,
      text: m.text,
      at: m.created_at,
      seq: m.seq,
    }));
    return json({ session, messages: list });
  }
  return error(404, "not_found", `no route for ${request.method} ${url.pathname}`);
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (request.method === "POST" && url.pathname === "/webhooks/generic") return webhook(request, env);
    if (request.method === "GET" && url.pathname.startsWith("/admin/")) return admin(request, env, url);
    if (request.method === "GET" && url.pathname === "/healthz") {
      await env.DB.prepare("SELECT 1").first();
      return json({ ok: true });
    }
    return error(404, "not_found", `no route for ${request.method} ${url.pathname}`);
  },
} satisfies ExportedHandler<Env>;
