/**
 * Discord interactions, validated and turned into inbound messages. Payload
 * types come from `discord-api-types/v10` (enum values through `constants.ts`);
 * zod checks the fields read and lets the rest through.
 */
import type { APIApplicationCommandInteractionDataOption } from "discord-api-types/v10";
import * as z from "zod";
import { now } from "../../clock";
import { kindOfMime, sizeOf, stringOrNull, type InboundAttachment } from "../../domain/attachments";
import type { InboundMessage, ReplyTarget } from "../../domain/inbound";
import type { ChatType } from "../../domain/session-key";
import { apiError } from "../../http/errors";
import { CHANNEL, CONTEXT, OPTION } from "./constants";

export const DISCORD = "discord";

/** The reply coordinates of one interaction (see `send.ts`). */
export interface DiscordTarget extends ReplyTarget {
  platform: typeof DISCORD;
  application_id: string;
  /** The interaction token: valid for 15 minutes from `interaction_at`. */
  token: string;
  /** When the gateway received the interaction (ms, from `now()`). */
  interaction_at: number;
}

const snowflake = z.string().regex(/^\d{1,20}$/);

export const interactionHeadSchema = z.looseObject({ type: z.number().int() });

/** An option as read: `APIApplicationCommandInteractionDataOption`, loose about types Discord may add. */
type Option = Pick<APIApplicationCommandInteractionDataOption, "name"> & {
  type: number;
  value?: unknown;
  options?: Option[];
};

const optionSchema: z.ZodType<Option> = z.looseObject({
  name: z.string(),
  type: z.number().int(),
  value: z.unknown().optional(),
  get options() {
    return z.array(optionSchema).optional();
  },
});

const userSchema = z.looseObject({ id: snowflake });

/** The fields read from an application command interaction (`APIApplicationCommandInteraction`). */
export const commandSchema = z.looseObject({
  id: snowflake,
  application_id: snowflake,
  token: z.string().min(1).max(1024),
  guild_id: snowflake.optional(),
  channel_id: snowflake.optional(),
  channel: z.looseObject({ id: snowflake, type: z.number().int(), parent_id: snowflake.nullish() }).optional(),
  member: z.looseObject({ user: userSchema }).optional(),
  user: userSchema.optional(),
  context: z.number().int().optional(),
  data: z.looseObject({
    name: z.string().min(1).max(64),
    options: z.array(optionSchema).optional(),
    resolved: z
      .looseObject({
        // `APIAttachment`: what an attachment option's value (its id) stands for.
        attachments: z
          .record(
            z.string(),
            z.looseObject({
              id: snowflake,
              filename: z.string().optional(),
              content_type: z.string().optional(),
              size: z.number().optional(),
              url: z.url({ protocol: /^https?$/ }),
            }),
          )
          .optional(),
      })
      .optional(),
  }),
});

export type CommandInteraction = z.infer<typeof commandSchema>;

/** Application commands the gateway answers itself. */
export const GATEWAY_COMMANDS = new Set(["new", "reset", "stop"]);

const THREAD_TYPES = new Set<number>([CHANNEL.AnnouncementThread, CHANNEL.PublicThread, CHANNEL.PrivateThread]);

/**
 * The first option of type STRING, whatever its name, looking inside
 * subcommands and subcommand groups in order.
 */
export function firstStringOption(options: readonly Option[] | undefined): string | null {
  for (const option of options ?? []) {
    if (option.type === OPTION.String && typeof option.value === "string") return option.value;
    if (option.type === OPTION.Subcommand || option.type === OPTION.SubcommandGroup) {
      const nested = firstStringOption(option.options);
      if (nested !== null) return nested;
    }
  }
  return null;
}

/** The values (attachment ids) of every ATTACHMENT option, in order, inside subcommands too. */
export function attachmentOptionIds(options: readonly Option[] | undefined): string[] {
  const ids: string[] = [];
  for (const option of options ?? []) {
    if (option.type === OPTION.Attachment && typeof option.value === "string") ids.push(option.value);
    if (option.type === OPTION.Subcommand || option.type === OPTION.SubcommandGroup) {
      ids.push(...attachmentOptionIds(option.options));
    }
  }
  return ids;
}

