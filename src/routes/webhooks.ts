/**
 * `/webhooks/*`: each platform's verification over the raw bytes received, then
 * one call into ingress. Thin on purpose: parsing lives in the platform adapters.
 */
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { configOf } from "../config";
import { apiError, errorBody } from "../http/errors";
import { ingest } from "../ingress";
import { genericBodySchema, toInbound, verifyGenericSignature } from "../platforms/generic";

/** Larger than any platform's webhook body; anything bigger is refused before it is read whole. */
export const WEBHOOK_MAX_BYTES = 128 * 1024;

export const webhooks = new Hono<{ Bindings: Env }>();

webhooks.use(
  "*",
  bodyLimit({
    maxSize: WEBHOOK_MAX_BYTES,
    onError: (c) => c.json(errorBody("payload_too_large", `body over ${WEBHOOK_MAX_BYTES} bytes`), 413),
  }),
);

/** Parses a verified body as JSON, or answers 400. */
export function parseJson(raw: ArrayBuffer): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(raw));
  } catch {
    throw apiError(400, "invalid_json", "body is not valid JSON");
  }
}

webhooks.post("/generic", async (c) => {
  const config = configOf(c.env);
  if (!config.genericWebhookSecret) throw apiError(404, "not_configured", "GENERIC_WEBHOOK_SECRET is not set");
  const raw = await c.req.arrayBuffer();
  if (!(await verifyGenericSignature(config.genericWebhookSecret, raw, c.req.header("x-signature-256") ?? null))) {
    throw apiError(401, "bad_signature", "missing or invalid X-Signature-256");
  }
  const parsed = genericBodySchema.safeParse(parseJson(raw));
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw apiError(400, "invalid_body", `${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"}`);
  }
  const result = await ingest(c.env, config, toInbound(parsed.data));
  return c.json(result.body, result.status);
});
