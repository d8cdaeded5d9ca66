/**
 * The admin page's session: a cookie signed with HMAC-SHA256 under a key derived
 * from ADMIN_TOKEN (so rotating the token signs every operator out), carrying its
 * expiry and a random nonce. The CSRF token of a session is an HMAC of its nonce:
 * a form can only carry it if it was rendered for that session.
 */
import { hmacSha256Hex, randomToken, safeEqual } from "../../crypto";

export const SESSION_COOKIE = "sessiongate_admin";
/** The sign-in form's own double-submit cookie, so that even the sign-in POST carries a CSRF token. */
export const SIGN_IN_COOKIE = "sessiongate_sign_in";
/** How long a sign-in lasts. */
export const SESSION_TTL_MS = 8 * 60 * 60_000;
/** How long a sign-in form stays usable. */
export const SIGN_IN_TTL_MS = 30 * 60_000;

export interface PageSession {
  nonce: string;
  expiresAt: number;
  csrf: string;
}

const keyOf = (adminToken: string) => hmacSha256Hex(adminToken, "sessiongate admin page session v1");

/** A fresh session's cookie value and its CSRF token. */
export async function issueSession(adminToken: string, now: number): Promise<{ cookie: string; session: PageSession }> {
  const key = await keyOf(adminToken);
  const nonce = randomToken();
  const expiresAt = now + SESSION_TTL_MS;
  const payload = `v1.${expiresAt}.${nonce}`;
  const cookie = `${payload}.${await hmacSha256Hex(key, payload)}`;
  return { cookie, session: { nonce, expiresAt, csrf: await hmacSha256Hex(key, `csrf.${nonce}`) } };
}

/** The session a cookie value stands for: null when it is missing, forged, from another token or expired. */
export async function readSession(
  adminToken: string | null,
  cookie: string | undefined,
  now: number,
): Promise<PageSession | null> {
  if (!adminToken || !cookie) return null;
  const match = /^(v1\.(\d{1,16})\.([A-Za-z0-9_-]{1,128}))\.([0-9a-f]{64})$/.exec(cookie);
  if (!match) return null;
  const [, payload, expires, nonce, signature] = match as unknown as [string, string, string, string, string];
  const key = await keyOf(adminToken);
  if (!safeEqual(signature, await hmacSha256Hex(key, payload))) return null;
  const expiresAt = Number(expires);
  if (!(expiresAt > now)) return null;
  return { nonce, expiresAt, csrf: await hmacSha256Hex(key, `csrf.${nonce}`) };
}

/** A nonce for the sign-in form (its cookie and its hidden field carry the same value). */
export function signInNonce(): string {
  return randomToken();
}
