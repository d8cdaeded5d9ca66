/**
 * `/v1/*`: the agent API (spec "Agent backend"). Run endpoints are authorised by
 * the run's own token; scheduled jobs by AGENT_TOKEN. Ownership is decided by the
 * routing object of the run's key, except the heartbeat, which only reads.
 */
import { Hono, type Context } from "hono";
import * as z from "zod";
import { now } from "../clock";
import { configOf } from "../config";
import { Database } from "../db/client";
import { selectRun, selectSessionOfRun, touchHeartbeat } from "../db/runs";
import type { RunRow, SessionRow } from "../db/schema";
import { selectSession } from "../db/sessions";
import { END_REASONS } from "../domain/end-reasons";
import { ownership, type Ownership } from "../domain/ownership";
import { expiryReason, resolvePolicy } from "../domain/reset-policy";
import { cronSessionKey } from "../domain/session-key";
import { leaseUntil } from "../domain/turn-hold";
import { apiError } from "../http/errors";
import { newId } from "../ids";
import { routerFor } from "../routing/client";
import { requireRunToken, requireToken } from "./auth";
import { parseJsonBody } from "./body";
import { sessionJson } from "./json";

export const agentApi = new Hono<{ Bindings: Env }>();

// An invalid configuration answers 500 naming the key on every route, before any
// token is looked at (the routing object would otherwise report it as a 503).
agentApi.use("*", async (c, next) => {
  configOf(c.env);
  await next();
});

const db = (env: Env) => new Database(env.DB, "background");

/**
 * The run named in the path, authorised by its own token. The token is checked
 * first (401, or 403 for a valid token of another kind), then the id (404), then
 * that the token is this run's (403), as on the session routes.
 */
async function authorisedRun(c: Context<{ Bindings: Env }>): Promise<{ run: RunRow; session: SessionRow }> {
  const runId = c.req.param("id")!;
  const holder = await requireRunToken(c);
  const database = db(c.env);
  const [runs, sessions] = await database.batch(selectRun(database, runId), selectSessionOfRun(runId));
  const run = runs[0];
  const session = sessions[0];
  if (!run || !session) throw apiError(404, "not_found", `no run ${runId}`);
  if (holder.id !== run.id) throw apiError(403, "forbidden", "this token belongs to another run");
  return { run, session };
}

agentApi.post("/runs/:id/heartbeat", async (c) => {
  const { run, session } = await authorisedRun(c);
  const state = ownership({ run, session });
  if (!state.owns) return c.json(state, 409);
  // Past its deadline the session is over, even before its alarm has ended it,
  // unless this run (the turn in progress) still holds it: its lease holds (invariant 6).
  const policy = resolvePolicy(configOf(c.env).reset, session.platform, session.chatType);
  if (expiryReason(policy, session.lastActiveAt, now()) !== null && leaseUntil(run) <= now()) {
    return c.json({ owns: false, reason: "session_ended" } satisfies Ownership, 409);
  }
  const database = db(c.env);
  await database.batch(touchHeartbeat(run.id, now()));
  return c.json({ owns: true });
});

export const textBody = z.object({
  text: z
    .string()
    .max(32_768)
    .refine((text) => text.trim() !== "", { message: "must not be blank" }),
});

agentApi.post("/runs/:id/progress", async (c) => {
  const { run } = await authorisedRun(c);
  const { text } = await parseJsonBody(c, textBody);
  const result = await routerFor(c.env, run.sessionKey).progress(run.id, text);
  return c.json(result.body, result.status);
});

agentApi.post("/runs/:id/reply", async (c) => {
  const { run } = await authorisedRun(c);
  const { text } = await parseJsonBody(c, textBody);
  const result = await routerFor(c.env, run.sessionKey).runReply(run.id, text);
  return c.json(result.body, result.status);
});

/**
 * A run token may act on its own conversation only: a session of another key is a
 * 403; a session of its own key that it is not the current run of is the routing
 * object's 409 (`{"owns": false, "reason"}`).
 */
async function sessionForRun(c: Context<{ Bindings: Env }>): Promise<{ run: RunRow; session: SessionRow }> {
  const sessionId = c.req.param("id")!;
  const run = await requireRunToken(c);
  const database = db(c.env);
  const [sessions] = await database.batch(selectSession(database, sessionId));
  const session = sessions[0];
  if (!session) throw apiError(404, "not_found", `no session ${sessionId}`);
  if (run.sessionKey !== session.sessionKey) {
    throw apiError(403, "forbidden", "this run belongs to another conversation");
  }
  return { run, session };
}

export const endBody = z
  .object({ reason: z.enum(END_REASONS).exclude(["compression"]).default("agent_close") })
  .strict();

agentApi.post("/sessions/:id/end", async (c) => {
  const { run, session } = await sessionForRun(c);
  const { reason } = await parseJsonBody(c, endBody, { allowEmpty: true });
  const result = await routerFor(c.env, session.sessionKey).agentEnd(session.id, run.id, reason);
  if (result.status !== 200) return c.json(result.body, result.status);
  return c.json({ session: sessionJson(result.body.session), changed: result.body.changed });
});

export const rotateBody = z.object({ reason: z.literal("compression").default("compression") }).strict();

agentApi.post("/sessions/:id/rotate", async (c) => {
  const { run, session } = await sessionForRun(c);
  await parseJsonBody(c, rotateBody, { allowEmpty: true });
  const result = await routerFor(c.env, session.sessionKey).rotate(session.id, run.id);
  return c.json(result.body, result.status);
});

export const cronBody = z.object({ job_id: z.string().min(1).max(256), text: z.string().min(1).max(32_768) }).strict();

agentApi.post("/cron/runs", async (c) => {
  const config = configOf(c.env);
  await requireToken(c, config.agentToken, "AGENT_TOKEN");
  const { job_id: jobId, text } = await parseJsonBody(c, cronBody);
  const runId = newId("run");
  const sessionKey = cronSessionKey(jobId, runId);
  const result = await routerFor(c.env, sessionKey).startCron(jobId, runId, text);
  if (result.status !== 200) return c.json(result.body, result.status);
  return c.json({ run_id: runId, session_id: result.body.session_id, session_key: sessionKey });
});
