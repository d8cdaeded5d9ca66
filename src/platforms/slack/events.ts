/**
 * What Slack POSTs to `/webhooks/slack`, validated and turned into inbound
 * messages: Events API envelopes (JSON) and slash commands (form-encoded). The
 * message event's fields are typed by `@slack/types`; Slack's envelope and
 * slash-command shapes are not in that package, so zod describes them.
 */
import type { GenericMessageEvent } from "@slack/types";
import * as z from "zod";
import { kindOfMime, sizeOf, stringOrNull, type InboundAttachment } from "../../domain/attachments";
import type { InboundMessage, ReplyTarget } from "../../domain/inbound";
import type { ChatType } from "../../domain/session-key";
import { apiError } from "../../http/errors";
import { decodeUtf8 } from "../../http/utf8";

export const SLACK = "slack";

/** The reply coordinates of a Slack conversation (see `send.ts`). */
export interface SlackTarget extends ReplyTarget {
  platform: typeof SLACK;
  channel: string;
  thread_ts?: string;
}

// ------------------------------------------------------------------ Events API

export const envelopeSchema = z.looseObject({ type: z.string().min(1) });

export const urlVerificationSchema = z.looseObject({
  type: z.literal("url_verification"),
  challenge: z.string().min(1),
});

export const eventCallbackSchema = z.looseObject({
  type: z.literal("event_callback"),
  event_id: z.string().min(1).max(256),
  event: z.looseObject({ type: z.string().min(1) }),
  authorizations: z.array(z.looseObject({ user_id: z.string().nullish(), is_bot: z.boolean().nullish() })).nullish(),
});

/**
 * Subtypes that are still a user's new message: a file shared with an optional
 * comment, a thread reply also sent to the channel, and `/me` text. Every other
 * subtype (bot_message, message_changed, message_deleted, joins, topic changes…)
 * is not a turn.
 */
export const USER_SUBTYPES = new Set(["file_share", "thread_broadcast", "me_message"]);

/** Slackbot's own notices in a DM come as its user id, without a `bot_id`. */
export const SLACKBOT_USER = "USLACKBOT";

const fileSchema = z.looseObject({
  id: z.string().min(1).max(256),
  name: z.string().nullish(),
  title: z.string().nullish(),
  mimetype: z.string().nullish(),
  size: z.number().nullish(),
  mode: z.string().nullish(),
  subtype: z.string().nullish(),
  url_private: z.string().nullish(),
  url_private_download: z.string().nullish(),
});

const filesSchema = z.array(fileSchema).optional();

/**
 * The media of a message: each of `files` except deleted ones (`mode: "tombstone"`).
 * Slack's audio clips (`subtype: "slack_audio"`) are voice notes. A file Slack gives
 * no download URL for (an external or hidden one) is still listed; fetching it is a 502.
 */
export function slackAttachments(files: z.infer<typeof filesSchema>): InboundAttachment[] {
  return (files ?? [])
    .filter((file) => file.mode !== "tombstone")
    .map((file) => {
      const mimeType = stringOrNull(file.mimetype);
      return {
        kind: file.subtype === "slack_audio" ? "voice" : kindOfMime(mimeType),
        mimeType,
        name: stringOrNull(file.name) ?? stringOrNull(file.title),
        size: sizeOf(file.size),
        source: { platform: SLACK, ref: file.url_private_download ?? file.url_private ?? "" },
      };
    });
}

/** Enough of any `message` event to tell a user's own new message from everything else. */
export const messageHeadSchema = z.looseObject({
  subtype: z.string().nullish(),
  bot_id: z.string().nullish(),
  user: z.string().nullish(),
});

/** The fields read from a user's message (`GenericMessageEvent`, no subtype). */
type UserMessageFields = Pick<GenericMessageEvent, "channel" | "user" | "text" | "ts" | "thread_ts"> & {
  channel_type: string;
};

const userMessageSchema = z.looseObject({
  channel: z.string().min(1).max(256),
  user: z.string().min(1).max(256),
  channel_type: z.string(),
  text: z.string().optional(),
  ts: z.string().regex(/^\d+(\.\d+)?$/),
  thread_ts: z.string().min(1).max(256).optional(),
  files: filesSchema,
});

export function parseUserMessage(event: unknown) {
  return userMessageSchema.safeParse(event) as z.ZodSafeParseResult<
    UserMessageFields & { files?: z.infer<typeof filesSchema> }
  >;
}

