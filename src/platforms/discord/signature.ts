/**
 * Discord's interaction signing: `X-Signature-Ed25519` (hex, 64 bytes) over
 * `{X-Signature-Timestamp}{raw body}`, checked with the application's public key.
 * Discord sends invalid signatures on purpose and removes endpoints that accept
 * them; Web Crypto's `verify` throws on a signature or key of the wrong length,
 * so every malformed header is refused here before it reaches `verify`.
 * https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers
 */
import { log } from "../../log";
import { now } from "../../clock";
import { ConfigError } from "../../config";
import { fromHex } from "../../crypto";
import type { DiscordSettings } from "./settings";

/**
 * Interactions signed further than this from our clock are refused: a captured
 * request replayed after the dedupe marks are gone would otherwise start a turn.
 */
export const DISCORD_TIMESTAMP_TOLERANCE_MS = 5 * 60_000;

const SIGNATURE = /^[0-9a-fA-F]{128}$/;
const TIMESTAMP = /^\d{1,12}$/;
const encoder = new TextEncoder();

/** Imported keys by hex, so a warm isolate imports the public key once. */
const keys = new Map<string, Promise<CryptoKey>>();

function publicKey(settings: DiscordSettings): Promise<CryptoKey> {
  let key = keys.get(settings.publicKeyHex);
  if (!key) {
    key = crypto.subtle.importKey("raw", settings.publicKey, { name: "Ed25519" }, false, ["verify"]).catch((error) => {
      keys.delete(settings.publicKeyHex);
      throw new ConfigError("DISCORD_PUBLIC_KEY", `is not a usable Ed25519 public key (${String(error)})`);
    });
    keys.set(settings.publicKeyHex, key);
  }
  return key;
}

/** True when both headers are present and well formed, the timestamp is recent, and the signature verifies. */
export async function verifyDiscordRequest(
  settings: DiscordSettings,
  headers: Headers,
  rawBody: ArrayBuffer,
): Promise<boolean> {
  const signatureHex = headers.get("x-signature-ed25519")?.trim() ?? "";
  const timestamp = headers.get("x-signature-timestamp")?.trim() ?? "";
  if (!SIGNATURE.test(signatureHex) || !TIMESTAMP.test(timestamp)) return false;
  if (Math.abs(now() - Number(timestamp) * 1000) > DISCORD_TIMESTAMP_TOLERANCE_MS) return false;
  const signature = fromHex(signatureHex);
  if (!signature || signature.length !== 64) return false;
  const prefix = encoder.encode(timestamp);
  const signed = new Uint8Array(prefix.length + rawBody.byteLength);
  signed.set(prefix, 0);
  signed.set(new Uint8Array(rawBody), prefix.length);
  const key = await publicKey(settings);
  try {
    return await crypto.subtle.verify({ name: "Ed25519" }, key, signature, signed);
  } catch (error) {
    // Lengths are checked above; anything verify still refuses is a bad signature, never a 5xx.
    log.warn("discord: signature check threw", { error: String(error) });
    return false;
  }
}
