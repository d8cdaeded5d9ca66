/** Shared steps of the attachment tests: fetching `/v1/attachments/{id}` as the agent does. */
import { exports } from "cloudflare:workers";
import { expect, vi } from "vitest";
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

/**
 * A download asked for after `platform` was turned off or broke (its variables changed
 * since the message): 502 "{platform} is not configured", no request to the platform,
 * the invalid-configuration log lines (`[platform, error]` each) and one
 * "attachment not served" warning, as the operator reads them.
 */
export async function expectRefusedAsUnconfigured(
  platform: string,
  download: () => Promise<Response>,
  outbound: { calls: readonly unknown[] },
  invalidLines: [string, unknown][],
): Promise<void> {
  const lines: Record<string, unknown>[] = [];
  const capture = (...args: unknown[]) => void lines.push(JSON.parse(String(args[0])));
  const spies = [
    vi.spyOn(console, "error").mockImplementation(capture),
    vi.spyOn(console, "warn").mockImplementation(capture),
  ];
  const before = outbound.calls.length;
  let error: Awaited<ReturnType<typeof errorOf>>;
  try {
    error = await errorOf(await download());
  } finally {
    for (const spy of spies) spy.mockRestore();
  }
  const message = `${platform} is not configured`;
  expect(error).toEqual({ status: 502, code: "bad_gateway", message });
  expect(outbound.calls.length).toBe(before);
  // The operator sees which platform's settings are broken, and which key.
  const invalid = lines.filter((line) => line.msg === "replies not sent: invalid configuration");
  expect(invalid.map((line) => [line.platform, line.error])).toEqual(invalidLines);
  expect(lines.filter((line) => line.msg === "attachment not served")).toEqual([
    expect.objectContaining({ level: "warn", platform, status: 502, error: message }),
  ]);
}
