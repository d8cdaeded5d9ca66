/**
 * `/webhooks/{platform}`: one route per platform adapter. The adapter verifies the
 * raw bytes and parses them; each message then goes through ingress in order, and
 * the adapter shapes the answer. If any message could not be stored, the platform
 * gets that failure (5xx) and retries; messages already stored are duplicates then.
 */
import { Hono } from "hono";
import { configOf, effectiveEnv } from "../config";
import { apiError, errorBody } from "../http/errors";
import { ingest } from "../ingress";
import { requestIdOf } from "../log";
import { ADAPTERS } from "../platforms";
import type { RoutedOutcome, WebhookAnswer } from "../platforms/types";
import { bodyLimit } from "./body-limit";

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

function respond(answer: WebhookAnswer): Response {
  if (answer.text)
    return new Response(String(answer.body), { status: answer.status, headers: { "content-type": "text/plain" } });
  return new Response(answer.body === undefined ? null : JSON.stringify(answer.body), {
    status: answer.status,
    headers: { "content-type": "application/json" },
  });
}

for (const adapter of ADAPTERS) {
  webhooks.on([...adapter.methods], `/${adapter.name}`, async (c) => {
    const config = configOf(c.env);
    const settings = adapter.settings(effectiveEnv(c.env), config);
    if (settings === null) throw apiError(404, "not_configured", `the ${adapter.name} platform is not configured`);
    const verdict = await adapter.handle(
      {
        method: c.req.method,
        url: new URL(c.req.url),
        headers: c.req.raw.headers,
        rawBody: c.req.method === "GET" ? new ArrayBuffer(0) : await c.req.arrayBuffer(),
        config,
      },
      settings,
    );
    if (verdict.kind === "answer") return respond(verdict.answer);
    const outcomes: RoutedOutcome[] = [];
    for (const message of verdict.messages) {
      const result = await ingest(c.env, config, message, requestIdOf(c.req.raw));
      if (result.status !== 200) return c.json(result.body, result.status);
      outcomes.push({
        message,
        sessionId: result.body.session_id,
        duplicate: result.body.duplicate,
        commandReply: result.body.command_reply ?? null,
      });
    }
    return respond(verdict.answer(outcomes));
  });
}
