/**
 * Fetching an attachment's bytes from its platform at the moment the agent asks
 * (`GET /v1/attachments/{id}`), with the gateway's own credentials. Each platform's
 * `media.ts` turns a stored reference into the platform's byte response; nothing
 * here buffers a body, and no error text carries a URL with a credential in it.
 */
import type { Config } from "../config";
import type { AttachmentRow } from "../db/schema";
import { describe } from "../http/outbound";

export type MediaOutcome =
  /** The platform's 2xx answer; its body is streamed to the agent as it arrives. */
  | { ok: true; response: Response }
  /** 413 over ATTACHMENT_MAX_BYTES (known before download), 502 the platform refused or failed. */
  | { ok: false; status: 413 | 502; error: string };

/** How long a platform may take to answer with headers; the body then streams without a deadline. */
export const MEDIA_HEADERS_TIMEOUT_MS = 15_000;

export const refused = (error: string): MediaOutcome => ({ ok: false, status: 502, error });

export const tooLarge = (size: number, max: number): MediaOutcome => ({
  ok: false,
  status: 413,
  error: `the attachment is ${size} bytes, over ATTACHMENT_MAX_BYTES (${max})`,
});

/** Replaces each secret in `text`, so an error never repeats a token that was in a URL. */
export function redact(text: string, secrets: readonly string[]): string {
  return secrets.filter((s) => s !== "").reduce((out, secret) => out.replaceAll(secret, "[redacted]"), text);
}

/**
 * One GET whose headers must arrive within MEDIA_HEADERS_TIMEOUT_MS; the body is
 * left unread. Credentialed calls pass `redirect: "manual"`, so a token is never
 * carried to wherever a redirect points.
 */
export async function fetchHeaders(
  what: string,
  url: string,
  init: RequestInit,
  secrets: readonly string[],
): Promise<{ ok: true; response: Response } | { ok: false; outcome: MediaOutcome }> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error("timed out")), MEDIA_HEADERS_TIMEOUT_MS);
  let response: Response;
  try {
    response = await fetch(url, { method: "GET", ...init, signal: controller.signal });
  } catch (error) {
    return { ok: false, outcome: refused(`${what} failed: ${redact(describe(error), secrets)}`) };
  } finally {
    clearTimeout(timer);
  }
  if (response.status < 200 || response.status > 299) {
    await response.body?.cancel();
    return { ok: false, outcome: refused(`${what} answered HTTP ${response.status}`) };
  }
  return { ok: true, response };
}

/** A size the platform's metadata gives, checked before any byte is fetched. */
export function overLimit(size: unknown, max: number): MediaOutcome | null {
  return typeof size === "number" && size > max ? tooLarge(size, max) : null;
}

export type MediaOpener = (row: AttachmentRow, env: object, config: Config) => Promise<MediaOutcome>;
