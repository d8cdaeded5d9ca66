/**
 * The overlap planner, the cases its first table left open: what the routing
 * object's state holds after a message waits (the open run stays open, so a
 * second message cannot start a second run), concurrent mode when a debounce window
 * collects more than max_batch messages (several runs at once, none left waiting),
 * an interrupt-mode message to an idle session (nothing to revoke, so no revoke
 * step), and a plan applied without the ids of its runs (refused, never stored).
 */
import { describe, expect, it } from "vitest";
import type { OverlapSettings } from "../../src/domain/overlap";
import {
  EMPTY_OVERLAP_STATE,
  applyPlan,
  planOverlap,
  type OverlapEvent,
  type OverlapState,
  type WaitingMessage,
} from "../../src/domain/overlap-plan";

const T = 1_900_000_000_000;
const queue: OverlapSettings = { mode: "queue", debounce_ms: 0, max_batch: 20 };
const msg = (eventId: string, at = T): WaitingMessage => ({ eventId, receivedAt: at });
const stored = (eventId: string, at = T): OverlapEvent => ({ kind: "stored", message: msg(eventId, at) });

describe("queue: the state after a message waits", () => {
  it("keeps the open run unfinished, so the next message waits too and the run's end carries both", () => {
    let state: OverlapState = { unfinished: [{ runId: "r1", messages: [msg("a")] }], waiting: [] };
    for (const [id, at] of [
      ["b", T + 10],
      ["c", T + 20],
    ] as const) {
      const event = stored(id, at);
      const plan = planOverlap(queue, state, event, at);
      expect(plan.dispatch).toEqual([]);
      state = applyPlan(state, event, plan, []);
      expect(state.unfinished.map((r) => r.runId)).toEqual(["r1"]);
    }
    expect(state.waiting.map((m) => m.eventId)).toEqual(["b", "c"]);

    const over: OverlapEvent = { kind: "run_over", runId: "r1", outcome: "finished" };
    const plan = planOverlap(queue, state, over, T + 30);
    expect(plan.dispatch).toEqual([["b", "c"]]);
    expect(applyPlan(state, over, plan, ["r2"])).toEqual({
      unfinished: [{ runId: "r2", messages: [msg("b", T + 10), msg("c", T + 20)] }],
      waiting: [],
    });
  });
});

describe("concurrent: a debounce window with more than max_batch messages", () => {
  it("dispatches them all at once, max_batch a run, oldest first; nothing is left waiting", () => {
    const settings: OverlapSettings = { mode: "concurrent", debounce_ms: 500, max_batch: 2 };
    const waiting = ["a", "b", "c", "d", "e"].map((id, i) => msg(id, T + i));
    const state: OverlapState = { unfinished: [], waiting };
    const plan = planOverlap(settings, state, { kind: "alarm" }, T + 4 + 500);
    expect(plan.dispatch).toEqual([["a", "b"], ["c", "d"], ["e"]]);
    expect(plan.waiting).toEqual([]);
    expect(plan.wakeAt).toBeNull();
  });
});

describe("interrupt: a message to an idle session", () => {
  it("dispatches it at once and has nothing to revoke", () => {
    const settings: OverlapSettings = { mode: "interrupt", debounce_ms: 0, max_batch: 20 };
    expect(planOverlap(settings, EMPTY_OVERLAP_STATE, stored("a"), T)).toEqual({
      revoke: null,
      release: [],
      dispatch: [["a"]],
      notDispatched: null,
      waiting: [],
      wakeAt: null,
    });
  });
});

describe("applyPlan without the ids of the runs it dispatches", () => {
  it("throws instead of storing a run no one could name (its messages would be carried by nothing)", () => {
    const event = stored("a");
    const plan = planOverlap(queue, EMPTY_OVERLAP_STATE, event, T);
    expect(() => applyPlan(EMPTY_OVERLAP_STATE, event, plan, [])).toThrow(/run id for every dispatched run/);
  });
});
