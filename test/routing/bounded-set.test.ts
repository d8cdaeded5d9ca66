import { describe, expect, it } from "vitest";
import { BoundedSet } from "../../src/routing/bounded-set";

describe("BoundedSet", () => {
  it("remembers ids until it holds its limit, then starts over", () => {
    const set = new BoundedSet(3);
    for (const id of ["a", "b", "c"]) set.add(id);
    expect(["a", "b", "c"].map((id) => set.has(id))).toEqual([true, true, true]);
    set.add("d");
    expect(set.size).toBe(1);
    expect(set.has("a")).toBe(false);
    expect(set.has("d")).toBe(true);
  });

  it("never grows past its limit", () => {
    const set = new BoundedSet(1_000);
    for (let i = 0; i < 10_000; i++) set.add(`run_${i}`);
    expect(set.size).toBeLessThanOrEqual(1_000);
  });
});
