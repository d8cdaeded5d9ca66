/**
 * Bytes are what they claim (spec invariant 13): a body is decoded as strict UTF-8,
 * so invalid bytes are refused (400) instead of being replaced by U+FFFD, which
 * would make two different ids the same string (one key, one dedupe mark).
 */
import { apiError } from "./errors";

const strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/** Decodes a request body as UTF-8, or answers 400 `invalid_utf8`. */
export function decodeUtf8(bytes: ArrayBuffer | Uint8Array): string {
  try {
    return strict.decode(bytes);
  } catch {
    throw apiError(400, "invalid_utf8", "body is not valid UTF-8");
  }
}
