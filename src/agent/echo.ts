/** The built-in agent used when AGENT_URL is unset, so the gateway answers out of the box. */
import type { AgentOutcome, AgentRunRequest } from "./types";

export function echoAgent(request: AgentRunRequest): AgentOutcome {
  return { kind: "reply", text: `echo: ${request.message.text}` };
}
