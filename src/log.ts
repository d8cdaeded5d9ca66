/**
 * The one logger (spec "Configuration": logs are one JSON object per line).
 * Every line is `{"level", "msg", "request_id"?, "session_key"?, ...fields}`,
 * written with the console method of its level so Workers Logs files it right.
 *
 * What must never reach a log line, whoever the caller: a secret or token, the
 * text of a message, or a URL that carries a credential. So, before writing:
 * - fields named like a secret or a message body are dropped (`[redacted]`);
 * - every configured secret value (registered from the environment) is masked
 *   wherever it appears in a string;
 * - every URL with a userinfo part, a credential-looking query parameter, or a
 *   bot token in its path is cut down to its origin.
 */
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface LogFields {
  request_id?: string | null;
  session_key?: string | null;
  [field: string]: unknown;
}

/** Field names whose values are never written: secrets, tokens, message text and bodies. */
const FORBIDDEN_FIELD = /secret|token|password|authorization|cookie|^text$|^body$|^payload$|^reply$|signature/i;
const URL_IN_TEXT = /\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>`]+/gi;
const CREDENTIAL_PARAM = /token|key|secret|sig|password|auth|code|credential|session/i;
// Telegram puts its bot token in the path (`/bot123456:ABC.../sendMessage`), and bare
// tokens of that shape can appear in error text too.
const BOT_TOKEN = /\b(?:bot)?\d{5,}:[A-Za-z0-9_-]{20,}/g;
const REDACTED = "[redacted]";

/** Secret values configured for this isolate, longest first so a longer one is masked whole. */
let secrets: string[] = [];

/**
 * Remembers the values of every variable named like a secret or token (HOOK_SECRET,
 * ADMIN_TOKEN, TELEGRAM_BOT_TOKEN, WHATSAPP_APP_SECRET, ...) so that no log line ever
 * carries one, even inside an error message.
 */
export function registerSecrets(env: Record<string, unknown>): void {
  const found = new Set(secrets);
  for (const [name, value] of Object.entries(env)) {
    if (typeof value !== "string" || value.trim().length < 4) continue;
    if (/SECRET|TOKEN|PASSWORD|PRIVATE|_KEY$/i.test(name)) found.add(value.trim());
  }
  secrets = [...found].sort((a, b) => b.length - a.length).slice(0, 64);
}

function scrubUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return raw;
  }
  const credential =
    url.username !== "" ||
    url.password !== "" ||
    /\/bot[^/]+/.test(url.pathname) ||
    [...url.searchParams.keys()].some((name) => CREDENTIAL_PARAM.test(name));
  return credential ? `${url.protocol}//${url.host}/${REDACTED}` : raw;
}

/** A string as it may be logged: no credential-carrying URL, no bot token, no configured secret. */
export function scrub(value: string): string {
  let out = value.replace(URL_IN_TEXT, scrubUrl).replace(BOT_TOKEN, REDACTED);
  for (const secret of secrets) if (out.includes(secret)) out = out.split(secret).join(REDACTED);
  return out;
}

function clean(value: unknown, depth: number): unknown {
  if (typeof value === "string") return scrub(value);
  if (value === null || typeof value !== "object") return value;
  if (depth > 4) return "[nested]";
  if (value instanceof Error) return scrub(`${value.name}: ${value.message}`.slice(0, 500));
  if (Array.isArray(value)) return value.slice(0, 20).map((v) => clean(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [name, field] of Object.entries(value)) {
    out[name] = FORBIDDEN_FIELD.test(name) ? REDACTED : clean(field, depth + 1);
  }
  return out;
}

/**
 * An outbound call's error as it may be logged: `HTTP 500` without the body the
 * other side answered (it may echo the message text), or the network error.
 */
export function errorSummary(error: string | null | undefined): string | null {
  if (!error) return null;
  return /^HTTP \d{3}/.test(error) ? error.slice(0, 8) : error.slice(0, 300);
}

/** The JSON line for one entry (exported for tests). */
export function formatLine(level: LogLevel, msg: string, fields: LogFields = {}): string {
  const line = { level, msg: scrub(msg), ...(clean(fields, 0) as Record<string, unknown>) };
  return JSON.stringify(line);
}

function write(level: LogLevel, msg: string, fields?: LogFields): void {
  const line = formatLine(level, msg, fields);
  if (level === "error") console.error(line);
  else if (level === "warn") console.warn(line);
  else if (level === "debug") console.debug(line);
  else console.log(line);
}

export const log = {
  debug: (msg: string, fields?: LogFields) => write("debug", msg, fields),
  info: (msg: string, fields?: LogFields) => write("info", msg, fields),
  warn: (msg: string, fields?: LogFields) => write("warn", msg, fields),
  error: (msg: string, fields?: LogFields) => write("error", msg, fields),
};

const requestIds = new WeakMap<Request, string>();

/** The id of an incoming request: Cloudflare's `cf-ray` when there is one, else a fresh one, the same for its whole handling. */
export function requestIdOf(request: Request): string {
  let id = requestIds.get(request);
  if (!id) {
    id = request.headers.get("cf-ray") ?? `req_${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
    requestIds.set(request, id);
  }
  return id;
}
