/**
 * Sending to WhatsApp: `POST {base}/{phone_number_id}/messages` (bearer access
 * token) with a text message, classified for the routing object's retries.
 */
import * as z from "zod";
import { callJson, type CallOutcome } from "../../http/outbound";
import { splitText } from "../text";
import { withNotice, type OutboundMessage, type SendOutcome } from "../types";
import type { WhatsAppTarget } from "./payload";

/** WhatsApp refuses a text body longer than this. */
export const WHATSAPP_TEXT_LIMIT = 4096;

/** Outside the 24-hour customer service window: only a template may be sent, so retrying cannot help. */
export const REENGAGEMENT_ERROR = 131047;
/**
 * Throttling: 4 (application request limit), 80007 (business account rate limit),
 * 130429 (throughput limit), 131056 (business/consumer pair rate limit). Retrying later succeeds.
 */
export const RATE_LIMIT_ERRORS: ReadonlySet<number> = new Set([4, 80007, 130429, 131056]);

// A Graph API error body: `{"error": {"message", "type", "code", "error_subcode"?, "error_data"?, "fbtrace_id"}}`.
const errorBody = z.looseObject({ error: z.looseObject({ code: z.number().int() }) });

/**
 * Classifies one Graph API answer. Permanent: error 131047 and every other 4xx.
 * Retryable: the rate-limit error codes (whatever the HTTP status), 429, 5xx,
 * timeouts and network errors, after `Retry-After` when given.
 */
export function classify(outcome: CallOutcome): SendOutcome {
  const { ok, retryAfterMs, status, error } = outcome;
  if (ok) return { ok, retryable: false, retryAfterMs, status, error };
  const parsed = errorBody.safeParse(outcome.json);
  const code = parsed.success ? parsed.data.error.code : null;
  let retryable = outcome.retryable;
  if (code === REENGAGEMENT_ERROR) retryable = false;
  else if (code !== null && RATE_LIMIT_ERRORS.has(code)) retryable = true;
  return { ok, retryable, retryAfterMs, status, error };
}

const targetSchema = z
  .object({
    to: z.string().min(1).nullish(),
    recipient: z.string().min(1).nullish(),
    phone_number_id: z.string().min(1).nullish(),
  })
  .refine((t) => t.to || t.recipient, { message: "a target needs to or recipient" });

/**
 * Sends one outbound message, the reset notice on its first line, from the number
 * the user wrote to. A text over 4,096 characters goes in parts, in order; when a
 * later part fails, the outcome is permanent, so that a retry never repeats the
 * parts the user already has.
 */
export async function sendWhatsApp(
  message: OutboundMessage,
  settings: { accessToken: string; phoneNumberId: string; apiBase: string },
): Promise<SendOutcome> {
  const target = targetSchema.safeParse(message.target as WhatsAppTarget);
  if (!target.success) {
    return { ok: false, retryable: false, retryAfterMs: null, status: null, error: "malformed whatsapp reply target" };
  }
  const from = target.data.phone_number_id ?? settings.phoneNumberId;
  // A user known only by their business-scoped id (no phone number) is addressed as `recipient`.
  const addressee = target.data.to ? { to: target.data.to } : { recipient: target.data.recipient! };
  const url = `${settings.apiBase}/${encodeURIComponent(from)}/messages`;
  const parts = splitText(withNotice(message), WHATSAPP_TEXT_LIMIT);
  let last: SendOutcome | null = null;
  for (const [index, body] of parts.entries()) {
    last = classify(
      await callJson(
        url,
        { messaging_product: "whatsapp", ...addressee, type: "text", text: { body } },
        { headers: { authorization: `Bearer ${settings.accessToken}` }, timeoutMs: 10_000 },
      ),
    );
    if (!last.ok) {
      if (index === 0) return last;
      return { ...last, retryable: false, error: `part ${index + 1} of ${parts.length} not sent: ${last.error}` };
    }
  }
  return last!;
}
