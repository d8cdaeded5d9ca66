/**
 * The request schemas stay convertible by zod's own z.toJSONSchema (GET /openapi.json
 * is generated from them) with the import style the bundle needs (`import * as z`).
 * Schemas with a transform describe their input: `{ io: "input" }`.
 */
import * as z from "zod";
import { describe, expect, it } from "vitest";
import { resetConfigSchema } from "../../src/domain/reset-policy";
import { genericBodySchema } from "../../src/platforms/generic";

describe("z.toJSONSchema on the request schemas", () => {
  it("describes the generic webhook body (its input side)", () => {
    const schema = z.toJSONSchema(genericBodySchema, { io: "input" }) as any;
    expect(schema.type).toBe("object");
    // `text` may be left out when the message carries attachments (media alone is text "").
    expect(schema.required).toEqual(expect.arrayContaining(["event_id", "chat_id", "chat_type", "user_id"]));
    expect(schema.required).not.toContain("text");
    expect(schema.properties.attachments.type).toBe("array");
    expect(schema.properties.chat_type.enum).toEqual(["dm", "group", "channel"]);
  });

  it("describes SESSION_RESET, by_platform limited to the known platforms, unknown fields refused", () => {
    const schema = z.toJSONSchema(resetConfigSchema) as any;
    expect(schema.additionalProperties).toBe(false);
    expect(schema.properties.by_platform.propertyNames.enum).toContain("telegram");
  });
});
