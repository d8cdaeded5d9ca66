/**
 * Model-based test of the session lifecycle: fast-check generates sequences of
 * messages, bursts, platform retries, commands, clock moves, alarms, SQL ends,
 * forgotten routing entries, operator ends, agent ends, rotations, heartbeats and
 * late replies, with the agent going down and up, over four keys (two dm, a group
 * and a threaded channel) under a reset policy drawn per run (each chat type its
 * own mode through by_chat_type). Each step runs against the real worker and its
 * routing objects; after each one D1, the routing entries, the alarms and the
 * captured replies and events are compared with the pure model in model.ts.
 *
 * OVERLAP is drawn per run from a few layouts that give the chat types different
 * modes (the `queue` default, `interrupt`, `concurrent`), some a debounce window
 * and a small max_batch, so the keys of one run overlap in different ways; with
 * the agent slow (202, then a reply through the API) messages do overlap. After
 * every step invariant 11 is checked on D1 (see carriage.ts).
 *
 * Steps: MODEL_STEPS (CI default below), MODEL_SEED and MODEL_PATH replay a failure;
 * `npm run soak -- --steps N [--seed S]` sets them (scripts/soak.mjs).
 */
import { env } from "cloudflare:workers";
import fc from "fast-check";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { restoreClock, setNow, useConfig } from "../helpers";
import { overlapSeen } from "./carriage";
import { fail } from "./check";
import { alarmStep, commandArbitraries, type Real } from "./commands";
import { Model, type KeySpec } from "./model";
import type { OverlapJson } from "./overlap";
import type { PolicyFields, ResetJson } from "./policy";
import { AGENT_TOKEN, AGENT_URL, FakeServices, HOOK_URL, REPLY_URL, snapshot } from "./system";

const vars = env as unknown as Record<string, string | undefined>;
const STEPS = Number(vars.MODEL_STEPS || 60);
const MAX_COMMANDS = Number(vars.MODEL_MAX_COMMANDS || 40);
// A fixed seed keeps `npm test` deterministic; the soak draws a fresh one per run.
const SEED = vars.MODEL_SEED ? Number(vars.MODEL_SEED) : 20261201;
const PATH = vars.MODEL_PATH || undefined;

const policyFields: fc.Arbitrary<PolicyFields> = fc.record(
  {
    mode: fc.constantFrom("none", "idle", "daily", "both" as const),
    idle_minutes: fc.constantFrom(0.5, 1, 1.5, 5, 30, 90, 2.75),
    at_hour: fc.integer({ min: 0, max: 23 }),
    at_minute: fc.constantFrom(0, 15, 30, 59),
    timezone: fc.constantFrom("UTC", "Asia/Kolkata", "Asia/Kathmandu" as const),
  },
  { requiredKeys: ["mode"] },
);

/** A default, each chat type's own override, and sometimes a partial platform override on top. */
const resetConfig: fc.Arbitrary<ResetJson> = fc
  .tuple(
    policyFields,
    fc.option(policyFields),
    policyFields,
    policyFields,
    fc.option(
      fc.record(
        { timezone: fc.constantFrom("UTC", "Asia/Kolkata" as const), at_minute: fc.constantFrom(0, 45) },
        { requiredKeys: [] },
      ),
    ),
  )
  .map(([base, dm, group, channel, platform]) => ({
    ...base,
    by_chat_type: { ...(dm ? { dm } : {}), group, channel },
    ...(platform ? { by_platform: { generic: platform } } : {}),
  }));

/**
 * The overlap layouts: dm keys 0 and 1, the group key 2, the channel key 3 (every
 * key is on the generic platform, so a by_platform override applies to all).
 */
const overlapConfig: fc.Arbitrary<OverlapJson> = fc.constantFrom<OverlapJson>(
  { max_batch: 2, by_chat_type: { group: { mode: "interrupt" }, channel: { mode: "concurrent", debounce_ms: 2_000 } } },
  {
    mode: "interrupt",
    by_chat_type: { dm: { mode: "queue", debounce_ms: 1_000, max_batch: 3 }, channel: { mode: "concurrent" } },
  },
  {
    by_platform: { generic: { max_batch: 2 } },
    by_chat_type: { group: { mode: "concurrent" }, channel: { mode: "interrupt", debounce_ms: 1_000 } },
  },
  { mode: "concurrent", by_chat_type: { dm: { mode: "interrupt", max_batch: 3 }, group: { mode: "queue" } } },
);

const T_BASE = Date.UTC(2031, 0, 15, 0, 0, 0);
const start = fc.integer({ min: 0, max: 2 * 86_400_000 - 1 }).map((offset) => T_BASE + offset);

function keysOf(prefix: string): KeySpec[] {
  return [
    { chatType: "dm", chatId: `${prefix}-a`, userId: "u1", threadId: null, key: `generic:dm:${prefix}-a` },
    { chatType: "dm", chatId: `${prefix}:b`, userId: "u1", threadId: null, key: `generic:dm:${prefix}%3Ab` },
    { chatType: "group", chatId: `${prefix}-g`, userId: "u1", threadId: null, key: `generic:group:${prefix}-g:u1` },
    {
      chatType: "channel",
      chatId: `${prefix}-c`,
      userId: "u2",
      threadId: "t1",
      key: `generic:channel:${prefix}-c:t1:u2`,
    },
  ];
}

