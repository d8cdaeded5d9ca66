/**
 * `GET /openapi.json`: the OpenAPI 3.1 description of every route of the product,
 * built from the zod schemas that validate the requests (imported from the routes
 * and platform adapters that use them) and the answer schemas in ./responses.
 * test/openapi.test.ts checks that every route the app serves is described here.
 */
import type { $ZodType } from "zod/v4/core";
import { endBody as adminEndBody, listQuery } from "../routes/admin";
import { cronBody, endBody as agentEndBody, rotateBody, textBody } from "../routes/agent";
import { pageRetryKinds, sessionsFilter, signInForm } from "../routes/admin-ui/forms";
import { genericBodySchema } from "../platforms/generic";
import { eventCallbackSchema, urlVerificationSchema } from "../platforms/slack/events";
import { interactionHeadSchema } from "../platforms/discord/interactions";
import { updateSchema } from "../platforms/telegram/update";
import { payloadSchema } from "../platforms/whatsapp/payload";
import { requestSchema, responseSchema, type JsonSchema } from "./json-schema";
import * as answers from "./responses";

type Method = "get" | "post" | "delete";
type Auth = "admin" | "run" | "agent" | "page" | "none";

interface Operation {
  method: Method;
  /** Hono's form (`/admin/routes/:key`); written `{key}` in the document. */
  path: string;
  summary: string;
  tag: "ingress" | "agent" | "operator" | "admin page" | "health";
  auth: Auth;
  body?: $ZodType;
  /** Request body media type; JSON unless said. */
  bodyType?: "application/json" | "application/x-www-form-urlencoded";
  query?: $ZodType;
  /** The success answer: a JSON schema, or "html" for a page, or "redirect". */
  ok: $ZodType | "html" | "redirect" | "text";
  /** Other statuses this route answers, besides 400/401/5xx. */
  also?: number[];
  description?: string;
}

const SIGNED = "Verified by the platform's own signature scheme (see docs/platforms/).";

