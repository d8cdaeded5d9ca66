/**
 * What every platform's attachment download shares (src/platforms/media.ts): a
 * refusal the agent reads never repeats a credential, any 2xx is the bytes and
 * anything else a 502, a platform gets 15 s to answer with headers (fake timers)
 * and then streams without a deadline, and a size the platform states is checked
 * before download.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { MEDIA_HEADERS_TIMEOUT_MS, fetchHeaders, overLimit } from "../../src/platforms/media";

afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
});

/** A platform that never answers, and rejects as fetch does when the caller aborts. */
function silentPlatform(): void {
  vi.spyOn(globalThis, "fetch").mockImplementation(
    (_input, init) =>
      new Promise<Response>((_resolve, reject) => {
        init?.signal?.addEventListener("abort", () => reject(init.signal!.reason));
      }),
  );
}

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

describe("the wait for a platform's headers", () => {
  it("refuses (502) a platform that sends no headers within 15 s, not before", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    silentPlatform();
    let settled = false;
    const result = fetchHeaders("test download", "https://files.test/a", {}, []).finally(() => (settled = true));
    await vi.advanceTimersByTimeAsync(MEDIA_HEADERS_TIMEOUT_MS - 1);
    expect(settled).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    expect(await result).toEqual({
      ok: false,
      outcome: { ok: false, status: 502, error: "test download failed: Error: timed out" },
    });
  });

  it("does not cut a download whose headers came in time while its body still streams past 15 s", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    let signal: AbortSignal | undefined;
    vi.spyOn(globalThis, "fetch").mockImplementation(async (_input, init) => {
      signal = init?.signal ?? undefined;
      return new Response("first part, then the rest much later");
    });
    const result = await fetchHeaders("test download", "https://files.test/a", {}, []);
    await vi.advanceTimersByTimeAsync(MEDIA_HEADERS_TIMEOUT_MS * 4);
    // Aborting the call's signal would cut the body a real fetch is still streaming.
    expect(signal?.aborted).toBe(false);
    expect(result.ok).toBe(true);
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
