/** The built-in agent used when AGENT_URL is unset, so the gateway answers out of the box. */
import type { AgentRunRequest } from "./types";

/** Echoes the text, then the kinds of any attachments (`[image]`), so media alone gets a visible answer. */
export function echoAgent(request: AgentRunRequest): { kind: "reply"; text: string } {
  const kinds = (request.message.attachments ?? []).map((attachment) => `[${attachment.kind}]`);
  return { kind: "reply", text: `echo: ${[request.message.text, ...kinds].filter((part) => part !== "").join(" ")}` };
}
