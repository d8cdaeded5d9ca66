/**
 * Splitting a reply that is longer than a platform accepts in one message, so a
 * long answer arrives in parts instead of being refused whole (Telegram and
 * WhatsApp stop at 4,096 characters, Discord at 2,000).
 */

const isHighSurrogate = (code: number) => code >= 0xd800 && code <= 0xdbff;

/**
 * Splits `text` into parts of at most `limit` UTF-16 code units: at the last line
 * break in the second half of a part when there is one (the break itself is
 * dropped: the next message starts on a new line anyway), else at the limit, and
 * never inside a surrogate pair.
 */
export function splitText(text: string, limit: number): string[] {
  const parts: string[] = [];
  let rest = text;
  while (rest.length > limit) {
    const newline = rest.lastIndexOf("\n", limit);
    if (newline >= limit / 2) {
      parts.push(rest.slice(0, newline));
      rest = rest.slice(newline + 1);
      continue;
    }
    const cut = isHighSurrogate(rest.charCodeAt(limit - 1)) ? limit - 1 : limit;
    parts.push(rest.slice(0, cut));
    rest = rest.slice(cut);
  }
  parts.push(rest);
  return parts;
}
