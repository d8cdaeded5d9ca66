/**
 * Outbound Discord messages, through the interaction's webhook (no bot token):
 * a reply edits the deferred response, `PATCH {base}/webhooks/{app}/{token}/messages/@original`,
 * and what does not fit in 2,000 characters follows as followups,
 * `POST {base}/webhooks/{app}/{token}`. Progress is always a followup, so it never
 * overwrites the reply. The token lasts 15 minutes; after that nothing is sent.
 */
import type { RESTPatchAPIInteractionOriginalResponseJSONBody } from "discord-api-types/v10";
import { now } from "../../clock";
import { callJson, type CallOutcome } from "../../http/outbound";
import { permanentFailure, settingsForSending } from "../settings";
import { splitText } from "../text";
import { withNotice, type OutboundMessage, type PlatformEnv, type SendOutcome } from "../types";
import type { DiscordTarget } from "./interactions";
import { discordSettings } from "./settings";

/** Discord's limit on a message's `content`. */
export const DISCORD_CONTENT_LIMIT = 2000;
/** How long an interaction token can be used after the interaction. */
export const INTERACTION_TOKEN_TTL_MS = 15 * 60_000;

export function targetOf(target: Record<string, unknown>): DiscordTarget | null {
  const { application_id, token, interaction_at } = target;
  if (typeof application_id !== "string" || application_id === "") return null;
  if (typeof token !== "string" || token === "") return null;
  if (typeof interaction_at !== "number" || !Number.isFinite(interaction_at)) return null;
  return target as DiscordTarget;
}

/** A reply in parts of at most 2,000 characters (see `splitText`). */
export function splitContent(text: string, limit = DISCORD_CONTENT_LIMIT): string[] {
  return splitText(text, limit);
}

/** Discord's answer, classified: 429 (with its `retry_after` seconds) and 5xx retry; 401/404 mean the token is gone. */
export function classify(result: CallOutcome): SendOutcome {
  const { ok, retryable, status, error } = result;
  if (ok) return { ok: true, retryable: false, retryAfterMs: null, status, error: null };
  if (status === 429) {
    const body = result.json as { retry_after?: unknown } | null;
    const seconds = typeof body?.retry_after === "number" && body.retry_after >= 0 ? body.retry_after : null;
    return {
      ok: false,
      retryable: true,
      retryAfterMs: seconds !== null ? Math.ceil(seconds * 1000) : result.retryAfterMs,
      status,
      error,
    };
  }
  if (status === 401 || status === 404) {
    return permanentFailure(`discord: interaction token expired or unknown (${error ?? `HTTP ${status}`})`, status);
  }
  return { ok: false, retryable, retryAfterMs: result.retryAfterMs, status, error };
}

export async function sendDiscord(message: OutboundMessage, env: PlatformEnv): Promise<SendOutcome> {
  const settings = settingsForSending("discord", discordSettings, env);
  if (!settings) return permanentFailure("discord is not configured or misconfigured");
  const target = targetOf(message.target);
  if (!target) return permanentFailure("reply target has no Discord interaction token");
  // Past 15 minutes Discord refuses the token; calling anyway would only earn a 401.
  if (now() - target.interaction_at >= INTERACTION_TOKEN_TTL_MS) {
    return permanentFailure("discord: interaction token expired (15 minutes after the interaction)");
  }
  const webhook = `${settings.apiBase}/webhooks/${encodeURIComponent(target.application_id)}/${encodeURIComponent(target.token)}`;
  const chunks = splitContent(withNotice(message));
  let last: SendOutcome | null = null;
  let followupsSent = 0;
  for (const [index, content] of chunks.entries()) {
    // Mentions in agent text (an echoed "@everyone") must not ping anyone.
    const body: RESTPatchAPIInteractionOriginalResponseJSONBody = { content, allowed_mentions: { parse: [] } };
    const edit = index === 0 && message.kind !== "progress";
    const result = await callJson(edit ? `${webhook}/messages/@original` : webhook, body, {
      method: edit ? "PATCH" : "POST",
      timeoutMs: 10_000,
    });
    last = classify(result);
    if (!last.ok) {
      if (chunks.length === 1) return last;
      // Editing @original again is harmless, but a followup already sent would be
      // posted twice by a retry: once one is out, a failure is final.
      const retryable = last.retryable && followupsSent === 0;
      const note = last.retryable && !retryable ? " (not retried: earlier followups were sent)" : "";
      return {
        ...last,
        retryable,
        retryAfterMs: retryable ? last.retryAfterMs : null,
        error: `part ${index + 1} of ${chunks.length}: ${last.error}${note}`,
      };
    }
    if (!edit) followupsSent += 1;
  }
  return last!;
}
