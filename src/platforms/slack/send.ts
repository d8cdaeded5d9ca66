/**
 * Outbound Slack messages: `POST {SLACK_API_BASE}/chat.postMessage` with the bot
 * token, `{channel, text, thread_ts?}`. Slack answers most failures with HTTP 200
 * and `{"ok": false, "error"}`, so the body decides, not only the status.
 */
import { callJson } from "../../http/outbound";
import { permanentFailure, settingsForSending } from "../settings";
import { withNotice, type OutboundMessage, type PlatformEnv, type SendOutcome } from "../types";
import type { SlackTarget } from "./events";
import { slackSettings } from "./settings";

/**
 * `ok: false` errors worth another attempt: `ratelimited` (Slack's own 429 in a
 * 200), and `service_unavailable` (Slack did nothing). Every other error, such as
 * `channel_not_found`, `not_in_channel`, `invalid_auth`, or `internal_error` and
 * `fatal_error` (which Slack says may have partly posted), is recorded as failed.
 */
export const SLACK_RETRYABLE_ERRORS = new Set(["ratelimited", "service_unavailable"]);

function targetOf(message: OutboundMessage): SlackTarget | null {
  const { channel, thread_ts } = message.target;
  if (typeof channel !== "string" || channel === "") return null;
  if (thread_ts !== undefined && typeof thread_ts !== "string") return null;
  return message.target as SlackTarget;
}

export async function sendSlack(message: OutboundMessage, env: PlatformEnv): Promise<SendOutcome> {
  const settings = settingsForSending("slack", slackSettings, env);
  if (!settings) return permanentFailure("slack is not configured or misconfigured");
  const target = targetOf(message);
  if (!target) return permanentFailure("reply target has no Slack channel");
  const body: Record<string, string> = { channel: target.channel, text: withNotice(message) };
  if (target.thread_ts) body.thread_ts = target.thread_ts;
  const result = await callJson(`${settings.apiBase}/chat.postMessage`, body, {
    headers: {
      authorization: `Bearer ${settings.botToken}`,
      // Without a charset Slack answers with a `missing_charset` warning.
      "content-type": "application/json; charset=utf-8",
    },
    timeoutMs: 10_000,
  });
  if (!result.ok) {
    const { retryable, retryAfterMs, status, error } = result;
    return { ok: false, retryable, retryAfterMs, status, error };
  }
  const answer = result.json as { ok?: unknown; error?: unknown } | null;
  if (answer?.ok === true)
    return { ok: true, retryable: false, retryAfterMs: null, status: result.status, error: null };
  const code = typeof answer?.error === "string" ? answer.error : "unexpected response (no ok: true)";
  return {
    ok: false,
    retryable: SLACK_RETRYABLE_ERRORS.has(code),
    retryAfterMs: result.retryAfterMs,
    status: result.status,
    error: `slack: ${code}`,
  };
}
