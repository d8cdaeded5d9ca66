/**
 * When a run's lease runs out (spec invariant 6): RUN_LEASE_MS after the run was
 * last heard from. A heartbeat counts over the hand-off, the hand-off over the
 * run's creation (a run still in the outbox has only been created).
 */
import { describe, expect, it } from "vitest";
import { holdOf, leaseUntil, RUN_LEASE_MS } from "../../src/domain/turn-hold";

const created = 1_000_000;
const dispatched = created + 5_000;
const heartbeat = dispatched + 60_000;
const open = { finishedAt: null, revokedReason: null, failedAt: null };

describe("leaseUntil", () => {
  it.each([
    [
      "a run still waiting for its hand-off: from its creation",
      { createdAt: created, dispatchedAt: null, lastHeartbeatAt: null },
      created,
    ],
    [
      "a run handed over and silent since: from the hand-off",
      { createdAt: created, dispatchedAt: dispatched, lastHeartbeatAt: null },
      dispatched,
    ],
    [
      "a run that sent a heartbeat: from the heartbeat",
      { createdAt: created, dispatchedAt: dispatched, lastHeartbeatAt: heartbeat },
      heartbeat,
    ],
  ])("%s", (_what, times, heardAt) => {
    expect(leaseUntil({ ...times, ...open })).toBe(heardAt + RUN_LEASE_MS);
  });

  it("a heartbeat keeps holding the session after the hand-off's lease ran out", () => {
    const run = { id: "r1", createdAt: created, dispatchedAt: dispatched, lastHeartbeatAt: heartbeat, ...open };
    const afterDispatchLease = dispatched + RUN_LEASE_MS + 1;
    expect(holdOf([run], "r1", afterDispatchLease)).toEqual({
      held: true,
      lapsed: false,
      until: heartbeat + RUN_LEASE_MS,
    });
    expect(holdOf([run], "r1", heartbeat + RUN_LEASE_MS)).toEqual({ held: false, lapsed: true, until: null });
  });
});
