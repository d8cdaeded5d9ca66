/** `GET /openapi.json`: every route the app serves is described, from the schemas that validate requests. */
import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { app } from "../../src";
import { openApiPath } from "../../src/openapi/document";
import { BASE } from "../helpers";

async function fetchDocument(): Promise<any> {
  const response = await exports.default.fetch(new Request(`${BASE}/openapi.json`));
  expect(response.status).toBe(200);
  expect(response.headers.get("content-type")).toContain("application/json");
  return response.json();
}

/** The routes the Hono app serves, as `METHOD /path/{param}` (middleware entries left out). */
function servedRoutes(): string[] {
  const routes = app.routes
    .filter((route) => route.method !== "ALL")
    .map((route) => `${route.method.toUpperCase()} ${openApiPath(route.path)}`);
  return [...new Set(routes)].sort();
}

describe("/openapi.json", () => {
  it("is OpenAPI 3.1, needs no token, and describes every route the app serves", async () => {
    const doc = await fetchDocument();
    expect(doc.openapi).toBe("3.1.0");
    const described = Object.entries(doc.paths as Record<string, Record<string, unknown>>).flatMap(([path, item]) =>
      Object.keys(item).map((method) => `${method.toUpperCase()} ${path}`),
    );
    const served = servedRoutes();
    expect(served.length).toBeGreaterThan(20);
    expect(served.filter((route) => !described.includes(route))).toEqual([]);
  });

  it("covers the routes of the spec the app does not serve yet, too", async () => {
    const doc = await fetchDocument();
    for (const [method, path] of [
      ["post", "/admin/runs/{id}/retry"],
      ["post", "/admin/deliveries/{event_id}/retry"],
      ["get", "/v1/attachments/{id}"],
      ["get", "/admin/routes/{key}/explain"],
      ["get", "/admin"],
    ] as const) {
      expect(doc.paths[path]?.[method], `${method} ${path}`).toBeDefined();
    }
  });

  it("describes request bodies and queries from the zod schemas that validate them", async () => {
    const doc = await fetchDocument();
    const generic = doc.paths["/webhooks/generic"].post.requestBody.content["application/json"].schema;
    // `text` may be left out when the message carries attachments (media alone is text "").
    expect(generic.required).toEqual(expect.arrayContaining(["event_id", "chat_id", "chat_type", "user_id"]));
    expect(generic.properties.attachments.items.properties.url).toBeDefined();
    expect(generic.properties.chat_type.enum).toEqual(["dm", "group", "channel"]);
    expect(generic.properties.text).toMatchObject({ type: "string", maxLength: 32768 });
    const end = doc.paths["/admin/sessions/{id}/end"].post.requestBody.content["application/json"].schema;
    expect(end.properties.reason.enum).not.toContain("compression");
    expect(end.additionalProperties).toBe(false);
    const cron = doc.paths["/v1/cron/runs"].post.requestBody.content["application/json"].schema;
    expect(cron.required).toEqual(["job_id", "text"]);
    const list = doc.paths["/admin/sessions"].get.parameters.map((p: any) => [p.name, p.in]);
    expect(list).toEqual([
      ["key", "query"],
      ["open", "query"],
      ["limit", "query"],
    ]);
    expect(doc.paths["/admin/routes/{key}"].get.parameters[0]).toMatchObject({
      name: "key",
      in: "path",
      required: true,
    });
    expect(doc.paths["/admin/sessions"].get.security).toEqual([{ adminToken: [] }]);
    expect(doc.paths["/healthz"].get.security).toEqual([]);
  });
});