/** Each attachment option of a command, resolved through `data.resolved.attachments`. */
export function interactionAttachments(interaction: CommandInteraction): InboundAttachment[] {
  const resolved = interaction.data.resolved?.attachments ?? {};
  return attachmentOptionIds(interaction.data.options).flatMap((id) => {
    const file = Object.hasOwn(resolved, id) ? resolved[id] : undefined;
    if (!file) throw apiError(400, "invalid_body", `data.resolved.attachments.${id} is required for this option`);
    const mimeType = stringOrNull(file.content_type);
    return [
      {
        kind: kindOfMime(mimeType),
        mimeType,
        name: stringOrNull(file.filename),
        size: sizeOf(file.size),
        source: { platform: DISCORD, ref: file.url },
      },
    ];
  });
}

/**
 * The text an interaction stands for: `/new` etc. for the gateway's commands, else
 * its first string option; "" when it has none but carries attachments; null when
 * it has neither (nothing to hand over).
 */
export function interactionText(interaction: CommandInteraction, attachmentCount = 0): string | null {
  const name = interaction.data.name.toLowerCase();
  if (GATEWAY_COMMANDS.has(name)) return `/${name}`;
  const text = firstStringOption(interaction.data.options);
  if (text !== null && text.trim() !== "") return text;
  return attachmentCount > 0 ? "" : null;
}

interface Conversation {
  chatType: ChatType;
  chatId: string;
  userId: string;
  threadId: string | null;
}

const missing = (what: string) => apiError(400, "invalid_body", `${what} is required for this interaction`);

/**
 * Where an interaction was used:
 * - in a guild: `channel` keyed by channel (and user); in a thread, the parent
 *   channel with the thread as thread id;
 * - in the app's DM (no `guild_id`): `dm` keyed by the user;
 * - in a group DM or another user's DM (user-installed apps, context
 *   PRIVATE_CHANNEL): `group` keyed by that channel (and user), so it never
 *   shares a session with the user's DM with the app.
 */
export function conversationOf(interaction: CommandInteraction): Conversation {
  const channelId = interaction.channel?.id ?? interaction.channel_id ?? null;
  if (interaction.guild_id) {
    const userId = interaction.member?.user.id;
    if (!userId) throw missing("member.user.id");
    if (!channelId) throw missing("channel_id");
    const channel = interaction.channel;
    if (channel && THREAD_TYPES.has(channel.type) && channel.parent_id) {
      return { chatType: "channel", chatId: channel.parent_id, userId, threadId: channel.id };
    }
    return { chatType: "channel", chatId: channelId, userId, threadId: null };
  }
  const userId = interaction.user?.id ?? interaction.member?.user.id;
  if (!userId) throw missing("user.id");
  if (interaction.context === CONTEXT.PrivateChannel && channelId) {
    return { chatType: "group", chatId: channelId, userId, threadId: null };
  }
  return { chatType: "dm", chatId: userId, userId, threadId: null };
}

/** Discord's epoch (2015-01-01) in ms; a snowflake's top 42 bits are ms since then. */
const DISCORD_EPOCH = 1_420_070_400_000n;

export function snowflakeTime(id: string): number | null {
  try {
    return Number((BigInt(id) >> 22n) + DISCORD_EPOCH);
  } catch {
    return null;
  }
}

export function commandToInbound(
  interaction: CommandInteraction,
  text: string,
  attachments: InboundAttachment[] = [],
): InboundMessage {
  const conversation = conversationOf(interaction);
  const replyTo: DiscordTarget = {
    platform: DISCORD,
    application_id: interaction.application_id,
    token: interaction.token,
    interaction_at: now(),
    // The interaction response itself answers commands (type 4), so the routing
    // object must not send the command's answer again through the API.
    answersCommandsInline: true,
  };
  return {
    platform: DISCORD,
    eventId: interaction.id,
    ...conversation,
    text,
    attachments,
    sentAt: snowflakeTime(interaction.id),
    replyTo,
  };
}
