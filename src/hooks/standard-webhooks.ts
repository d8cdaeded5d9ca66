/**
 * Standard Webhooks signatures (standardwebhooks.com), on lifecycle events and on
 * generic replies, so receivers verify them with that project's libraries:
 * `webhook-id`, `webhook-timestamp` (seconds) and
 * `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
 * The key is the secret's UTF-8 bytes, or, for a secret written `whsec_<base64>`,
 * the decoded bytes, as the library's `new Webhook(secret)` decodes it.
 */
const encoder = new TextEncoder();
const WHSEC = "whsec_";

// One imported key per secret: importing costs more than the HMAC itself.
const keys = new Map<string, Promise<CryptoKey>>();

/** The HMAC key bytes of a secret: base64-decoded after `whsec_`, else its UTF-8 bytes. */
export function standardWebhookKeyBytes(secret: string): Uint8Array<ArrayBuffer> {
  if (!secret.startsWith(WHSEC)) return new Uint8Array(encoder.encode(secret));
  const binary = atob(secret.slice(WHSEC.length));
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

function keyOf(secret: string): Promise<CryptoKey> {
  let key = keys.get(secret);
  if (!key) {
    if (keys.size >= 16) keys.clear(); // secrets are few; never let the cache grow
    key = crypto.subtle.importKey("raw", standardWebhookKeyBytes(secret), { name: "HMAC", hash: "SHA-256" }, false, [
      "sign",
    ]);
    keys.set(secret, key);
  }
  return key;
}

/** The three Standard Webhooks headers for one attempt at sending `body` (the exact bytes sent). */
export async function standardWebhookHeaders(
  secret: string,
  id: string,
  nowMs: number,
  body: string,
): Promise<Record<"webhook-id" | "webhook-timestamp" | "webhook-signature", string>> {
  const timestamp = String(Math.floor(nowMs / 1000));
  const mac = await crypto.subtle.sign("HMAC", await keyOf(secret), encoder.encode(`${id}.${timestamp}.${body}`));
  const signature = btoa(String.fromCharCode(...new Uint8Array(mac)));
  return { "webhook-id": id, "webhook-timestamp": timestamp, "webhook-signature": `v1,${signature}` };
}
