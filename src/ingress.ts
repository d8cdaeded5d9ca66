/**
 * A verified inbound message → its session key → that key's routing object. The
 * object answers with the status and body the platform gets; if the object cannot
 * be reached, the platform gets a 503 and retries (spec invariant 1).
 */
import type { Config } from "./config";
import type { StoredAttachment } from "./domain/attachments";
import type { InboundMessage } from "./domain/inbound";
import { buildSessionKey } from "./domain/session-key";
import { describe } from "./http/outbound";
import { errorBody } from "./http/errors";
import { log } from "./log";
import { newId } from "./ids";
import { routerFor } from "./routing/client";
import type { AcceptedBody, RpcResult } from "./routing/results";

export function sessionKeyOf(message: InboundMessage, config: Config): string {
  return buildSessionKey(
    {
      platform: message.platform,
      chatType: message.chatType,
      chatId: message.chatId,
      threadId: message.threadId,
      userId: message.userId,
    },
    config.groupSessionsPerUser,
  );
}

/** Gives each attachment the gateway's own id (a retry of the event is a duplicate, so fresh ids are safe). */
function withIds(message: InboundMessage): StoredAttachment[] | undefined {
  if (!message.attachments || message.attachments.length === 0) return undefined;
  return message.attachments.map((attachment) => ({ ...attachment, id: newId("att") }));
}

/**
 * Routes one message and writes its one log line: the routing decision (append,
 * reopen, fresh, promoted, duplicate, command) and how long the routing object took.
 */
export async function ingest(
  env: Env,
  config: Config,
  message: InboundMessage,
  requestId: string | null = null,
): Promise<RpcResult<AcceptedBody>> {
  const sessionKey = sessionKeyOf(message, config);
  const started = Date.now();
  const fields = { request_id: requestId, session_key: sessionKey, platform: message.platform };
  try {
    const result = await routerFor(env, sessionKey).route({ ...message, attachments: withIds(message), sessionKey });
    const ms = Date.now() - started;
    if (result.status === 200) {
      const { decision, ...body } = result.body;
      log.info("message routed", { ...fields, decision, session_id: body.session_id, ms });
      return { status: 200, body };
    }
    log.warn("message not routed", { ...fields, status: result.status, ms });
    return result;
  } catch (error) {
    log.error("routing object unreachable", { ...fields, error: describe(error), ms: Date.now() - started });
    return { status: 503, body: errorBody("unavailable", "routing unavailable, retry later") };
  }
}
