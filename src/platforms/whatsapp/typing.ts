/**
 * WhatsApp's typing indicator: mark the user's message read with
 * `typing_indicator` (`POST {base}/{phone_number_id}/messages`
 * `{"messaging_product":"whatsapp","status":"read","message_id","typing_indicator":{"type":"text"}}`).
 * WhatsApp shows it until the reply or for 25 s, so it is sent once, at dispatch.
 */
import * as z from "zod";
import { callJson } from "../../http/outbound";
import type { SendOutcome } from "../types";
import { classify } from "./send";

const targetSchema = z.object({ phone_number_id: z.string().min(1).nullish() });

/** `messageId`: the inbound message's id (`wamid.…`, the gateway's event id for it). */
export async function sendWhatsAppTyping(
  target: unknown,
  messageId: string,
  settings: { accessToken: string; phoneNumberId: string; apiBase: string },
): Promise<SendOutcome> {
  const parsed = targetSchema.safeParse(target);
  if (!parsed.success || messageId === "") {
    return { ok: false, retryable: false, retryAfterMs: null, status: null, error: "malformed whatsapp reply target" };
  }
  const from = parsed.data.phone_number_id ?? settings.phoneNumberId;
  return classify(
    await callJson(
      `${settings.apiBase}/${encodeURIComponent(from)}/messages`,
      { messaging_product: "whatsapp", status: "read", message_id: messageId, typing_indicator: { type: "text" } },
      { headers: { authorization: `Bearer ${settings.accessToken}` }, timeoutMs: 5_000 },
    ),
  );
}
