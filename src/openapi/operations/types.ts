/** The shape of one described route in the OpenAPI document (document.ts renders it). */
import type { $ZodType } from "zod/v4/core";

export type Method = "get" | "post" | "delete";
export type Auth = "admin" | "run" | "agent" | "page" | "none";

export interface Operation {
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
