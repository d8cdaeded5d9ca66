/** Shared steps of the attachment tests: fetching `/v1/attachments/{id}` as the agent does. */
import { exports } from "cloudflare:workers";
import { expect } from "vitest";
import { BASE } from "../helpers";

/** GET a hand-off attachment path with a run token, through the worker's own fetch. */
export function fetchAttachment(path: string, token: string | null): Promise<Response> {
  const headers: Record<string, string> = {};
  if (token) headers.authorization = `Bearer ${token}`;
  return exports.default.fetch(new Request(`${BASE}${path}`, { headers }));
}

/** A response body of `size` bytes with a recognisable pattern. */
export function bytesOf(size: number, seed = 7): Uint8Array {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 31 + seed) % 251;
  return bytes;
}

/** A body that arrives in chunks, without a content-length (as a chunked download does). */
export function chunkedBody(bytes: Uint8Array, chunk = 1024): ReadableStream<Uint8Array> {
  let offset = 0;
  return new ReadableStream({
    pull(controller) {
      if (offset >= bytes.length) return controller.close();
      controller.enqueue(bytes.slice(offset, offset + chunk));
      offset += chunk;
    },
  });
}

/** The serialised agent hand-off must carry none of these (tokens, platform URLs, file ids). */
export function expectNoneOf(serialised: string, secrets: readonly string[]): void {
  for (const secret of secrets) expect(serialised).not.toContain(secret);
}

export async function errorOf(response: Response): Promise<{ status: number; code: string; message: string }> {
  const body = (await response.json()) as { error: { code: string; message: string } };
  return { status: response.status, code: body.error.code, message: body.error.message };
}
