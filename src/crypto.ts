/** Signatures and tokens with Web Crypto; every comparison of a secret is constant-time. */
const encoder = new TextEncoder();

// Imported keys are kept per secret and use: importing one costs more than the HMAC itself.
const hmacKeys = new Map<string, Promise<CryptoKey>>();

function hmacKey(secret: string, usage: "sign" | "verify"): Promise<CryptoKey> {
  const cacheKey = `${usage}:${secret}`;
  let key = hmacKeys.get(cacheKey);
  if (!key) {
    if (hmacKeys.size >= 64) hmacKeys.clear(); // secrets are few; never let the cache grow
    key = crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, [usage]);
    hmacKeys.set(cacheKey, key);
  }
  return key;
}

const toBytes = (data: string | ArrayBuffer | Uint8Array) =>
  typeof data === "string" ? encoder.encode(data) : data instanceof Uint8Array ? data : new Uint8Array(data);

export function toHex(bytes: ArrayBuffer | Uint8Array): string {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Bytes of a hex string, or null when it is not hex of an even length. */
export function fromHex(hex: string): Uint8Array<ArrayBuffer> | null {
  if (hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) return null;
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(i * 2, i * 2 + 2), 16);
  return bytes;
}

export async function hmacSha256Hex(secret: string, data: string | ArrayBuffer | Uint8Array): Promise<string> {
  const signature = await crypto.subtle.sign("HMAC", await hmacKey(secret, "sign"), toBytes(data));
  return toHex(signature);
}

/** Checks a hex HMAC-SHA256 in constant time (`crypto.subtle.verify` compares for us). */
export async function verifyHmacSha256Hex(
  secret: string,
  data: string | ArrayBuffer | Uint8Array,
  hexSignature: string,
): Promise<boolean> {
  const signature = fromHex(hexSignature);
  if (!signature || signature.length !== 32) return false;
  return crypto.subtle.verify("HMAC", await hmacKey(secret, "verify"), signature, toBytes(data));
}

/** Constant-time equality of two strings (different lengths are unequal without a timing hint on content). */
export function safeEqual(a: string, b: string): boolean {
  const left = encoder.encode(a);
  const right = encoder.encode(b);
  if (left.length !== right.length) {
    // Compare against itself so the work done does not depend on where they differ.
    crypto.subtle.timingSafeEqual(left, left);
    return false;
  }
  return crypto.subtle.timingSafeEqual(left, right);
}

export async function sha256Hex(data: string): Promise<string> {
  return toHex(await crypto.subtle.digest("SHA-256", encoder.encode(data)));
}

/** A random bearer token (256 bits, base64url). */
export function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return btoa(String.fromCharCode(...bytes))
    .replaceAll("+", "-")
    .replaceAll("/", "_")
    .replace(/=+$/, "");
}
