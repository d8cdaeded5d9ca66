/** Outbound calls in the platforms' unit tests: a reply as the routing object hands it to a sender, and a slow platform. */
import type { OutboundMessage } from "../../src/platforms/types";

export function outboundReply(platform: string, target: Record<string, unknown>, text = "hi"): OutboundMessage {
  return {
    kind: "reply",
    text,
    notice: null,
    sessionKey: `${platform}:dm:1`,
    sessionId: "ses_1",
    eventId: "evt_1",
    target: { platform, ...target },
  } as OutboundMessage;
}

/** Resolves after `ms`, or rejects as fetch does when the caller's `signal` aborts first. */
export function answerAfter(ms: number, signal: AbortSignal | null | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}