const services = new FakeServices();
let restoreFetch: () => void;
beforeAll(() => {
  restoreFetch = services.install();
});
afterAll(() => {
  restoreFetch();
  restoreClock();
  useConfig(null);
});

/**
 * After the commands: the agent comes back, time moves on, every alarm fires. Then
 * no acknowledged message may be left un-handed-over (invariants 1 and 6), and
 * every lifecycle event D1 holds must have reached the hook receiver.
 *
 * A round of alarms can itself stage events (a check item promoting a row writes
 * its `session.ended`), whose drain is the object's next alarm; so the rounds go
 * on while an event is undelivered too, and an event no alarm ever sends still
 * fails the check below.
 */
async function settle(m: Model, r: Real): Promise<void> {
  m.agentMode = "reply";
  r.services.mode = "reply";
  const open = () =>
    [...m.runs.values()].filter((run) => run.state === "staged" || run.state === "retrying" || run.state === "waiting");
  const undelivered = async () => {
    const delivered = new Set(r.services.hooks.map((hook) => hook.id));
    const snap = await snapshot(m.keys.map((k) => k.key));
    return snap.events.filter((event) => event.status !== "sent" || !delivered.has(event.id));
  };
  for (let round = 0; round < 12; round++) {
    for (let key = 0; key < m.keys.length; key++) await alarmStep(m, r, key, `settle: Alarm(${key})`);
    if (open().length === 0 && (await undelivered()).length === 0) break;
    m.now += 6 * 60_000;
    setNow(m.now);
  }
  if (open().length > 0)
    fail("invariant 1/6 (acknowledged, never answered)", `runs still waiting: ${open().map((run) => run.eventId)}`);
  for (const event of await undelivered())
    fail("lifecycle events", `event ${event.id} (${event.type}) is ${event.status}, never delivered`);
}

let runCounter = 0;
const steps = { count: 0 };
let lastLog: string[] = [];

const lifecycle = fc.asyncProperty(
  resetConfig,
  overlapConfig,
  start,
  fc.commands(commandArbitraries, { maxCommands: MAX_COMMANDS, size: "max" }),
  async (config, overlap, t0, commands) => {
    runCounter += 1;
    const prefix = `m${runCounter}r${Math.floor(Math.random() * 1e6)}`;
    services.reset();
    setNow(t0);
    useConfig({
      SESSION_RESET: JSON.stringify(config),
      AGENT_URL,
      AGENT_TOKEN,
      GENERIC_REPLY_URL: REPLY_URL,
      HOOK_URLS: HOOK_URL,
      HOOK_SECRET: "model-hook-secret",
      OVERLAP: JSON.stringify(overlap),
    });
    const model = new Model(prefix, keysOf(prefix), config, t0, overlap);
    const log = [`config ${JSON.stringify(config)}`, `overlap ${JSON.stringify(overlap)}`];
    const real: Real = { services, seen: { replies: 0, hooks: 0 }, steps, log };
    lastLog = real.log;
    await fc.asyncModelRun(() => ({ model, real }), commands);
    await settle(model, real);
    // Progress for long soaks: a run that passed, and the steps so far.
    if (runCounter % 10 === 0) console.log(`model: ${steps.count} steps after ${runCounter} runs`);
  },
);

it(
  `follows the reference model of the lifecycle for ${STEPS} steps`,
  async () => {
    const started = vi.getRealSystemTime();
    let batch = 0;
    try {
      while (steps.count < STEPS) {
        const seed = SEED + batch;
        const before = steps.count;
        const numRuns = PATH ? 1 : Math.max(1, Math.ceil((STEPS - steps.count) / (MAX_COMMANDS * 0.8)));
        console.log(`model: seed ${seed}, ${numRuns} runs of up to ${MAX_COMMANDS} commands`);
        await fc.assert(lifecycle, { seed, path: PATH, numRuns, endOnFailure: !!PATH || !!vars.MODEL_NO_SHRINK });
        console.log(`model: seed ${seed} passed ${steps.count - before} steps`);
        if (PATH) break;
        batch += 1;
      }
    } catch (error) {
      console.error(`model: FAILED. Replay with: npm run soak -- --seed <seed> --path <path> (from the report below)`);
      console.error(`model: steps of the last (shrunk) run:\n  ${lastLog.join("\n  ")}`);
      throw error;
    } finally {
      console.log(
        `model: ${steps.count} steps in ${runCounter} runs, ${Math.round((vi.getRealSystemTime() - started) / 1000)} s`,
      );
      console.log(`model: overlap ${JSON.stringify(overlapSeen)}`);
    }
    expect(steps.count).toBeGreaterThanOrEqual(PATH ? 1 : STEPS);
  },
  Number(vars.MODEL_TIMEOUT_MS || 10 * 60_000),
);
