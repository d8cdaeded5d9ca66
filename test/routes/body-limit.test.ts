/**
 * A webhook body over the size limit is answered 413 and the rest of it is read
 * and discarded (bounded), so the connection is left clean for the next request;
 * a body far over the limit is cancelled. Chunked bodies (no content-length)
 * included. Under `wrangler dev` an unread rest broke concurrent valid requests.
 */
import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { DRAIN_MAX_BYTES, drain } from "../../src/routes/body-limit";
import { WEBHOOK_MAX_BYTES } from "../../src/routes/webhooks";
import { BASE, signedRequest, tableCounts, unique } from "../helpers";

const CHUNK = 16 * 1024;

/** A chunked body of `chunks` chunks that records how far it was read and whether it was cancelled. */
function trackedBody(chunks: number) {
  const state = { pulled: 0, closed: false, cancelled: false };
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (state.pulled === chunks) {
        state.closed = true;
        controller.close();
        return;
      }
      state.pulled += 1;
      controller.enqueue(new Uint8Array(CHUNK).fill(0x61));
    },
    cancel() {
      state.cancelled = true;
    },
  });
  return { stream, state };
}

describe("a body over the size limit", () => {
  it("chunked: answered 413, the rest read to its end, nothing stored", async () => {
    const before = await tableCounts();
    const chunks = Math.ceil((WEBHOOK_MAX_BYTES * 2) / CHUNK);
    const { stream, state } = trackedBody(chunks);
    const response = await exports.default.fetch(
      new Request(`${BASE}/webhooks/generic`, { method: "POST", body: stream, duplex: "half" } as RequestInit),
    );
    expect(response.status).toBe(413);
    expect(((await response.json()) as any).error.code).toBe("payload_too_large");
    expect(state.pulled).toBe(chunks);
    expect(state.closed).toBe(true);
    expect(await tableCounts()).toEqual(before);
  });

  it("the next request after it is served normally", async () => {
    const { stream } = trackedBody(Math.ceil((WEBHOOK_MAX_BYTES * 2) / CHUNK));
    const big = exports.default.fetch(
      new Request(`${BASE}/webhooks/generic`, { method: "POST", body: stream, duplex: "half" } as RequestInit),
    );
    const body = JSON.stringify({
      event_id: unique("e"),
      chat_id: unique("c"),
      chat_type: "dm",
      user_id: "u",
      text: "hi",
    });
    const [refused, fine] = await Promise.all([big, exports.default.fetch(await signedRequest(body))]);
    expect(refused.status).toBe(413);
    expect(fine.status).toBe(200);
  });

  it("a body far over the limit is cancelled after DRAIN_MAX_BYTES rather than read without end", async () => {
    const chunks = Math.ceil((DRAIN_MAX_BYTES * 4) / CHUNK);
    const { stream, state } = trackedBody(chunks);
    await drain(stream.getReader());
    expect(state.cancelled).toBe(true);
    expect(state.pulled * CHUNK).toBeLessThanOrEqual(DRAIN_MAX_BYTES + 2 * CHUNK);
    expect(state.pulled).toBeLessThan(chunks);
  });
});
