/**
 * Discord (`POST /webhooks/discord`, the application's interactions endpoint).
 * Every request is Ed25519-signed; a malformed or wrong signature is a 401, never
 * a 5xx. PING answers PONG. An application command is one inbound message,
 * deduplicated on the interaction id: `/new`, `/reset`, `/stop` are answered in
 * the response (type 4); any other command with a text option is acknowledged
 * with a deferred response (type 5), and the reply edits it later (see `send.ts`).
 */
import type { APIInteractionResponse } from "discord-api-types/v10";
import { parseCommand } from "../../domain/commands";
import { apiError } from "../../http/errors";
import { parseJsonBytes, validationError } from "../parse";
import { settingsForSending } from "../settings";
import type { PlatformAdapter, WebhookAnswer, WebhookVerdict } from "../types";
import { FLAGS, INTERACTION, RESPONSE } from "./constants";
import {
  commandSchema,
  commandToInbound,
  DISCORD,
  interactionAttachments,
  interactionHeadSchema,
  interactionText,
} from "./interactions";
import { sendDiscord, targetOf } from "./send";
import { discordSettings, type DiscordSettings } from "./settings";
import { verifyDiscordRequest } from "./signature";

const respond = (body: APIInteractionResponse): WebhookAnswer => ({ status: 200, body });

/** A message only the invoking user sees. */
const privateNote = (content: string) =>
  respond({
    type: RESPONSE.ChannelMessageWithSource,
    data: { content, flags: FLAGS.Ephemeral },
  });

export const NO_TEXT_TEXT = "This command needs some text to send to the agent.";
export const UNSUPPORTED_TEXT = "This interaction is not supported.";
/** What a repeated command interaction is told; the first one already got the real answer. */
export const DUPLICATE_COMMAND_TEXT = "This command was already handled.";

function interaction(body: unknown): WebhookVerdict {
  const head = interactionHeadSchema.safeParse(body);
  if (!head.success) throw validationError(head.error);
  switch (head.data.type) {
    case INTERACTION.Ping:
      return { kind: "answer", answer: respond({ type: RESPONSE.Pong }) };
    case INTERACTION.ApplicationCommandAutocomplete:
      // No command the gateway knows offers choices.
      return {
        kind: "answer",
        answer: respond({ type: RESPONSE.ApplicationCommandAutocompleteResult, data: { choices: [] } }),
      };
    case INTERACTION.ApplicationCommand:
      break;
    default:
      // Buttons and modals: the gateway sends none, so any that arrive are stale or foreign.
      return { kind: "answer", answer: privateNote(UNSUPPORTED_TEXT) };
  }
  const parsed = commandSchema.safeParse(body);
  if (!parsed.success) throw validationError(parsed.error);
  const attachments = interactionAttachments(parsed.data);
  const text = interactionText(parsed.data, attachments.length);
  if (text === null) return { kind: "answer", answer: privateNote(NO_TEXT_TEXT) };
  const message = commandToInbound(parsed.data, text, attachments);
  const isCommand = parseCommand(text) !== null;
  return {
    kind: "route",
    messages: [message],
    answer: ([outcome]) => {
      if (outcome?.commandReply != null) {
        return respond({
          type: RESPONSE.ChannelMessageWithSource,
          data: { content: outcome.commandReply },
        });
      }
      if (isCommand) {
        return respond({
          type: RESPONSE.ChannelMessageWithSource,
          data: { content: DUPLICATE_COMMAND_TEXT },
        });
      }
      // The agent's reply comes later: "thinking…" now, then an edit of @original.
      return respond({ type: RESPONSE.DeferredChannelMessageWithSource });
    },
  };
}

export const discord: PlatformAdapter<DiscordSettings> = {
  name: DISCORD,
  methods: ["POST"],

  settings: (env) => discordSettings(env),

  async handle(input, settings) {
    if (!(await verifyDiscordRequest(settings, input.headers, input.rawBody))) {
      throw apiError(401, "bad_signature", "missing or invalid X-Signature-Ed25519 or X-Signature-Timestamp");
    }
    return interaction(parseJsonBytes(input.rawBody));
  },

  sender: {
    canDeliver: (target, _config, env) =>
      targetOf(target) !== null && settingsForSending("discord", discordSettings, env) !== null,
    send: (message, _config, env) => sendDiscord(message, env),
  },
};
