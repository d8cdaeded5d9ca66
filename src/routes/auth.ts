/**
 * Bearer tokens of the operator and agent APIs. Three kinds exist: ADMIN_TOKEN,
 * AGENT_TOKEN, and each run's own token. A token that is valid for another part of
 * the API than the one it is presented to is a 403 (a valid token without the
 * right); a token valid nowhere, or none, is a 401.
 */
import type { Context } from "hono";
import { configOf } from "../config";
import { safeEqual, sha256Hex } from "../crypto";
import { Database } from "../db/client";
import { selectRun } from "../db/runs";
import type { RunRow } from "../db/schema";
import { runIdOfToken } from "../domain/run-token";
import { apiError } from "../http/errors";

type AppContext = Context<{ Bindings: Env }>;

export function bearer(c: Context): string | null {
  const header = c.req.header("authorization");
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
  return match ? match[1]! : null;
}

/** The run a token belongs to, when it is that run's valid token. */
export async function runOfToken(env: Env, token: string): Promise<RunRow | null> {
  const runId = runIdOfToken(token);
  if (!runId) return null;
  const db = new Database(env.DB, "background");
  const [runs] = await db.batch(selectRun(db, runId));
  const run = runs[0];
  return run && safeEqual(await sha256Hex(token), run.tokenHash) ? run : null;
}

/** Refuses a token that is not `wanted`: 403 when it is valid elsewhere, 401 otherwise. */
async function refuse(c: AppContext, token: string, what: string): Promise<never> {
  const config = configOf(c.env);
  const staticTokens = [config.adminToken, config.agentToken].filter((t): t is string => t !== null);
  if (staticTokens.some((t) => safeEqual(token, t)) || (await runOfToken(c.env, token))) {
    throw apiError(403, "forbidden", `this token is not allowed here (${what})`);
  }
  throw apiError(401, "unauthorized", `invalid bearer token (${what})`);
}

/** Requires exactly `expected` (ADMIN_TOKEN or AGENT_TOKEN); when that variable is unset, says so. */
export async function requireToken(c: AppContext, expected: string | null, what: string): Promise<void> {
  // No token can be right while the variable is unset: say that, not "invalid token".
  if (!expected)
    throw apiError(401, "not_configured", `${what} is not set, so this API is off: set ${what} and restart`);
  const token = bearer(c);
  if (!token) throw apiError(401, "unauthorized", `missing bearer token (${what})`);
  if (expected && safeEqual(token, expected)) return;
  await refuse(c, token, what);
}

/** Requires a run's own token; returns that run. */
export async function requireRunToken(c: AppContext): Promise<RunRow> {
  const token = bearer(c);
  if (!token) throw apiError(401, "unauthorized", "missing bearer run token");
  const run = await runOfToken(c.env, token);
  if (run) return run;
  return refuse(c, token, "a run token");
}
