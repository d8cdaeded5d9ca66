/** A set that forgets everything once it holds `limit` ids: a cache of confirmations. */
export class BoundedSet {
  private readonly ids = new Set<string>();
  constructor(private readonly limit: number) {}

  add(id: string): void {
    if (this.ids.size >= this.limit) this.ids.clear();
    this.ids.add(id);
  }

  has(id: string): boolean {
    return this.ids.has(id);
  }

  get size(): number {
    return this.ids.size;
  }
}
