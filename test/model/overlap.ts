/**
 * `OVERLAP` as the spec words it, written again for the model (it imports nothing
 * from src/): platform beats chat type beats the default, field by field; the
 * default is `queue`, no debounce, at most 20 messages a run.
 */
import type { ChatType } from "./policy";

export type OverlapMode = "queue" | "interrupt" | "concurrent";

export interface OverlapFields {
  mode?: OverlapMode;
  debounce_ms?: number;
  max_batch?: number;
}

/** The JSON of `OVERLAP`. */
export interface OverlapJson extends OverlapFields {
  by_platform?: Record<string, OverlapFields>;
  by_chat_type?: Partial<Record<ChatType, OverlapFields>>;
}

export interface OverlapSettings {
  mode: OverlapMode;
  debounceMs: number;
  maxBatch: number;
}

const DEFAULT: OverlapSettings = { mode: "queue", debounceMs: 0, maxBatch: 20 };

function layer(base: OverlapSettings, over: OverlapFields | undefined): OverlapSettings {
  if (!over) return base;
  return {
    mode: over.mode ?? base.mode,
    debounceMs: over.debounce_ms ?? base.debounceMs,
    maxBatch: over.max_batch ?? base.maxBatch,
  };
}

export function overlapFor(config: OverlapJson, platform: string, chatType: ChatType): OverlapSettings {
  return layer(layer(layer(DEFAULT, config), config.by_chat_type?.[chatType]), config.by_platform?.[platform]);
}
