/** Reads and validates a JSON request body, answering 400 with the first problem. */
import type { Context } from "hono";
import type * as z from "zod";
import { apiError } from "../http/errors";
import { decodeUtf8 } from "../http/utf8";

export async function parseJsonBody<S extends z.ZodType>(
  c: Context,
  schema: S,
  options: { allowEmpty?: boolean } = {},
): Promise<z.infer<S>> {
  const raw = decodeUtf8(await c.req.arrayBuffer());
  let json: unknown = {};
  if (raw.trim() !== "" || !options.allowEmpty) {
    try {
      json = JSON.parse(raw);
    } catch {
      throw apiError(400, "invalid_json", "body is not valid JSON");
    }
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw apiError(400, "invalid_body", `${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}