/**
 * `channel_type` → chat type: a DM (and the app's Messages tab, `app_home`, which
 * is the same DM) is `dm`; a multi-person DM is `group`; public and private
 * channels are `channel`.
 */
export const CHAT_TYPE_OF: Record<GenericMessageEvent["channel_type"], ChatType> = {
  im: "dm",
  app_home: "dm",
  mpim: "group",
  channel: "channel",
  group: "channel",
};

export function chatTypeOf(channelType: string): ChatType | null {
  return Object.hasOwn(CHAT_TYPE_OF, channelType)
    ? CHAT_TYPE_OF[channelType as GenericMessageEvent["channel_type"]]
    : null;
}

/** Slack's `ts` ("1700000000.000100", seconds) in milliseconds. */
export function tsToMs(ts: string): number | null {
  const seconds = Number(ts);
  return Number.isFinite(seconds) ? Math.round(seconds * 1000) : null;
}

/** The app's own bot user ids, from the envelope's `authorizations` (user-token grants excluded). */
export function ownBotUsers(envelope: z.infer<typeof eventCallbackSchema>): Set<string> {
  const ids = (envelope.authorizations ?? [])
    .filter((grant) => grant.is_bot !== false)
    .map((grant) => grant.user_id)
    .filter((id): id is string => typeof id === "string" && id !== "");
  return new Set(ids);
}

export function messageToInbound(
  eventId: string,
  message: UserMessageFields,
  chatType: ChatType,
  text: string,
  attachments: InboundAttachment[] = [],
): InboundMessage {
  const threadTs = message.thread_ts ?? null;
  const replyTo: SlackTarget = { platform: SLACK, channel: message.channel };
  if (threadTs) replyTo.thread_ts = threadTs;
  return {
    platform: SLACK,
    eventId,
    chatId: message.channel,
    chatType,
    userId: message.user,
    threadId: threadTs,
    text,
    attachments,
    sentAt: tsToMs(message.ts),
    replyTo,
  };
}

// ------------------------------------------------------------ slash commands

export const slashCommandSchema = z.looseObject({
  command: z.string().regex(/^\/\S+$/),
  text: z.string().optional(),
  user_id: z.string().min(1).max(256),
  channel_id: z.string().min(1).max(256),
  channel_name: z.string().optional(),
  trigger_id: z.string().min(1).max(256),
  team_id: z.string().optional(),
  response_url: z.string().optional(),
});

export type SlashCommand = z.infer<typeof slashCommandSchema>;

/** The slash commands the gateway answers; any other is "Unknown command". */
export const GATEWAY_COMMANDS = new Set(["/new", "/reset", "/stop"]);

/**
 * The chat type of the conversation a slash command was typed in, chosen so the
 * command lands on the same session key as that conversation's messages: DM
 * channel ids start with `D`; a multi-person DM is named `mpdm-…`; anything else
 * is a channel (public or private).
 */
export function slashChatType(command: SlashCommand): ChatType {
  if (command.channel_id.startsWith("D")) return "dm";
  if (command.channel_name?.startsWith("mpdm-")) return "group";
  return "channel";
}

export function slashToInbound(command: SlashCommand): InboundMessage {
  const replyTo: SlackTarget = { platform: SLACK, channel: command.channel_id, answersCommandsInline: true };
  return {
    platform: SLACK,
    eventId: `cmd:${command.trigger_id}`,
    chatId: command.channel_id,
    chatType: slashChatType(command),
    userId: command.user_id,
    threadId: null,
    text: command.command.toLowerCase(),
    sentAt: null,
    replyTo,
  };
}

/**
 * Form fields of an `application/x-www-form-urlencoded` body, as a plain object.
 * Strict: invalid UTF-8, raw or percent-encoded, is a 400 (URLSearchParams would
 * replace it with U+FFFD, and two different ids would become one).
 */
export function formFields(raw: ArrayBuffer): Record<string, string> {
  const fields: Record<string, string> = {};
  const decode = (part: string) => {
    try {
      return decodeURIComponent(part.replace(/\+/g, " "));
    } catch {
      throw apiError(400, "invalid_utf8", "form body is not valid UTF-8");
    }
  };
  for (const pair of decodeUtf8(raw).split("&")) {
    if (pair === "") continue;
    const at = pair.indexOf("=");
    const name = decode(at === -1 ? pair : pair.slice(0, at));
    fields[name] = decode(at === -1 ? "" : pair.slice(at + 1));
  }
  return fields;
}
