/**
 * A FIFO lock for one routing object. A Durable Object runs one event at a time
 * only until it awaits I/O (a D1 call), so two messages for the same key could
 * interleave there; every state change of the object runs under this lock instead,
 * in order of arrival.
 */
export class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(task: () => Promise<T>): Promise<T> {
    const result = this.tail.then(task);
    this.tail = result.catch(() => undefined);
    return result;
  }
}
