/**
 * The spec's error shape, `{"error": {"code", "message"}}`, thrown as Hono's
 * HTTPException by handlers and rendered once by `renderError`.
 */
import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { ConfigError } from "../config";
import { log, requestIdOf } from "../log";

export function errorBody(code: string, message: string) {
  return { error: { code, message } };
}

export function apiError(status: ContentfulStatusCode, code: string, message: string): HTTPException {
  return new HTTPException(status, {
    res: new Response(JSON.stringify(errorBody(code, message)), {
      status,
      headers: { "content-type": "application/json" },
    }),
  });
}

export function renderError(error: Error, c: Context): Response {
  if (error instanceof HTTPException) {
    if (error.res) return error.getResponse();
    return c.json(errorBody(codeFor(error.status), error.message || "request refused"), error.status);
  }
  if (error instanceof ConfigError) {
    log.error("invalid configuration", { request_id: requestIdOf(c.req.raw), key: error.key, error: error.message });
    return c.json(errorBody("invalid_config", error.message), 500);
  }
  log.error("unhandled error", { request_id: requestIdOf(c.req.raw), path: c.req.path, error });
  return c.json(errorBody("internal", "internal error"), 500);
}

function codeFor(status: number): string {
  if (status === 400) return "bad_request";
  if (status === 401) return "unauthorized";
  if (status === 403) return "forbidden";
  if (status === 404) return "not_found";
  if (status === 413) return "payload_too_large";
  return "error";
}
