#!/usr/bin/env node
// Validates an OpenAPI document (a file, or the URL of a running gateway's /openapi.json)
// against the OpenAPI 3.1 schema. Exits 1 with the errors when it is not valid.
import { Validator } from "@seriousme/openapi-schema-validator";

/** Validates `document` (an object); resolves to the validator's answer. */
export async function validateOpenApi(document) {
  const validator = new Validator();
  const result = await validator.validate(document);
  return { valid: result.valid, version: validator.version, errors: result.errors ?? null };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const source = process.argv[2];
  if (!source) {
    console.error("usage: validate-openapi.mjs <file | http://host:port/openapi.json>");
    process.exit(2);
  }
  const document = source.startsWith("http")
    ? await (await fetch(source)).json()
    : JSON.parse(await (await import("node:fs/promises")).readFile(source, "utf8"));
  const result = await validateOpenApi(document);
  if (!result.valid) {
    console.error(JSON.stringify(result.errors, null, 2));
    process.exit(1);
  }
  console.log(`valid OpenAPI ${result.version}`);
}
