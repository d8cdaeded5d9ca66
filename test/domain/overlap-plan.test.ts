/**
 * The overlap planner: a table per mode, then a property over random histories:
 * every stored user message ends carried by exactly one run that no interrupt
 * revoked, or recorded as not dispatched with its reason (spec invariant 11);
 * queue and interrupt never have two unfinished runs; a run carries at most
 * max_batch messages, oldest first; nothing is carried past /new, /reset, /stop or
 * an end.
 */
import fc from "fast-check";
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
const interrupt: OverlapSettings = { mode: "interrupt", debounce_ms: 0, max_batch: 20 };
const concurrent: OverlapSettings = { mode: "concurrent", debounce_ms: 0, max_batch: 20 };

const msg = (eventId: string, at = T): WaitingMessage => ({ eventId, receivedAt: at });
const stored = (eventId: string, at = T): OverlapEvent => ({ kind: "stored", message: msg(eventId, at) });
const running = (runId: string, ...eventIds: string[]): OverlapState["unfinished"][number] => ({
  runId,
  messages: eventIds.map((id) => msg(id)),
});

describe("queue", () => {
  it("an idle session dispatches the message at once, alone", () => {
    const plan = planOverlap(queue, EMPTY_OVERLAP_STATE, stored("a"), T);
    expect(plan).toEqual({
      revoke: null,
      release: [],
      dispatch: [["a"]],
      notDispatched: null,
      waiting: [],
      wakeAt: null,
    });
  });

  it("a message while a run is unfinished waits, and nothing is revoked", () => {
    const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [msg("b")] };
    const plan = planOverlap(queue, state, stored("c", T + 1), T + 1);
    expect(plan).toMatchObject({ revoke: null, dispatch: [], wakeAt: null });
    expect(plan.waiting.map((m) => m.eventId)).toEqual(["b", "c"]);
  });

  it.each(["finished", "failed", "lease_lapsed"] as const)(
    "when the run is over (%s), one run carries every waiting message, oldest first",
    (outcome) => {
      const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [msg("b", T + 1), msg("c", T + 2)] };
      const plan = planOverlap(queue, state, { kind: "run_over", runId: "r1", outcome }, T + 3);
      expect(plan).toMatchObject({ revoke: null, dispatch: [["b", "c"]], waiting: [] });
    },
  );

  it("at most max_batch a run; the rest wait for that run to be over", () => {
    const settings = { ...queue, max_batch: 2 };
    const waiting = ["b", "c", "d"].map((id, i) => msg(id, T + i));
    const first = planOverlap(
      settings,
      { unfinished: [running("r1", "a")], waiting },
      {
        kind: "run_over",
        runId: "r1",
        outcome: "finished",
      },
      T + 5,
    );
    expect(first.dispatch).toEqual([["b", "c"]]);
    expect(first.waiting.map((m) => m.eventId)).toEqual(["d"]);
    const second = planOverlap(
      settings,
      { unfinished: [running("r2", "b", "c")], waiting: first.waiting },
      {
        kind: "run_over",
        runId: "r2",
        outcome: "finished",
      },
      T + 6,
    );
    expect(second.dispatch).toEqual([["d"]]);
  });

  it("the end of a run that is not unfinished (a stale report) dispatches nothing beside the live one", () => {
    const state: OverlapState = { unfinished: [running("r2", "a")], waiting: [msg("b")] };
    const plan = planOverlap(queue, state, { kind: "run_over", runId: "r1", outcome: "finished" }, T);
    expect(plan.dispatch).toEqual([]);
    expect(plan.waiting).toEqual([msg("b")]);
  });

  it("the alarm with nothing due does nothing", () => {
    expect(planOverlap(queue, EMPTY_OVERLAP_STATE, { kind: "alarm" }, T)).toMatchObject({
      dispatch: [],
      waiting: [],
      wakeAt: null,
    });
  });
});

