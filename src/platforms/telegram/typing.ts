/**
 * Telegram's typing indicator: `POST {base}/bot{token}/sendChatAction` with
 * `{chat_id, action: "typing", message_thread_id?}` (the forum topic the message
 * came from). The indicator lasts about 5 s, so the routing object repeats it.
 */
import * as z from "zod";
import { callJson } from "../../http/outbound";
import type { SendOutcome } from "../types";
import { classify } from "./send";

const targetSchema = z.object({ chat_id: z.number().int(), message_thread_id: z.number().int().nullish() });

export async function sendTelegramTyping(
  target: unknown,
  settings: { token: string; apiBase: string },
): Promise<SendOutcome> {
  const parsed = targetSchema.safeParse(target);
  if (!parsed.success) {
    return { ok: false, retryable: false, retryAfterMs: null, status: null, error: "malformed telegram reply target" };
  }
  const { chat_id, message_thread_id } = parsed.data;
  const body: Record<string, unknown> = { chat_id, action: "typing" };
  if (message_thread_id !== null && message_thread_id !== undefined) body.message_thread_id = message_thread_id;
  // Short: a late indicator is worse than none.
  return classify(
    await callJson(`${settings.apiBase}/bot${settings.token}/sendChatAction`, body, { timeoutMs: 5_000 }),
  );
}
