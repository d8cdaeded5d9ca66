/**
 * Slack (`POST /webhooks/slack`): the Events API and slash commands on one route.
 * Every request is v0-signed (checked over the raw bytes, within five minutes of
 * our clock). A user's new `message` becomes an inbound message deduplicated on
 * the envelope's `event_id`; `/new`, `/reset` and `/stop` slash commands are
 * routed too (deduplicated on `trigger_id`) and answered in the HTTP response.
 * Events are acknowledged with 200 `{}` as soon as they are stored, well within
 * Slack's 3 seconds; replies go out later through `chat.postMessage`.
 */
import { log } from "../../log";
import { apiError } from "../../http/errors";
import { parseJsonBytes, validationError } from "../parse";
import { settingsForSending } from "../settings";
import type { PlatformAdapter, WebhookAnswer, WebhookVerdict } from "../types";
import {
  chatTypeOf,
  eventCallbackSchema,
  envelopeSchema,
  formFields,
  GATEWAY_COMMANDS,
  messageHeadSchema,
  messageToInbound,
  ownBotUsers,
  parseUserMessage,
  SLACK,
  slashCommandSchema,
  slashToInbound,
  slackAttachments,
  SLACKBOT_USER,
  urlVerificationSchema,
  USER_SUBTYPES,
} from "./events";
import { sendSlack } from "./send";
import { slackSettings, type SlackSettings } from "./settings";
import { verifySlackRequest } from "./signature";

/** The Events API acknowledgement: any 200 will do; Slack ignores the body. */
const ACK: WebhookAnswer = { status: 200, body: {} };
const ignore = (): WebhookVerdict => ({ kind: "answer", answer: ACK });

const ephemeral = (text: string): WebhookAnswer => ({ status: 200, body: { response_type: "ephemeral", text } });

/** What a repeated slash command (same `trigger_id`) is told; the first one already got the real answer. */
export const DUPLICATE_COMMAND_TEXT = "This command was already handled.";
export const UNKNOWN_COMMAND_TEXT = "Unknown command";

function slashCommand(fields: Record<string, string>): WebhookVerdict {
  // Interactivity payloads (buttons, modals) are form-encoded too, with one `payload`
  // field; the gateway sends none, so any that arrive are acknowledged and dropped.
  // Slack's certificate check of a slash command URL (`ssl_check=1`) only wants a 200.
  if (fields.command === undefined && (fields.payload !== undefined || fields.ssl_check === "1"))
    return { kind: "answer", answer: { status: 200, body: undefined } };
  const parsed = slashCommandSchema.safeParse(fields);
  if (!parsed.success) throw validationError(parsed.error);
  if (!GATEWAY_COMMANDS.has(parsed.data.command.toLowerCase())) {
    return { kind: "answer", answer: ephemeral(UNKNOWN_COMMAND_TEXT) };
  }
  return {
    kind: "route",
    messages: [slashToInbound(parsed.data)],
    answer: ([outcome]) => ephemeral(outcome?.commandReply ?? DUPLICATE_COMMAND_TEXT),
  };
}

function eventRequest(body: unknown): WebhookVerdict {
  const envelope = envelopeSchema.safeParse(body);
  if (!envelope.success) throw validationError(envelope.error);
  if (envelope.data.type === "url_verification") {
    const challenge = urlVerificationSchema.safeParse(body);
    if (!challenge.success) throw validationError(challenge.error);
    return { kind: "answer", answer: { status: 200, body: { challenge: challenge.data.challenge } } };
  }
  // `app_rate_limited` and any future envelope type: acknowledged, nothing to route.
  if (envelope.data.type !== "event_callback") return ignore();
  const callback = eventCallbackSchema.safeParse(body);
  if (!callback.success) throw validationError(callback.error);
  const { event } = callback.data;
  // Only `message` events carry a conversation turn; `app_mention` duplicates a
  // channel message the app also receives as `message`, and the rest are not chat.
  if (event.type !== "message") return ignore();
  const head = messageHeadSchema.safeParse(event);
  if (!head.success) throw validationError(head.error);
  // Other subtypes are not a user's new message: bot_message, message_changed (edits),
  // message_deleted, joins, topic changes...
  if ((head.data.subtype && !USER_SUBTYPES.has(head.data.subtype)) || head.data.bot_id) return ignore();
  // Slackbot's notices in a DM are not the user's; answering them talks to Slackbot.
  if (head.data.user === SLACKBOT_USER) return ignore();
  // Our own posts come back as events too; answering them would loop.
  if (head.data.user && ownBotUsers(callback.data).has(head.data.user)) return ignore();
  const message = parseUserMessage(event);
  if (!message.success) throw validationError(message.error);
  const chatType = chatTypeOf(message.data.channel_type);
  if (!chatType) {
    log.warn("slack: ignoring a message with an unknown channel_type", { channel_type: message.data.channel_type });
    return ignore();
  }
  // The text of a file share is the comment the user wrote with the files.
  const text = (message.data.text ?? "").trim() === "" ? "" : message.data.text!;
  const attachments = slackAttachments(message.data.files);
  if (text === "" && attachments.length === 0) return ignore();
  return {
    kind: "route",
    messages: [messageToInbound(callback.data.event_id, message.data, chatType, text, attachments)],
    answer: () => ACK,
  };
}

export const slack: PlatformAdapter<SlackSettings> = {
  name: SLACK,
  methods: ["POST"],

  settings: (env) => slackSettings(env),

  async handle(input, settings) {
    if (!(await verifySlackRequest(settings.signingSecret, input.headers, input.rawBody))) {
      throw apiError(401, "bad_signature", "missing or invalid X-Slack-Signature or X-Slack-Request-Timestamp");
    }
    const contentType = input.headers.get("content-type") ?? "";
    if (/^application\/x-www-form-urlencoded\b/i.test(contentType)) return slashCommand(formFields(input.rawBody));
    return eventRequest(parseJsonBytes(input.rawBody));
  },

  sender: {
    canDeliver: (target, _config, env) =>
      typeof target.channel === "string" && settingsForSending("slack", slackSettings, env) !== null,
    send: (message, _config, env) => sendSlack(message, env),
  },
};
