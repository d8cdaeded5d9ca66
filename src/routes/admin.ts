/** `/admin/*`: the operator API (spec "Operator API"), behind `Authorization: Bearer {ADMIN_TOKEN}`. */
import { Hono } from "hono";
import * as z from "zod";
import { explainKey } from "../admin/explain-key";
import { configOf } from "../config";
import { Database } from "../db/client";
import { selectDeliveriesFor, selectSessionDeliveries } from "../db/deliveries";
import { selectRun, selectSessionRuns } from "../db/runs";
import { requeueEvent, selectEvent, selectSessionEvents } from "../db/events";
import { selectMessages, selectSession, selectSessions } from "../db/sessions";
import { END_REASONS } from "../domain/end-reasons";
import { now } from "../clock";
import { apiError } from "../http/errors";
import { snapshot } from "../metrics";
import { routerFor } from "../routing/client";
import { requireToken } from "./auth";
import { parseJsonBody } from "./body";
import { deliveryJson, eventJson, messageJson, runJson, sessionJson } from "./json";

export const admin = new Hono<{ Bindings: Env }>();

admin.use("*", async (c, next) => {
  const config = configOf(c.env);
  await requireToken(c, config.adminToken, "ADMIN_TOKEN");
  await next();
});

const db = (env: Env) => new Database(env.DB, "background");

admin.get("/routes/:key", async (c) => {
  const key = c.req.param("key");
  const view = await routerFor(c.env, key).inspect();
  return c.json({
    entry: view.entry,
    alarm_at: view.alarm_at,
    session: view.session ? sessionJson(view.session) : null,
  });
});

admin.get("/routes/:key/explain", async (c) => c.json(await explainKey(c.env, c.req.param("key"))));

admin.delete("/routes/:key", async (c) => {
  const key = c.req.param("key");
  await routerFor(c.env, key).forget();
  return c.json({ forgotten: true, session_key: key });
});

/** An empty query value (`?key=&open=`) means no filter, as when it is absent. */
const optional = <T extends z.ZodType>(schema: T) => z.preprocess((v) => (v === "" ? undefined : v), schema.optional());

export const listQuery = z.object({
  key: optional(z.string()),
  open: optional(z.enum(["true", "false", "1", "0"])),
  limit: optional(z.coerce.number().int().min(1).max(1000)),
});

/** A 400 naming every query parameter at fault (`open: Invalid option...`). */
function invalidQuery(error: z.ZodError): never {
  const message = error.issues.map((issue) => `${issue.path.join(".") || "query"}: ${issue.message}`).join("; ");
  throw apiError(400, "invalid_query", message);
}

admin.get("/sessions", async (c) => {
  const parsed = listQuery.safeParse(c.req.query());
  if (!parsed.success) throw invalidQuery(parsed.error);
  const { key, open, limit = 100 } = parsed.data;
  const database = db(c.env);
  const [rows] = await database.batch(
    selectSessions(database, { key, open: open === undefined ? undefined : open === "true" || open === "1", limit }),
  );
  return c.json({ sessions: rows.map(sessionJson) });
});

admin.get("/sessions/:id", async (c) => {
  const id = c.req.param("id");
  const database = db(c.env);
  const [rows, messages, events, deliveries, runs] = await database.batch(
    selectSession(database, id),
    selectMessages(database, id),
    selectSessionEvents(database, id),
    selectSessionDeliveries(database, id),
    selectSessionRuns(id),
  );
  const row = rows[0];
  if (!row) throw apiError(404, "not_found", `no session ${id}`);
  return c.json({
    session: sessionJson(row),
    messages: messages.map(messageJson),
    events: events.map(eventJson),
    deliveries: deliveries.map(deliveryJson),
    runs: runs.map(runJson),
  });
});

export const endBody = z.object({ reason: z.enum(END_REASONS).exclude(["compression"]).default("admin") }).strict();

admin.post("/sessions/:id/end", async (c) => {
  const id = c.req.param("id");
  const { reason } = await parseJsonBody(c, endBody, { allowEmpty: true });
  const database = db(c.env);
  const [rows] = await database.batch(selectSession(database, id));
  const row = rows[0];
  if (!row) throw apiError(404, "not_found", `no session ${id}`);
  const result = await routerFor(c.env, row.sessionKey).endSession(id, reason);
  if (result.status !== 200) return c.json(result.body, result.status);
  return c.json({ session: sessionJson(result.body.session), changed: result.body.changed });
});

admin.post("/events/:id/retry", async (c) => {
  const id = c.req.param("id");
  const database = db(c.env);
  const [found] = await database.batch(selectEvent(id));
  if (!found[0]) throw apiError(404, "not_found", `no event ${id}`);
  const [changed, rows] = await database.batch(requeueEvent(id, now()), selectEvent(id));
  const event = rows[0];
  if (changed === 0 || !event) throw apiError(409, "not_failed", `event ${id} has not failed`);
  // Its routing object delivers it right away (retries never wait for the Cron Trigger).
  await routerFor(c.env, event.sessionKey).flushEvents(event.sessionId);
  return c.json({ requeued: true, event: eventJson(event) });
});

/** `POST /admin/runs/{id}/retry`: a failed run handed to the agent again (invariant 12). */
admin.post("/runs/:id/retry", async (c) => {
  const id = c.req.param("id");
  const database = db(c.env);
  const [runs] = await database.batch(selectRun(database, id));
  const run = runs[0];
  if (!run) throw apiError(404, "not_found", `no run ${id}`);
  const result = await routerFor(c.env, run.sessionKey).retryRun(id);
  if (result.status !== 200) return c.json(result.body, result.status);
  return c.json({ run: runJson(result.body.run) });
});

/**
 * `POST /admin/deliveries/{event_id}/retry`: a dead-lettered reply or command answer
 * sent again (invariant 12). The path names the inbound event it answers (or the
 * delivery's own `id`); the newest failed reply or answer of that event is retried.
 */
admin.post("/deliveries/:event_id/retry", async (c) => {
  const id = c.req.param("event_id");
  const database = db(c.env);
  const [matches] = await database.batch(selectDeliveriesFor(id));
  if (matches.length === 0) throw apiError(404, "not_found", `no delivery for ${id}`);
  const failed = matches.find((d) => d.status === "failed" && d.kind !== "progress");
  if (!failed) throw apiError(409, "not_failed", `no failed delivery for ${id}`);
  const [sessions] = await database.batch(selectSession(database, failed.sessionId));
  const session = sessions[0];
  if (!session) throw apiError(404, "not_found", `no session ${failed.sessionId}`);
  const result = await routerFor(c.env, session.sessionKey).retryDelivery(failed.id, session.sessionKey);
  if (result.status !== 200) return c.json(result.body, result.status);
  return c.json({ delivery: deliveryJson(result.body.delivery) });
});

admin.get("/metrics", (c) => c.json(snapshot()));
