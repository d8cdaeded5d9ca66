/**
 * Chat commands the gateway answers itself (spec "Commands in message text").
 * They are never stored as messages and never reach the agent.
 */
export type Command = "new" | "reset" | "stop";

// `/new`, `/new@my_bot` (Telegram groups) and `/new anything` all count.
const COMMAND = /^\/(new|reset|stop)(?:@\S+)?(?:\s|$)/i;

export function parseCommand(text: string): Command | null {
  const match = COMMAND.exec(text.trim());
  return match ? (match[1]!.toLowerCase() as Command) : null;
}

/** What the gateway says in the chat after a command. */
export const COMMAND_REPLIES = {
  started: "Started a new session.",
  stopped: "Stopped. Your next message starts a new session.",
  nothingToStop: "There is no session to stop.",
} as const;
