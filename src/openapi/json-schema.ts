/**
 * The one place zod schemas become JSON Schema (for /openapi.json). It uses zod's
 * own converter from `zod/v4/core`, which takes classic `zod` and `zod/mini`
 * schemas alike, so the project can switch flavours without touching the document.
 */
import { toJSONSchema, type $ZodType } from "zod/v4/core";

export type JsonSchema = Record<string, unknown>;

/**
 * A request schema as JSON Schema 2020-12 (OpenAPI 3.1's dialect), seen from the
 * input side: what a client may send, before defaults and transforms apply.
 * Refinements and transforms have no JSON form: they are left out (documented by
 * their `description` where it matters), never a reason to fail.
 */
export function requestSchema(schema: $ZodType): JsonSchema {
  return strip(toJSONSchema(schema, { target: "draft-2020-12", io: "input", unrepresentable: "any" }));
}

/** A response schema as JSON Schema, seen from the output side. */
export function responseSchema(schema: $ZodType): JsonSchema {
  return strip(toJSONSchema(schema, { target: "draft-2020-12", io: "output", unrepresentable: "any" }));
}

/** OpenAPI 3.1 declares the dialect once for the document; a `$schema` per schema is noise. */
function strip(schema: JsonSchema): JsonSchema {
  const { $schema: _dialect, ...rest } = schema;
  return rest;
}
