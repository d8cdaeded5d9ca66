/**
 * A byte limit on a body streamed through: past `max` bytes the stream errors, so
 * an agent never receives a silently truncated file, and the platform's body is
 * cancelled, so the gateway stops downloading. Pull-based: a chunk is read from the
 * platform only when the agent is ready for one, so nothing piles up in memory.
 */
export function limitBytes(source: ReadableStream<Uint8Array>, max: number): ReadableStream<Uint8Array> {
  const reader = source.getReader();
  let seen = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) return controller.close();
      seen += value.byteLength;
      if (seen > max) {
        await reader.cancel("over ATTACHMENT_MAX_BYTES");
        return controller.error(new Error(`attachment over ATTACHMENT_MAX_BYTES (${max})`));
      }
      controller.enqueue(value);
    },
    cancel: (reason) => reader.cancel(reason),
  });
}
