/**
 * `GET /openapi.json`: the OpenAPI 3.1 description of every route of the product,
 * built from the zod schemas that validate the requests (imported from the routes
 * and platform adapters that use them) and the answer schemas in ./responses.
 * test/openapi.test.ts checks that every route the app serves is described here.
 */
import { requestSchema, responseSchema, type JsonSchema } from "./json-schema";
import { ADMIN_PAGE } from "./operations/admin-page";
import { AGENT } from "./operations/agent";
import { HEALTH_AND_INGRESS } from "./operations/ingress";
import { OPERATOR } from "./operations/operator";
import type { Auth, Operation } from "./operations/types";
import * as answers from "./responses";

/** Every described route, in the document's order: one file per route group under operations/. */
const OPERATIONS: Operation[] = [...HEALTH_AND_INGRESS, ...AGENT, ...OPERATOR, ...ADMIN_PAGE];

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
