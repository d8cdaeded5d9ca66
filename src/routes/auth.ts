/** Bearer-token checks for the operator and agent APIs. */
import type { Context } from "hono";
import { safeEqual } from "../crypto";
import { apiError } from "../http/errors";

export function bearer(c: Context): string | null {
  const header = c.req.header("authorization");
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
  return match ? match[1]! : null;
}

/**
 * Accepts exactly `expected`; a token that is valid elsewhere in the gateway (in
 * `otherValid`) but not here is a 403, anything else a 401.
 */
export function requireToken(c: Context, expected: string | null, otherValid: (string | null)[], what: string): void {
  const token = bearer(c);
  if (!token) throw apiError(401, "unauthorized", `missing bearer token (${what})`);
  if (expected && safeEqual(token, expected)) return;
  if (otherValid.some((other) => other && safeEqual(token, other))) {
    throw apiError(403, "forbidden", `this token is not allowed here (${what})`);
  }
  throw apiError(401, "unauthorized", `invalid bearer token (${what})`);
}
