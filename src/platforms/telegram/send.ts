/**
 * Sending to Telegram: `POST {base}/bot{token}/sendMessage` with
 * `{chat_id, text, message_thread_id?}`, classified for the routing object's retries.
 */
import * as z from "zod";
import { callJson, type CallOutcome } from "../../http/outbound";
import { withNotice, type OutboundMessage, type SendOutcome } from "../types";
import { splitText } from "../text";
import type { TelegramTarget } from "./update";

/** Telegram refuses a message text longer than this (characters after entity parsing). */
export const TELEGRAM_TEXT_LIMIT = 4096;

// A Bot API error body: `{"ok": false, "error_code", "description", "parameters": {"retry_after"}}`.
const errorBody = z.looseObject({
  parameters: z.looseObject({ retry_after: z.number().nonnegative().optional() }).optional(),
});

/**
 * Classifies one Bot API answer. Retryable: network errors, timeouts, 5xx and 429
 * (after `parameters.retry_after` seconds, else `Retry-After`). Permanent: every
 * other 4xx (400 chat not found or text refused, 403 bot blocked or kicked, 401 bad token).
 */
export function classify(outcome: CallOutcome): SendOutcome {
  const { ok, retryable, status, error } = outcome;
  const parsed = errorBody.safeParse(outcome.json);
  const retryAfter = parsed.success ? parsed.data.parameters?.retry_after : undefined;
  return {
    ok,
    retryable,
    retryAfterMs: retryAfter !== undefined ? retryAfter * 1000 : outcome.retryAfterMs,
    status,
    error,
  };
}

/** What the target must hold; a malformed one is a permanent failure, not a crash of the alarm. */
const targetSchema = z.object({ chat_id: z.number().int(), message_thread_id: z.number().int().nullish() });

/**
 * Sends one outbound message, the reset notice on its first line. A text over
 * 4,096 characters goes in parts, in order; when a later part fails, the outcome
 * is permanent, so that a retry never repeats the parts the chat already shows.
 */
export async function sendTelegram(
  message: OutboundMessage,
  settings: { token: string; apiBase: string },
): Promise<SendOutcome> {
  const target = targetSchema.safeParse(message.target as TelegramTarget);
  if (!target.success) {
    return { ok: false, retryable: false, retryAfterMs: null, status: null, error: "malformed telegram reply target" };
  }
  const { chat_id, message_thread_id } = target.data;
  const url = `${settings.apiBase}/bot${settings.token}/sendMessage`;
  const parts = splitText(withNotice(message), TELEGRAM_TEXT_LIMIT);
  let last: SendOutcome | null = null;
  for (const [index, text] of parts.entries()) {
    const body: Record<string, unknown> = { chat_id, text };
    if (message_thread_id !== null && message_thread_id !== undefined) body.message_thread_id = message_thread_id;
    last = classify(await callJson(url, body, { timeoutMs: 10_000 }));
    if (!last.ok) {
      if (index === 0) return last;
      return { ...last, retryable: false, error: `part ${index + 1} of ${parts.length} not sent: ${last.error}` };
    }
  }
  return last!;
}
