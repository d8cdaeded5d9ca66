/** The built-in agent used when AGENT_URL is unset, so the gateway answers out of the box. */
import type { AgentRunRequest } from "./types";

export function echoAgent(request: AgentRunRequest): { kind: "reply"; text: string } {
  return { kind: "reply", text: `echo: ${request.message.text}` };
}