describe("interrupt", () => {
  it("a message while a run is unfinished revokes it; one run carries its messages and the new one", () => {
    const state: OverlapState = { unfinished: [running("r1", "a", "b")], waiting: [] };
    const plan = planOverlap(interrupt, state, stored("c", T + 1), T + 1);
    expect(plan).toEqual({
      revoke: { runIds: ["r1"], reason: "superseded" },
      release: ["r1"],
      dispatch: [["a", "b", "c"]],
      notDispatched: null,
      waiting: [],
      wakeAt: null,
    });
  });

  it("an idle session dispatches at once, as queue does", () => {
    expect(planOverlap(interrupt, EMPTY_OVERLAP_STATE, stored("a"), T).dispatch).toEqual([["a"]]);
  });

  it("with a debounce, the revoke is at once and the new run waits for the window", () => {
    const settings = { ...interrupt, debounce_ms: 1000 };
    const plan = planOverlap(settings, { unfinished: [running("r1", "a")], waiting: [] }, stored("b", T + 5), T + 5);
    expect(plan.revoke).toEqual({ runIds: ["r1"], reason: "superseded" });
    expect(plan.dispatch).toEqual([]);
    expect(plan.waiting.map((m) => m.eventId)).toEqual(["a", "b"]);
    expect(plan.wakeAt).toBe(T + 1005);
  });
});

describe("concurrent", () => {
  it("every message is its own run at once; nothing is revoked", () => {
    const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [] };
    const plan = planOverlap(concurrent, state, stored("b", T + 1), T + 1);
    expect(plan).toMatchObject({ revoke: null, release: [], dispatch: [["b"]], waiting: [] });
  });

  it("with a debounce, the window's messages join one run even beside an unfinished one", () => {
    const settings = { ...concurrent, debounce_ms: 500 };
    const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [msg("b", T), msg("c", T + 100)] };
    expect(planOverlap(settings, state, { kind: "alarm" }, T + 599).dispatch).toEqual([]);
    expect(planOverlap(settings, state, { kind: "alarm" }, T + 600).dispatch).toEqual([["b", "c"]]);
  });
});

describe("debounce_ms", () => {
  const settings = { ...queue, debounce_ms: 1000 };

  it("a message waits until debounce_ms passed with no newer one; the alarm then dispatches them together", () => {
    const first = planOverlap(settings, EMPTY_OVERLAP_STATE, stored("a", T), T);
    expect(first).toMatchObject({ dispatch: [], wakeAt: T + 1000 });
    const second = planOverlap(settings, { unfinished: [], waiting: first.waiting }, stored("b", T + 600), T + 600);
    expect(second).toMatchObject({ dispatch: [], wakeAt: T + 1600 });
    const early = planOverlap(settings, { unfinished: [], waiting: second.waiting }, { kind: "alarm" }, T + 1599);
    expect(early).toMatchObject({ dispatch: [], wakeAt: T + 1600 });
    const due = planOverlap(settings, { unfinished: [], waiting: second.waiting }, { kind: "alarm" }, T + 1600);
    expect(due).toMatchObject({ dispatch: [["a", "b"]], waiting: [], wakeAt: null });
  });

  it("a run that ends inside the window leaves the waiting messages to the alarm", () => {
    const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [msg("b", T + 100)] };
    const plan = planOverlap(settings, state, { kind: "run_over", runId: "r1", outcome: "finished" }, T + 500);
    expect(plan).toMatchObject({ dispatch: [], wakeAt: T + 1100 });
  });
});

