/**
 * What the gateway does with a message that arrives while a run of its session is
 * unfinished. The `OVERLAP` modes (queue, interrupt, debounce) are not built yet:
 * today every message is its own run at once, which is the spec's `concurrent`
 * mode, so that is what the operator is shown. The overlap work replaces this one
 * function (and `waitingMessages`) with the effective, configured policy.
 */
export interface OverlapView {
  mode: "queue" | "interrupt" | "concurrent";
  debounce_ms: number;
  max_batch: number;
  source: "default" | "by_chat_type" | "by_platform";
}

/** The overlap policy in force for a conversation of `platform` and `chatType`. */
export function effectiveOverlap(_platform: string, _chatType: string): OverlapView {
  return { mode: "concurrent", debounce_ms: 0, max_batch: 1, source: "default" };
}

/** How many stored user messages wait for a run: none today, since every message is dispatched at once. */
export function waitingMessages(): number {
  return 0;
}
