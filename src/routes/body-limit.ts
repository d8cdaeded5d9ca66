/**
 * A webhook body size limit that leaves the connection clean. Hono's `bodyLimit`
 * answers 413 as soon as a chunked body passes the limit and leaves the rest of the
 * request unread; under `wrangler dev` an unread request body broke other requests
 * sharing the connection (3 of 120 concurrent valid requests answered 503). Here the
 * rest is read and thrown away, up to DRAIN_MAX_BYTES, and only a body longer than
 * that is cancelled (which closes the connection rather than reading without end).
 */
import type { Context, MiddlewareHandler } from "hono";

/** How much of an oversized body is read and discarded before it is cancelled instead. */
export const DRAIN_MAX_BYTES = 4 * 1024 * 1024;

/** Reads and discards the rest of a body (bounded), then releases or cancels it. */
export async function drain(reader: ReadableStreamDefaultReader<Uint8Array>, limit = DRAIN_MAX_BYTES): Promise<void> {
  let read = 0;
  try {
    while (read <= limit) {
      const { done, value } = await reader.read();
      if (done) return;
      read += value.byteLength;
    }
    await reader.cancel("request body too large");
  } catch {
    // The client went away: nothing left to drain.
  } finally {
    reader.releaseLock();
  }
}

export function bodyLimit(options: { maxSize: number; onError: (c: Context) => Response }): MiddlewareHandler {
  const { maxSize, onError } = options;
  return async (c, next) => {
    const body = c.req.raw.body;
    if (!body) return next();
    const declared = c.req.raw.headers.get("content-length");
    if (declared !== null && !c.req.raw.headers.has("transfer-encoding")) {
      if (parseInt(declared, 10) <= maxSize) return next();
      await drain(body.getReader());
      return onError(c);
    }
    const reader = body.getReader();
    const chunks: Uint8Array[] = [];
    let size = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > maxSize) {
        await drain(reader);
        return onError(c);
      }
      chunks.push(value);
    }
    const whole = new Uint8Array(size);
    let offset = 0;
    for (const chunk of chunks) {
      whole.set(chunk, offset);
      offset += chunk.byteLength;
    }
    c.req.raw = new Request(c.req.raw, { body: whole });
    return next();
  };
}