describe("commands and ends", () => {
  const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [msg("b"), msg("c")] };
  it.each([
    [{ kind: "command", command: "stop" }, "stopped", "stopped"],
    [{ kind: "command", command: "new" }, "superseded", "new_command"],
    [{ kind: "command", command: "reset" }, "superseded", "new_command"],
    [{ kind: "ended" }, "session_ended", "session_ended"],
  ] as const)(
    "%o revokes the unfinished run (%s) and leaves the waiting not dispatched (%s)",
    (event, revoked, reason) => {
      for (const settings of [queue, interrupt, concurrent, { ...queue, debounce_ms: 5000 }]) {
        expect(planOverlap(settings, state, event, T)).toEqual({
          revoke: { runIds: ["r1"], reason: revoked },
          release: [],
          dispatch: [],
          notDispatched: { eventIds: ["b", "c"], reason },
          waiting: [],
          wakeAt: null,
        });
      }
    },
  );

  it("with nothing open or waiting, a command has nothing to revoke or record", () => {
    expect(planOverlap(queue, EMPTY_OVERLAP_STATE, { kind: "command", command: "stop" }, T)).toMatchObject({
      revoke: null,
      notDispatched: null,
    });
  });
});

describe("applyPlan", () => {
  it("drops revoked and finished runs, adds the new one with its messages, keeps what waits", () => {
    const state: OverlapState = { unfinished: [running("r1", "a")], waiting: [] };
    const event = stored("b", T + 1);
    const plan = planOverlap(interrupt, state, event, T + 1);
    expect(applyPlan(state, event, plan, ["r2"])).toEqual({
      unfinished: [{ runId: "r2", messages: [msg("a"), msg("b", T + 1)] }],
      waiting: [],
    });
  });
});

// ---- The property: invariant 11 over random histories ----

type Step =
  | { kind: "message"; advance: number }
  | { kind: "over"; pick: number; outcome: "finished" | "failed" | "lease_lapsed" }
  | { kind: "alarm"; advance: number }
  | { kind: "command"; command: "new" | "reset" | "stop" }
  | { kind: "ended" };

const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({ kind: fc.constant("message" as const), advance: fc.constantFrom(0, 50, 400, 2000) }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("over" as const),
      pick: fc.nat(3),
      outcome: fc.constantFrom("finished" as const, "failed" as const, "lease_lapsed" as const),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("alarm" as const), advance: fc.constantFrom(0, 300, 5000) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("command" as const),
      command: fc.constantFrom("new" as const, "reset" as const, "stop" as const),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("ended" as const) }) },
);

const settingsArb: fc.Arbitrary<OverlapSettings> = fc.record({
  mode: fc.constantFrom("queue" as const, "interrupt" as const, "concurrent" as const),
  debounce_ms: fc.constantFrom(0, 100, 1000),
  max_batch: fc.constantFrom(1, 2, 3, 20),
});

/** The gateway as the planner drives it: every run, who carries each message, and why some never ran. */
class World {
  now = T;
  state: OverlapState = EMPTY_OVERLAP_STATE;
  session = 0;
  nextId = 0;
  /** Each message: the session it was stored in, when. */
  messages = new Map<string, { session: number; receivedAt: number }>();
  runs = new Map<string, { session: number; carries: string[]; revoked: string | null; over: boolean }>();
  notDispatched = new Map<string, string>();

  constructor(readonly settings: OverlapSettings) {}

