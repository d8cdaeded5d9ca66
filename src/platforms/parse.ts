/** Shared parsing helpers for adapters: JSON of verified bytes, and zod errors as 400s. */
import type * as z from "zod";
import { apiError } from "../http/errors";
import { decodeUtf8 } from "../http/utf8";

/** Parses verified bytes as strict UTF-8 JSON, or answers 400. */
export function parseJsonBytes(raw: ArrayBuffer): unknown {
  const text = decodeUtf8(raw);
  try {
    return JSON.parse(text);
  } catch {
    throw apiError(400, "invalid_json", "body is not valid JSON");
  }
}

/** A 400 naming the first field that failed validation. */
export function validationError(error: z.ZodError) {
  const issue = error.issues[0];
  return apiError(400, "invalid_body", `${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"}`);
}
