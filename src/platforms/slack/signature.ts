/**
 * Slack's v0 request signing: `X-Slack-Signature: v0=<hex HMAC-SHA256>` of
 * `v0:{X-Slack-Request-Timestamp}:{raw body}` with the app's signing secret.
 * https://api.slack.com/authentication/verifying-requests-from-slack
 */
import { now } from "../../clock";
import { verifyHmacSha256Hex } from "../../crypto";

/** Requests signed further than this from our clock are refused (replays of a captured request). */
export const SLACK_TIMESTAMP_TOLERANCE_MS = 5 * 60_000;

const SIGNATURE = /^v0=([0-9a-fA-F]{64})$/;
const TIMESTAMP = /^\d{1,12}$/;

const encoder = new TextEncoder();

/**
 * True when both headers are present and well formed, the timestamp is within
 * five minutes of `now()`, and the signature matches the raw bytes received.
 */
export async function verifySlackRequest(secret: string, headers: Headers, rawBody: ArrayBuffer): Promise<boolean> {
  const timestamp = headers.get("x-slack-request-timestamp")?.trim() ?? "";
  const match = SIGNATURE.exec(headers.get("x-slack-signature")?.trim() ?? "");
  if (!match || !TIMESTAMP.test(timestamp)) return false;
  if (Math.abs(now() - Number(timestamp) * 1000) > SLACK_TIMESTAMP_TOLERANCE_MS) return false;
  const prefix = encoder.encode(`v0:${timestamp}:`);
  const signed = new Uint8Array(prefix.length + rawBody.byteLength);
  signed.set(prefix, 0);
  signed.set(new Uint8Array(rawBody), prefix.length);
  return verifyHmacSha256Hex(secret, signed, match[1]!);
}
