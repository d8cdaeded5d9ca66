/** Which runs hold a session past its deadline (spec invariant 6), and when its owner vanished. */
import { describe, expect, it } from "vitest";
import { holdOf, nextLook, RUN_LEASE_MS } from "../../src/domain/turn-hold";

const NOW = 1_000_000_000;
const run = (
  id: string,
  heardAt: number,
  fields: Partial<{ finishedAt: number; revokedReason: string; failedAt: number }> = {},
) => ({
  id,
  createdAt: heardAt,
  dispatchedAt: heardAt,
  lastHeartbeatAt: heardAt,
  finishedAt: fields.finishedAt ?? null,
  revokedReason: fields.revokedReason ?? null,
  failedAt: fields.failedAt ?? null,
});
const fresh = NOW - 1_000; // heard from a second ago
const silent = NOW - RUN_LEASE_MS; // lease ran out just now

describe("holdOf", () => {
  it.each([
    ["no open run", [], "cur", { held: false, lapsed: false, until: null }],
    [
      "the current run within its lease",
      [run("cur", fresh)],
      "cur",
      { held: true, lapsed: false, until: fresh + RUN_LEASE_MS },
    ],
    [
      "an older run within its lease, the current one finished",
      [run("old", fresh)],
      "cur",
      { held: true, lapsed: false, until: fresh + RUN_LEASE_MS },
    ],
    [
      "the earliest lease end of several",
      [run("a", fresh), run("b", fresh - 5)],
      "a",
      { held: true, lapsed: false, until: fresh - 5 + RUN_LEASE_MS },
    ],
    ["the current run silent past its lease", [run("cur", silent)], "cur", { held: false, lapsed: true, until: null }],
    [
      "the current run silent, an older one still heard from",
      [run("cur", silent), run("old", fresh)],
      "cur",
      { held: true, lapsed: false, until: fresh + RUN_LEASE_MS },
    ],
    [
      "only an older run silent: no owner vanished",
      [run("old", silent)],
      "cur",
      { held: false, lapsed: false, until: null },
    ],
    [
      "a failed run holds nothing",
      [run("cur", fresh, { failedAt: NOW })],
      "cur",
      { held: false, lapsed: false, until: null },
    ],
    [
      "a revoked run holds nothing",
      [run("cur", fresh, { revokedReason: "superseded" })],
      "cur",
      { held: false, lapsed: false, until: null },
    ],
    [
      "a finished run holds nothing",
      [run("cur", fresh, { finishedAt: NOW })],
      "cur",
      { held: false, lapsed: false, until: null },
    ],
  ])("%s", (_name, runs, current, expected) => {
    expect(holdOf(runs, current, NOW)).toEqual(expected);
  });
});

describe("nextLook", () => {
  const lease = fresh + RUN_LEASE_MS;
  it.each([
    ["no open run: the policy deadline", NOW + 5, [], NOW + 5],
    ["no open run, mode none: never", null, [], null],
    ["a lease ending first", lease + 1, [run("cur", fresh)], lease],
    ["a deadline coming first", lease - 1, [run("cur", fresh)], lease - 1],
    ["mode none: the lease alone", null, [run("cur", fresh)], lease],
    ["the current run's lease already lapsed: now", NOW + 5, [run("cur", silent)], NOW],
    ["a finished run holds nothing", NOW + 5, [run("cur", fresh, { finishedAt: NOW })], NOW + 5],
  ] as const)("%s", (_what, policyDeadline, runs, expected) => {
    expect(nextLook(policyDeadline, runs, "cur", NOW)).toBe(expected);
  });
});
