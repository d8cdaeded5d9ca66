/**
 * The transcript carried by `session.finalized`: the session's messages, oldest
 * first, bounded so that a very long session cannot produce an event no hook
 * receiver accepts. When the bounds cut it, the newest messages are kept (they
 * are what a memory service most needs) and `truncated` says so.
 */
export const TRANSCRIPT_MAX_MESSAGES = 500;
export const TRANSCRIPT_MAX_BYTES = 256 * 1024;

export interface TranscriptLine {
  role: string;
  text: string;
  at: number;
}

const encoder = new TextEncoder();

export function boundTranscript(all: readonly TranscriptLine[]): { transcript: TranscriptLine[]; truncated: boolean } {
  const kept: TranscriptLine[] = [];
  let bytes = 0;
  for (let i = all.length - 1; i >= 0 && kept.length < TRANSCRIPT_MAX_MESSAGES; i--) {
    const line = all[i]!;
    const size = encoder.encode(line.text).length;
    if (bytes + size > TRANSCRIPT_MAX_BYTES) break;
    bytes += size;
    kept.push(line);
  }
  kept.reverse();
  return { transcript: kept, truncated: kept.length < all.length };
}
