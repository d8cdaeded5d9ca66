/** An outbound reply as the routing object hands it to a platform's sender, for the senders' unit tests. */
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
