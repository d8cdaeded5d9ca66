/**
 * sessiongate: the Hono app, its mounts, and the Worker's handlers. The routing
 * Durable Object class is exported here for wrangler.
 */
import { Hono } from "hono";
import { health } from "./health";
import { errorBody, renderError } from "./http/errors";
import { openApiDocument } from "./openapi/document";
import { admin } from "./routes/admin";
import { adminPage } from "./routes/admin-ui";
import { agentApi } from "./routes/agent";
import { attachmentsApi } from "./routes/attachments";
import { webhooks } from "./routes/webhooks";
import { sweep } from "./sweep";

export { SessionRouter } from "./routing/router";

/** Exported for the route-coverage test of /openapi.json (test/openapi.test.ts). */
export const app = new Hono<{ Bindings: Env }>();

app.onError(renderError);
app.notFound((c) => c.json(errorBody("not_found", `no route for ${c.req.method} ${c.req.path}`), 404));

app.get("/healthz", async (c) => c.json(await health(c.env)));

app.get("/openapi.json", (c) => c.json(openApiDocument()));
app.route("/webhooks", webhooks);
// The web page first: it serves only /admin and /admin/ui/*, and calls the JSON API in-process for retries.
app.route(
  "/admin",
  adminPage((request, env) => app.fetch(request, env)),
);
app.route("/admin", admin);
app.route("/v1", agentApi);
app.route("/v1/attachments", attachmentsApi);

export default {
  fetch: app.fetch,
  async scheduled(controller, env, ctx) {
    ctx.waitUntil(sweep(env, controller.scheduledTime));
  },
} satisfies ExportedHandler<Env>;
