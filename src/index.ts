/**
 * sessiongate: the Hono app, its mounts, and the Worker's handlers. The routing
 * Durable Object class is exported here for wrangler.
 */
import { Hono } from "hono";
import { configOf } from "./config";
import { Database, query } from "./db/client";
import { apiError, errorBody, renderError } from "./http/errors";
import { admin } from "./routes/admin";
import { agentApi } from "./routes/agent";
import { attachmentsApi } from "./routes/attachments";
import { webhooks } from "./routes/webhooks";
import { sweep } from "./sweep";

export { SessionRouter } from "./routing/router";

const app = new Hono<{ Bindings: Env }>();

app.onError(renderError);
app.notFound((c) => c.json(errorBody("not_found", `no route for ${c.req.method} ${c.req.path}`), 404));

app.get("/healthz", async (c) => {
  configOf(c.env); // an invalid configuration answers 500 naming the key
  try {
    // Through the counting client: the metrics cover every statement the gateway runs.
    await new Database(c.env.DB, "background").batch(query("SELECT 1"));
  } catch {
    throw apiError(503, "unavailable", "D1 is not reachable");
  }
  return c.json({ ok: true });
});

app.route("/webhooks", webhooks);
app.route("/admin", admin);
app.route("/v1", agentApi);
app.route("/v1/attachments", attachmentsApi);

export default {
  fetch: app.fetch,
  async scheduled(controller, env, ctx) {
    ctx.waitUntil(sweep(env, controller.scheduledTime));
  },
} satisfies ExportedHandler<Env>;
