/**
 * What every platform's attachment download shares (src/platforms/media.ts): a
 * refusal the agent reads never repeats a credential, any 2xx is the bytes and
 * anything else a 502, and a size the platform states is checked before download.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { fetchHeaders, overLimit } from "../../src/platforms/media";

afterEach(() => vi.restoreAllMocks());

const TOKEN = "bot123:secret-token";
const URL_WITH_TOKEN = `https://files.test/file/bot${TOKEN}/photo.jpg`;

describe("fetchHeaders", () => {
  it("a failed call is refused (502) without the token that was in its URL", async () => {
    vi.spyOn(globalThis, "fetch").mockRejectedValue(new TypeError(`connect failed to ${URL_WITH_TOKEN}`));
    const result = await fetchHeaders("test download", URL_WITH_TOKEN, {}, ["", TOKEN]);
    expect(result).toEqual({
      ok: false,
      outcome: {
        ok: false,
        status: 502,
        error: "test download failed: TypeError: connect failed to https://files.test/file/bot[redacted]/photo.jpg",
      },
    });
  });

  it("any 2xx is the platform's answer, its body left unread; anything else a 502 naming the status", async () => {
    const answers: [number, () => Response][] = [
      [200, () => new Response("bytes")],
      [299, () => new Response("bytes", { status: 299 })],
      [300, () => new Response(null, { status: 300 })],
      [404, () => new Response("gone", { status: 404 })],
    ];
    const outcomes = [];
    for (const [, answer] of answers) {
      vi.spyOn(globalThis, "fetch").mockResolvedValueOnce(answer());
      const result = await fetchHeaders("test download", "https://files.test/a", {}, []);
      if (result.ok) outcomes.push(["ok", await result.response.text()]);
      else outcomes.push(result.outcome.ok ? ["refusal expected"] : [result.outcome.status, result.outcome.error]);
    }
    expect(outcomes).toEqual([
      ["ok", "bytes"],
      ["ok", "bytes"],
      [502, "test download answered HTTP 300"],
      [502, "test download answered HTTP 404"],
    ]);
  });
});

describe("overLimit", () => {
  it("refuses with 413 only a size over ATTACHMENT_MAX_BYTES, saying both", () => {
    expect(overLimit(1000, 1000)).toBeNull();
    expect(overLimit(undefined, 1000)).toBeNull();
    expect(overLimit(1001, 1000)).toEqual({
      ok: false,
      status: 413,
      error: "the attachment is 1001 bytes, over ATTACHMENT_MAX_BYTES (1000)",
    });
  });
});
