/**
 * Scheduled jobs' data: a job's run is the first message of its own session
 * (`cron:{job_id}:{run_id}`), on the platform `cron`, which has nowhere to deliver.
 */
import type { SessionRow } from "../db/schema";
import type { RoutedMessage } from "./inbound";
import { cronSessionKey } from "./session-key";

/** The platform name of scheduled jobs' sessions. */
export const CRON_PLATFORM = "cron";

export const isCronSession = (row: Pick<SessionRow, "platform">): boolean => row.platform === CRON_PLATFORM;

/** The routed message of one run of a scheduled job. */
export function cronMessage(jobId: string, runId: string, text: string, now: number): RoutedMessage {
  return {
    platform: CRON_PLATFORM,
    eventId: `cron:${runId}`,
    chatId: jobId,
    chatType: "dm",
    userId: "cron",
    threadId: null,
    text,
    sentAt: null,
    replyTo: { platform: CRON_PLATFORM },
    sessionKey: cronSessionKey(jobId, runId),
    receivedAt: now,
  };
}