const OPERATIONS: Operation[] = [
  {
    method: "get",
    path: "/healthz",
    summary: "Health: configuration valid and D1 reachable",
    tag: "health",
    auth: "none",
    ok: answers.healthAnswer,
    also: [503],
  },
  { method: "get", path: "/openapi.json", summary: "This document", tag: "health", auth: "none", ok: "text" },
  // Ingress
  {
    method: "post",
    path: "/webhooks/generic",
    summary: "A message from a custom client",
    description: "Header `X-Signature-256: sha256=<hex HMAC-SHA256 of the raw body with GENERIC_WEBHOOK_SECRET>`.",
    tag: "ingress",
    auth: "none",
    body: genericBodySchema,
    ok: answers.acceptedAnswer,
    also: [413],
  },
  {
    method: "post",
    path: "/webhooks/telegram",
    summary: "A Telegram update",
    description: `${SIGNED} Header \`X-Telegram-Bot-Api-Secret-Token\`.`,
    tag: "ingress",
    auth: "none",
    body: updateSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "post",
    path: "/webhooks/slack",
    summary: "A Slack Events API callback, url_verification or slash command",
    description: `${SIGNED} Slack v0 signing.`,
    tag: "ingress",
    auth: "none",
    body: eventCallbackSchema.or(urlVerificationSchema),
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "post",
    path: "/webhooks/discord",
    summary: "A Discord interaction (PING or command)",
    description: `${SIGNED} Ed25519.`,
    tag: "ingress",
    auth: "none",
    body: interactionHeadSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "get",
    path: "/webhooks/whatsapp",
    summary: "WhatsApp verification challenge",
    tag: "ingress",
    auth: "none",
    ok: "text",
    also: [403, 404],
  },
  {
    method: "post",
    path: "/webhooks/whatsapp",
    summary: "A WhatsApp Cloud API notification",
    description: `${SIGNED} \`X-Hub-Signature-256\`.`,
    tag: "ingress",
    auth: "none",
    body: payloadSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  // Agent API
  {
    method: "post",
    path: "/v1/runs/:id/heartbeat",
    summary: "Does this run still own its session?",
    tag: "agent",
    auth: "run",
    ok: answers.ownsAnswer,
    also: [403, 404, 409],
  },
  {
    method: "post",
    path: "/v1/runs/:id/progress",
    summary: "A progress notice to the chat",
    tag: "agent",
    auth: "run",
    body: textBody,
    ok: answers.progressAnswer,
    also: [403, 404, 409],
  },
  {
    method: "post",
    path: "/v1/runs/:id/reply",
    summary: "The run's reply",
    tag: "agent",
    auth: "run",
    body: textBody,
    ok: answers.recordedAnswer,
    also: [403, 404, 409],
  },
  {
    method: "post",
    path: "/v1/sessions/:id/end",
    summary: "End the session (by its current run)",
    tag: "agent",
    auth: "run",
    body: agentEndBody,
    ok: answers.endedAnswer,
    also: [403, 404, 409],
  },
  {
    method: "post",
    path: "/v1/sessions/:id/rotate",
    summary: "Rotate into a continuation session",
    tag: "agent",
    auth: "run",
    body: rotateBody,
    ok: answers.rotatedAnswer,
    also: [403, 404, 409],
  },
  {
    method: "post",
    path: "/v1/cron/runs",
    summary: "Run a scheduled job in a session of its own",
    tag: "agent",
    auth: "agent",
    body: cronBody,
    ok: answers.cronAnswer,
    also: [403],
  },
  {
    method: "get",
    path: "/v1/attachments/:id",
    summary: "The bytes of an attachment, fetched from the platform",
    tag: "agent",
    auth: "run",
    ok: "text",
    also: [403, 404, 413, 502],
  },
  // Operator API
  {
    method: "get",
    path: "/admin/routes/:key",
    summary: "The routing entry of a key (key URL-encoded once)",
    tag: "operator",
    auth: "admin",
    ok: answers.routeAnswer,
  },
  {
    method: "delete",
    path: "/admin/routes/:key",
    summary: "Forget the routing entry (D1 is kept)",
    tag: "operator",
    auth: "admin",
    ok: answers.forgottenAnswer,
  },
  {
    method: "get",
    path: "/admin/routes/:key/explain",
    summary: "What a message for this key would do now, and why",
    description:
      "Reads the D1 row a message would read and changes nothing. `overlap` is the effective `OVERLAP` settings for the key's platform and chat type, with the layer they came from; `waiting` counts the stored user messages no run carries yet.",
    tag: "operator",
    auth: "admin",
    ok: answers.explainAnswer,
  },
  {
    method: "get",
    path: "/admin/sessions",
    summary: "Sessions, newest first",
    tag: "operator",
    auth: "admin",
    query: listQuery,
    ok: answers.sessionsAnswer,
  },
  {
    method: "get",
    path: "/admin/sessions/:id",
    summary: "One session: messages, events, deliveries, runs",
    tag: "operator",
    auth: "admin",
    ok: answers.sessionAnswer,
    also: [404],
  },
  {
    method: "post",
    path: "/admin/sessions/:id/end",
    summary: "End a session as an operator",
    tag: "operator",
    auth: "admin",
    body: adminEndBody,
    ok: answers.endedAnswer,
    also: [404],
  },
  {
    method: "post",
    path: "/admin/runs/:id/retry",
    summary: "Hand a failed run to the agent again",
    tag: "operator",
    auth: "admin",
    ok: answers.retriedAnswer,
    also: [404, 409],
  },
  {
    method: "post",
    path: "/admin/deliveries/:event_id/retry",
    summary: "Send a failed delivery again",
    tag: "operator",
    auth: "admin",
    ok: answers.retriedAnswer,
    also: [404, 409],
  },
  {
    method: "post",
    path: "/admin/events/:id/retry",
    summary: "Deliver a dead-lettered event again",
    tag: "operator",
    auth: "admin",
    ok: answers.retriedAnswer,
    also: [404, 409],
  },
  {
    method: "get",
    path: "/admin/metrics",
    summary: "Counters since start (per isolate)",
    tag: "operator",
    auth: "admin",
    ok: answers.metricsAnswer,
  },
  // The admin web page (HTML, session cookie, CSRF token on every POST)
  {
    method: "get",
    path: "/admin",
    summary: "The admin page: the sign-in form, or the sessions once signed in",
    tag: "admin page",
    auth: "none",
    ok: "html",
  },
  {
    method: "post",
    path: "/admin/ui/sign-in",
    summary: "Sign in with ADMIN_TOKEN; sets the session cookie",
    tag: "admin page",
    auth: "none",
    body: signInForm,
    bodyType: "application/x-www-form-urlencoded",
    ok: "redirect",
    also: [403],
  },
  {
    method: "post",
    path: "/admin/ui/sign-out",
    summary: "Sign out",
    tag: "admin page",
    auth: "page",
    ok: "redirect",
    also: [403],
  },
  {
    method: "get",
    path: "/admin/ui/sessions",
    summary: "Sessions with filters and paging",
    tag: "admin page",
    auth: "page",
    query: sessionsFilter,
    ok: "html",
  },
  {
    method: "get",
    path: "/admin/ui/sessions/:id",
    summary: "One session's timeline and its explain block",
    tag: "admin page",
    auth: "page",
    ok: "html",
    also: [404],
  },
  {
    method: "get",
    path: "/admin/ui/failed",
    summary: "Failed runs, deliveries and events, each with a retry button",
    tag: "admin page",
    auth: "page",
    ok: "html",
  },
  { method: "get", path: "/admin/ui/metrics", summary: "The metrics", tag: "admin page", auth: "page", ok: "html" },
  {
    method: "post",
    path: "/admin/ui/retry/:kind/:id",
    summary: `Retry a failed item (kind: ${pageRetryKinds.join(", ")})`,
    tag: "admin page",
    auth: "page",
    bodyType: "application/x-www-form-urlencoded",
    ok: "redirect",
    also: [403, 404, 409],
  },
];

const SECURITY: Record<Exclude<Auth, "none">, string> = {
  admin: "adminToken",
  run: "runToken",
  agent: "agentToken",
  page: "adminSession",
};

const STATUS_TEXT: Record<number, string> = {
  400: "Malformed JSON or a body that fails validation",
  401: "Missing or bad signature or token",
  403: "A valid token without the right (page: a missing or wrong CSRF token)",
  404: "Unknown id, or the platform is not configured",
  409: "Not the session's current run, or the item is not failed",
  413: "Body too large",
  500: "Invalid configuration (names the key)",
  502: "The platform refused or failed",
  503: "D1 or another dependency failed; retry",
};

/** `/admin/routes/:key` → `/admin/routes/{key}`. */
export function openApiPath(honoPath: string): string {
  return honoPath.replace(/:([A-Za-z_]+)/g, "{$1}");
}

const json = (schema: JsonSchema) => ({ "application/json": { schema } });
const errorContent = () => json(responseSchema(answers.errorAnswer));

function responsesOf(op: Operation) {
  const responses: Record<string, unknown> = {};
  if (op.ok === "html")
    responses["200"] = { description: "An HTML page", content: { "text/html": { schema: { type: "string" } } } };
  else if (op.ok === "redirect")
    responses["303"] = {
      description: "Redirect to the next page",
      headers: { location: { schema: { type: "string" } } },
    };
  else if (op.ok === "text") responses["200"] = { description: "OK" };
  else responses["200"] = { description: "OK", content: json(responseSchema(op.ok)) };
  const statuses = new Set([
    ...(op.body || op.query ? [400] : []),
    ...(op.auth === "none" ? [] : [401]),
    ...(op.also ?? []),
    500,
    503,
  ]);
  if (op.path.startsWith("/webhooks/")) statuses.add(401);
  for (const status of [...statuses].sort()) {
    const content =
      status === 409 && op.tag === "agent" ? json(responseSchema(answers.notOwnedAnswer)) : errorContent();
    responses[String(status)] = {
      description: STATUS_TEXT[status] ?? "Error",
      ...(op.ok === "html" ? {} : { content }),
    };
  }
  return responses;
}

function parametersOf(op: Operation) {
  const names = [...op.path.matchAll(/:([A-Za-z_]+)/g)].map((m) => m[1]!);
  const inPath = names.map((name) => ({
    name,
    in: "path",
    required: true,
    schema: { type: "string" },
    ...(name === "key" ? { description: "The session key as /admin/sessions shows it, URL-encoded once" } : {}),
  }));
  if (!op.query) return inPath;
  const schema = requestSchema(op.query) as { properties?: Record<string, JsonSchema>; required?: string[] };
  const inQuery = Object.entries(schema.properties ?? {}).map(([name, property]) => ({
    name,
    in: "query",
    required: schema.required?.includes(name) ?? false,
    schema: property,
  }));
  return [...inPath, ...inQuery];
}

function operationOf(op: Operation) {
  return {
    summary: op.summary,
    ...(op.description ? { description: op.description } : {}),
    tags: [op.tag],
    operationId: `${op.method}${op.path.replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? "").toUpperCase())}`,
    security: op.auth === "none" ? [] : [{ [SECURITY[op.auth]]: [] }],
    parameters: parametersOf(op),
    ...(op.body
      ? {
          requestBody: {
            required: true,
            content: { [op.bodyType ?? "application/json"]: { schema: requestSchema(op.body) } },
          },
        }
      : {}),
    responses: responsesOf(op),
  };
}

/** Every described route as `METHOD /hono/:path`, for the coverage test. */
export const describedRoutes = (): string[] => OPERATIONS.map((op) => `${op.method.toUpperCase()} ${op.path}`);

let cached: object | null = null;

/** The OpenAPI 3.1 document (built once per isolate). */
export function openApiDocument(): object {
  if (cached) return cached;
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of OPERATIONS) (paths[openApiPath(op.path)] ??= {})[op.method] = operationOf(op);
  cached = {
    openapi: "3.1.0",
    jsonSchemaDialect: "https://json-schema.org/draft/2020-12/schema",
    info: {
      title: "sessiongate",
      version: "0.1.0",
      description:
        'An edge gateway between chat platforms and an AI agent backend: one live session per conversation key. Times are integer milliseconds since the epoch; errors are `{"error": {"code", "message"}}`.',
    },
    tags: [
      { name: "ingress", description: "Chat platform webhooks" },
      { name: "agent", description: "The agent backend's API" },
      { name: "operator", description: "The operator's JSON API" },
      { name: "admin page", description: "The operator's web page (HTML)" },
      { name: "health", description: "Health and this description" },
    ],
    paths,
    components: {
      securitySchemes: {
        adminToken: { type: "http", scheme: "bearer", description: "ADMIN_TOKEN" },
        agentToken: { type: "http", scheme: "bearer", description: "AGENT_TOKEN" },
        runToken: { type: "http", scheme: "bearer", description: "The run's own run_token" },
        adminSession: {
          type: "apiKey",
          in: "cookie",
          name: "sessiongate_admin",
          description: "Set by POST /admin/ui/sign-in",
        },
      },
    },
  };
  return cached;
}
