/**
 * Splitting a reply that is longer than a platform accepts in one message, so a
 * long answer arrives in parts instead of being refused whole (Telegram answers
 * 400 "message is too long" past 4,096 characters).
 */

/**
 * Splits `text` into parts of at most `limit` UTF-16 code units, preferring to cut
 * after a newline in the second half of a part, and never inside a surrogate pair.
 */
export function splitText(text: string, limit: number): string[] {
  const parts: string[] = [];
  let rest = text;
  while (rest.length > limit) {
    let cut = rest.lastIndexOf("\n", limit - 1) + 1;
    if (cut < limit / 2) cut = limit;
    const code = rest.charCodeAt(cut - 1);
    if (code >= 0xd800 && code <= 0xdbff) cut -= 1; // keep a surrogate pair together
    parts.push(rest.slice(0, cut));
    rest = rest.slice(cut);
  }
  parts.push(rest);
  return parts;
}
