/**
 * A long reply arrives in parts (Telegram and WhatsApp take 4,096 characters a
 * message, Discord 2,000): each part fits, nothing is lost but the line break a
 * part ends at, and no part breaks a character in two (an emoji's surrogate pair).
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { splitText } from "../../src/platforms/text";

const LIMIT = 10;
const isHigh = (code: number) => code >= 0xd800 && code <= 0xdbff;
/** Parts as code units: a failure never has to print half a surrogate pair. */
const units = (parts: string[]) =>
  parts.map((part) => Array.from({ length: part.length }, (_, i) => part.charCodeAt(i)));
const splitUnits = (text: string, limit: number) => units(splitText(text, limit));

describe("splitText", () => {
  it("keeps a text of exactly the limit whole", () => {
    expect(splitText("a".repeat(LIMIT), LIMIT)).toEqual(["a".repeat(LIMIT)]);
    expect(splitText("a".repeat(LIMIT + 1), LIMIT)).toEqual(["a".repeat(LIMIT), "a"]);
  });

  it("splits at the last line break in the second half of a part, dropping it", () => {
    // The break at index 5 is exactly half the limit: the part ends there.
    expect(splitText("aaaaa\nbbbbbbbb", LIMIT)).toEqual(["aaaaa", "bbbbbbbb"]);
    // A break in the first half is ignored: the part is cut at the limit.
    expect(splitText("aaaa\nbbbbbbbbb", LIMIT)).toEqual(["aaaa\nbbbbb", "bbbb"]);
  });

  it("never cuts between the two halves of a surrogate pair", () => {
    const emoji = "\u{1F600}"; // two code units: 0xd83d 0xde00
    const text = "a".repeat(LIMIT - 1) + emoji + "b";
    expect(splitUnits(text, LIMIT)).toEqual(units(["a".repeat(LIMIT - 1), emoji + "b"]));
    // The first and last high surrogates (0xd800, 0xdbff) are kept with their pair too.
    for (const pair of ["\ud800\udc00", "\udbff\udfff"]) {
      expect(splitUnits("a".repeat(LIMIT - 1) + pair, LIMIT)).toEqual(units(["a".repeat(LIMIT - 1), pair]));
    }
    // A low surrogate at the cut ends its pair: the cut stays at the limit.
    expect(splitUnits("a".repeat(LIMIT - 2) + emoji + "b", LIMIT)).toEqual(units(["a".repeat(LIMIT - 2) + emoji, "b"]));
  });

  it("every part fits, none ends inside a pair, and the parts give back the text", () => {
    const piece = fc.constantFrom("a", "b", "\n", "\u{1F600}", "é");
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 60 }), fc.integer({ min: 4, max: 20 }), (pieces, limit) => {
        const text = pieces.join("");
        const parts = splitText(text, limit);
        for (const part of parts) {
          expect(part.length).toBeLessThanOrEqual(limit);
          expect(isHigh(part.charCodeAt(part.length - 1))).toBe(false);
        }
        // Nothing but the line breaks parts end at is lost: at most one between two parts.
        const joined = parts.join("");
        expect(units([joined.replace(/\n/g, "")])).toEqual(units([text.replace(/\n/g, "")]));
        const lost = text.split("\n").length - joined.split("\n").length;
        expect(lost).toBeGreaterThanOrEqual(0);
        expect(lost).toBeLessThanOrEqual(parts.length - 1);
      }),
      { seed: 20261202, numRuns: 200 },
    );
  });
});
