/**
 * The few `discord-api-types/v10` enum values the adapter needs at run time.
 *
 * The package ships CommonJS behind a thin ESM wrapper, and in the vitest workers
 * pool (workerd's module runner) its named runtime exports come through as
 * `undefined`, so `InteractionType.Ping` would crash at import. The values are
 * therefore declared here, and `satisfies` checks each one against the package's
 * own enum member at compile time: a wrong number does not type-check.
 */
import type {
  ApplicationCommandOptionType,
  ChannelType,
  InteractionContextType,
  InteractionResponseType,
  InteractionType,
  MessageFlags,
} from "discord-api-types/v10";

/** Each key must name a member of enum `E`, with exactly that member's value. */
type Members<E extends Record<string, string | number>> = Partial<{ [K in keyof E]: E[K] }>;

export const INTERACTION = {
  Ping: 1,
  ApplicationCommand: 2,
  MessageComponent: 3,
  ApplicationCommandAutocomplete: 4,
  ModalSubmit: 5,
} as const satisfies Members<typeof InteractionType>;

export const RESPONSE = {
  Pong: 1,
  ChannelMessageWithSource: 4,
  DeferredChannelMessageWithSource: 5,
  ApplicationCommandAutocompleteResult: 8,
} as const satisfies Members<typeof InteractionResponseType>;

export const OPTION = {
  Subcommand: 1,
  SubcommandGroup: 2,
  String: 3,
  Attachment: 11,
} as const satisfies Members<typeof ApplicationCommandOptionType>;

export const CHANNEL = {
  AnnouncementThread: 10,
  PublicThread: 11,
  PrivateThread: 12,
} as const satisfies Members<typeof ChannelType>;

export const CONTEXT = {
  Guild: 0,
  BotDM: 1,
  PrivateChannel: 2,
} as const satisfies Members<typeof InteractionContextType>;

export const FLAGS = {
  Ephemeral: 64,
} as const satisfies Members<typeof MessageFlags>;
