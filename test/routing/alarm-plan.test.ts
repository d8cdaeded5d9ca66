/**
 * The alarm plan against a real Durable Object's storage: the only code that sets
 * or deletes the routing object's alarm. What it promises: an alarm is never pushed
 * back (something due never waits for a later source); `armBy` (what staging calls,
 * before its D1 call) sets it at once, not at the request's end; it is deleted when
 * nothing is due (an idle key costs nothing); and it backs off while the live
 * session cannot be read.
 */
import { runInDurableObject } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { backoffDelay } from "../../src/http/backoff";
import { AlarmPlan, type AlarmSources } from "../../src/routing/alarm";
import { T0, loggedLines, router, unique } from "../helpers";

type Sources = Omit<AlarmSources, "now" | "settleFailures">;
const NOTHING: Sources = { nextDueAt: null, draining: false, liveDeadline: null, hasEntry: false };

/** A plan over the storage of a key no message reached (its own object sets no alarm). */
async function withPlan(
  test: (plan: AlarmPlan, storage: DurableObjectStorage, sources: { now: Sources }) => Promise<void>,
): Promise<void> {
  await runInDurableObject(router(`generic:dm:${unique("plan")}`), async (_instance, state) => {
    const sources = { now: NOTHING };
    const plan = new AlarmPlan(state.storage, () => sources.now);
    await plan.load();
    await test(plan, state.storage, sources);
  });
}

describe("armBy: staged work brings the alarm forward at once", () => {
  it("sets the alarm when none is set, just after now for a time already past", () =>
    withPlan(async (plan, storage) => {
      plan.armBy(T0 + 5_000, T0);
      expect(await storage.getAlarm()).toBe(T0 + 5_000);
      plan.fired();
      plan.armBy(T0 - 10, T0);
      expect(await storage.getAlarm()).toBe(T0 + 1);
    }));

  it("never pushes a sooner alarm back, and brings a later one forward", () =>
    withPlan(async (plan, storage) => {
      plan.armBy(T0 + 5_000, T0);
      plan.armBy(T0 + 9_000, T0);
      expect(await storage.getAlarm()).toBe(T0 + 5_000);
      plan.armBy(T0 + 5_000, T0);
      expect(await storage.getAlarm()).toBe(T0 + 5_000);
      plan.armBy(T0 + 2_000, T0);
      expect(await storage.getAlarm()).toBe(T0 + 2_000);
    }));

  it("keeps a sooner alarm an earlier incarnation of the object set (read on wake)", () =>
    withPlan(async (_plan, storage, sources) => {
      await storage.setAlarm(T0 + 1_000);
      const woken = new AlarmPlan(storage, () => sources.now);
      await woken.load();
      woken.armBy(T0 + 8_000, T0);
      expect(await storage.getAlarm()).toBe(T0 + 1_000);
      // What operator reads (explain's alarm_at) show.
      expect(await woken.stored()).toBe(T0 + 1_000);
    }));

  it("a storage that refuses the alarm is logged with its error; the staging that asked goes on", () =>
    withPlan(async (_plan, storage, sources) => {
      // The real storage, but its setAlarm refuses (as an overloaded or failing storage would).
      const refusing = new Proxy(storage, {
        get: (target, name) =>
          name === "setAlarm"
            ? () => Promise.reject(new Error("storage refused the alarm"))
            : Reflect.get(target, name).bind(target),
      });
      const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
      try {
        const plan = new AlarmPlan(refusing, () => sources.now);
        await plan.load();
        expect(() => plan.armBy(T0 + 5_000, T0)).not.toThrow();
        await vi.waitFor(() => expect(loggedLines(errors, "could not set the alarm")).toHaveLength(1));
        expect(loggedLines(errors, "could not set the alarm")).toEqual([
          expect.objectContaining({ level: "error", error: expect.stringContaining("storage refused the alarm") }),
        ]);
        expect(await storage.getAlarm()).toBeNull();
      } finally {
        errors.mockRestore();
      }
    }));
});

describe("rearm: the alarm at the earliest source", () => {
  it("deletes the alarm once nothing is due (an idle key costs nothing)", () =>
    withPlan(async (plan, storage) => {
      plan.armBy(T0 + 5_000, T0);
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBeNull();
    }));

  it("sets it to the earliest source, moves a later one forward, and leaves a sooner one alone", () =>
    withPlan(async (plan, storage, sources) => {
      sources.now = { ...NOTHING, nextDueAt: T0 + 7_000, liveDeadline: T0 + 60_000, hasEntry: true };
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + 7_000);
      sources.now = { ...sources.now, nextDueAt: T0 + 3_000 };
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + 3_000);
      // A sooner alarm fires, finds little to do, and re-arms: it is not rewritten later.
      sources.now = { ...sources.now, nextDueAt: null };
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + 3_000);
      // Once it fired, the next one is the deadline.
      plan.fired();
      await plan.rearm(T0 + 3_000);
      expect(await storage.getAlarm()).toBe(T0 + 60_000);
    }));

  it("asks storage on its first re-arm after a wake, and keeps a sooner alarm it finds there", () =>
    withPlan(async (_plan, storage, sources) => {
      await storage.setAlarm(T0 + 2_000);
      const woken = new AlarmPlan(storage, () => sources.now);
      sources.now = { ...NOTHING, nextDueAt: T0 + 9_000 };
      await woken.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + 2_000);
    }));

  it("while the live session cannot be read, looks again after a backoff that grows, and resets once read", () =>
    withPlan(async (plan, storage, sources) => {
      sources.now = { ...NOTHING, liveDeadline: undefined, hasEntry: true };
      plan.settleFailed();
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + backoffDelay(2));
      plan.fired();
      plan.settleFailed();
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + backoffDelay(3));
      plan.fired();
      plan.settled();
      await plan.rearm(T0);
      expect(await storage.getAlarm()).toBe(T0 + backoffDelay(1));
    }));
});
