/**
 * The overlap policy (spec "Overlapping messages"): what the gateway does with a
 * message that arrives while a run of its session is unfinished. Parsing of
 * `OVERLAP`, its `by_platform` and `by_chat_type` overrides (layered as
 * `SESSION_RESET` is: platform beats chat type beats the default), and the
 * effective settings of one conversation, with the layer they came from.
 */
import * as z from "zod";
import { PLATFORMS, type ChatType } from "./session-key";

export const OVERLAP_MODES = ["queue", "interrupt", "concurrent"] as const;
export type OverlapMode = (typeof OVERLAP_MODES)[number];

/** The longest debounce window: a user should not wait more than this for a run to start. */
export const MAX_DEBOUNCE_MS = 600_000;
/** The most messages one run may carry: the hand-off body stays bounded. */
export const MAX_BATCH_LIMIT = 1000;

const overlapFields = {
  mode: z.enum(OVERLAP_MODES),
  debounce_ms: z.number().int().min(0).max(MAX_DEBOUNCE_MS),
  max_batch: z.number().int().min(1).max(MAX_BATCH_LIMIT),
};
const partialOverlap = z.strictObject(overlapFields).partial();

/** The JSON shape of `OVERLAP`; every field optional, unknown keys refused at every depth. */
export const overlapConfigSchema = partialOverlap.extend({
  // Only known platforms and chat types: a misspelt one would otherwise be a silent no-op.
  by_platform: z.partialRecord(z.enum(PLATFORMS), partialOverlap).optional(),
  by_chat_type: z.partialRecord(z.enum(["dm", "group", "channel"]), partialOverlap).optional(),
});
export type OverlapConfig = z.infer<typeof overlapConfigSchema>;
type PartialOverlap = z.infer<typeof partialOverlap>;

/** Fully resolved overlap settings for one conversation. */
export interface OverlapSettings {
  mode: OverlapMode;
  /** A run starts only once this long has passed without a new message (0: at once). */
  debounce_ms: number;
  /** The most messages one run carries; more wait for the next run. */
  max_batch: number;
}

export type OverlapSource = "default" | "by_chat_type" | "by_platform";

/** The effective settings as explain shows them: with the layer they came from. */
export interface OverlapView extends OverlapSettings {
  source: OverlapSource;
}

/** The spec's default: one run at a time, no debounce, at most 20 messages a run. */
export const DEFAULT_OVERLAP: OverlapSettings = { mode: "queue", debounce_ms: 0, max_batch: 20 };

function apply(base: OverlapSettings, override: PartialOverlap | undefined): OverlapSettings {
  if (!override) return base;
  return {
    mode: override.mode ?? base.mode,
    debounce_ms: override.debounce_ms ?? base.debounce_ms,
    max_batch: override.max_batch ?? base.max_batch,
  };
}

/** The overlap settings for a conversation: platform beats chat type beats the default, field by field. */
export function resolveOverlap(config: OverlapConfig, platform: string, chatType: ChatType | string): OverlapView {
  const byPlatform = config.by_platform?.[platform as (typeof PLATFORMS)[number]];
  const byChatType = config.by_chat_type?.[chatType as ChatType];
  const settings = apply(apply(apply(DEFAULT_OVERLAP, config), byChatType), byPlatform);
  const source: OverlapSource = byPlatform ? "by_platform" : byChatType ? "by_chat_type" : "default";
  return { ...settings, source };
}