  apply(event: OverlapEvent): void {
    const plan = planOverlap(this.settings, this.state, event, this.now);
    const unfinishedIds = new Set(this.state.unfinished.map((r) => r.runId));
    for (const id of plan.revoke?.runIds ?? []) {
      expect(unfinishedIds.has(id), "only unfinished runs are revoked").toBe(true);
      const run = this.runs.get(id)!;
      // A command or an end revokes with its own reason; an arrival only in interrupt mode.
      if (event.kind === "stored") expect(this.settings.mode).toBe("interrupt");
      run.revoked = plan.revoke!.reason === "superseded" && event.kind === "stored" ? "interrupt" : plan.revoke!.reason;
    }
    if (plan.notDispatched) {
      for (const id of plan.notDispatched.eventIds) {
        expect(this.notDispatched.has(id), "recorded once").toBe(false);
        this.notDispatched.set(id, plan.notDispatched.reason);
      }
    }
    const newIds = plan.dispatch.map(() => `run${this.nextId++}`);
    const waitingBefore = new Map(
      [...this.state.waiting, ...(event.kind === "stored" ? [event.message] : [])].map((m) => [m.eventId, m]),
    );
    for (const r of this.state.unfinished)
      if (plan.release.includes(r.runId)) for (const m of r.messages) waitingBefore.set(m.eventId, m);
    plan.dispatch.forEach((ids, i) => {
      expect(ids.length).toBeGreaterThan(0);
      expect(ids.length).toBeLessThanOrEqual(this.settings.max_batch);
      const times = ids.map((id) => this.messages.get(id)!.receivedAt);
      expect(times, "oldest first").toEqual([...times].sort((a, b) => a - b));
      for (const id of ids) {
        expect(waitingBefore.has(id), `${id} was waiting when dispatched`).toBe(true);
        expect(this.messages.get(id)!.session, "never carried into another session").toBe(this.session);
        expect(this.notDispatched.has(id)).toBe(false);
      }
      this.runs.set(newIds[i]!, { session: this.session, carries: ids, revoked: null, over: false });
    });
    if (event.kind === "run_over" && this.runs.has(event.runId) && unfinishedIds.has(event.runId)) {
      this.runs.get(event.runId)!.over = true;
    }
    this.state = applyPlan(this.state, event, plan, newIds);
    if (this.settings.mode !== "concurrent") expect(this.state.unfinished.length).toBeLessThanOrEqual(1);
    if (event.kind === "command" || event.kind === "ended") {
      expect(this.state).toEqual(EMPTY_OVERLAP_STATE);
      this.session++; // the fresh session starts with nothing waiting
    }
  }

  step(s: Step): void {
    if (s.kind === "message") {
      this.now += s.advance;
      const id = `m${this.messages.size}`;
      this.messages.set(id, { session: this.session, receivedAt: this.now });
      this.apply({ kind: "stored", message: { eventId: id, receivedAt: this.now } });
    } else if (s.kind === "over") {
      const run = this.state.unfinished[s.pick % Math.max(1, this.state.unfinished.length)];
      this.apply({ kind: "run_over", runId: run?.runId ?? "run_unknown", outcome: s.outcome });
    } else if (s.kind === "alarm") {
      this.now += s.advance;
      this.apply({ kind: "alarm" });
    } else if (s.kind === "command") {
      this.apply({ kind: "command", command: s.command });
    } else {
      this.apply({ kind: "ended" });
    }
  }

  /** Every run answers and every alarm comes, until nothing is unfinished or waiting. */
  drain(): void {
    for (let guard = 0; guard < 1000; guard++) {
      const run = this.state.unfinished[0];
      if (run) this.apply({ kind: "run_over", runId: run.runId, outcome: "finished" });
      else if (this.state.waiting.length > 0) {
        this.now += 600_000;
        this.apply({ kind: "alarm" });
      } else return;
    }
    throw new Error("the planner never drained");
  }

  checkInvariant11(): void {
    for (const [id] of this.messages) {
      const carriers = [...this.runs.entries()].filter(([, run]) => run.carries.includes(id));
      // An interrupt hands a message on; only the last carrier may remain, and it was not revoked by an interrupt.
      const live = carriers.filter(([, run]) => run.revoked !== "interrupt");
      const dropped = this.notDispatched.get(id);
      if (dropped) {
        expect(live, `${id} not dispatched (${dropped}) yet carried`).toEqual([]);
      } else {
        expect(live.length, `${id} is carried by exactly one run`).toBe(1);
      }
    }
  }
}

describe("invariant 11 over random histories", () => {
  it("every stored message ends carried by exactly one run or recorded as not dispatched, never both", () => {
    fc.assert(
      fc.property(settingsArb, fc.array(step, { maxLength: 60 }), (settings, steps) => {
        const world = new World(settings);
        for (const s of steps) world.step(s);
        world.drain();
        world.checkInvariant11();
      }),
      { numRuns: 1500 },
    );
  });
});
