/**
 * Outbound HTTP for the agent, hooks and platform APIs: one POST with a timeout,
 * classified so that callers decide between done, retry later and give up.
 */
import { log } from "../log";
export interface CallOutcome {
  /** 2xx. */
  ok: boolean;
  /** Worth another attempt: network error, timeout, 5xx or 429. */
  retryable: boolean;
  /** From `Retry-After` (seconds or a date) or a platform's own field, when given. */
  retryAfterMs: number | null;
  status: number | null;
  error: string | null;
  /** The response body, when it was JSON. */
  json: unknown;
}

export interface CallOptions {
  method?: string;
  headers?: Record<string, string>;
  timeoutMs: number;
}

export async function callJson(url: string, body: unknown, options: CallOptions): Promise<CallOutcome> {
  const payload = typeof body === "string" ? body : JSON.stringify(body);
  let response: Response;
  try {
    response = await fetch(url, {
      method: options.method ?? "POST",
      headers: { "content-type": "application/json", ...options.headers },
      body: payload,
      signal: AbortSignal.timeout(options.timeoutMs),
    });
  } catch (error) {
    // A runtime error may quote the URL, which can carry a credential (Telegram's
    // bot token, a hook's user:password): it never reaches a log or `last_error`.
    const error_ = scrubUrl(describe(error), url);
    return { ok: false, retryable: true, retryAfterMs: null, status: null, error: error_, json: null };
  }
  const raw = await response.text().catch((error: unknown) => {
    // The status still counts; only the body (error codes, retry hints) is lost.
    log.warn("could not read the response body", {
      url: redactUrl(url),
      status: response.status,
      error: scrubUrl(describe(error), url),
    });
    return "";
  });
  let json: unknown = null;
  try {
    json = raw === "" ? null : JSON.parse(raw);
  } catch {
    json = null;
  }
  const status = response.status;
  const ok = status >= 200 && status < 300;
  return {
    ok,
    retryable: !ok && (status >= 500 || status === 429 || status === 408),
    retryAfterMs: retryAfter(response.headers.get("retry-after")),
    status,
    error: ok ? null : `HTTP ${status}${raw ? `: ${raw.slice(0, 200)}` : ""}`,
    json,
  };
}

function retryAfter(header: string | null): number | null {
  if (!header) return null;
  const seconds = Number(header);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const date = Date.parse(header);
  return Number.isNaN(date) ? null : Math.max(0, date - Date.now());
}

/**
 * A URL as it may be shown (logs, `last_error`): scheme and host only, since its
 * user info, path or query may carry a credential (`/bot{token}/`, `?token=`).
 */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.protocol}//${parsed.host}`;
  } catch {
    return "(invalid URL)";
  }
}

/** `text` with every appearance of `url` (as written, or as parsed) replaced by its redacted form. */
export function scrubUrl(text: string, url: string): string {
  const shown = redactUrl(url);
  const forms = [url];
  try {
    const parsed = new URL(url);
    forms.push(parsed.href, `${parsed.host}${parsed.pathname}`, parsed.pathname + parsed.search);
    if (parsed.password) forms.push(parsed.password);
  } catch {
    // Not a URL: only its literal text is scrubbed.
  }
  let scrubbed = text;
  for (const form of forms.filter((f) => f.length > 1).sort((a, b) => b.length - a.length)) {
    scrubbed = scrubbed.split(form).join(shown);
  }
  return scrubbed;
}

export function describe(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`.slice(0, 500);
  return String(error).slice(0, 500);
}
