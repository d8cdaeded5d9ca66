/**
 * The session key (spec "Words"): `{platform}:{chat_type}:{chat_id}`, then
 * `:{thread_id}` for a threaded message, then `:{user_id}` for group and channel
 * chats when group sessions are per user. Built from the verified message only.
 */
export const CHAT_TYPES = ["dm", "group", "channel"] as const;
export type ChatType = (typeof CHAT_TYPES)[number];

/** Every platform a session key can start with: the adapters' names and scheduled jobs' `cron`. */
export const PLATFORMS = ["generic", "telegram", "slack", "discord", "whatsapp", "cron"] as const;

export interface KeyParts {
  platform: string;
  chatType: ChatType;
  chatId: string;
  threadId?: string | null;
  userId: string;
}

/**
 * Percent-encodes `%` and `:` so that no id, however a client chooses it, can add
 * a segment to a key or collide with another one (`a:b` becomes `a%3Ab`, and a
 * literal `a%3Ab` becomes `a%253Ab`).
 */
export function encodeKeyPart(id: string): string {
  return id.replaceAll("%", "%25").replaceAll(":", "%3A");
}

export function buildSessionKey(parts: KeyParts, groupSessionsPerUser: boolean): string {
  const segments = [parts.platform, parts.chatType, parts.chatId];
  if (parts.threadId !== undefined && parts.threadId !== null && parts.threadId !== "") {
    segments.push(parts.threadId);
  }
  if (parts.chatType !== "dm" && groupSessionsPerUser) segments.push(parts.userId);
  return [segments[0], segments[1], ...segments.slice(2).map(encodeKeyPart)].join(":");
}

/** The key of a scheduled job's own session (spec "Scheduled jobs"). */
export function cronSessionKey(jobId: string, runId: string): string {
  return ["cron", encodeKeyPart(jobId), encodeKeyPart(runId)].join(":");
}
