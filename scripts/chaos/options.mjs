// Flags of `npm run chaos` and the seeded random source every choice is drawn from.

/** Every flag, its default and what it means (printed by --help). */
export const FLAGS = {
  keys: { value: 24, help: "conversation keys (half dm with a 3 s idle policy, half group with none)" },
  messages: { value: 6, help: "messages per key" },
  kills: { value: 3, help: "kill -9 of the gateway's process group during the load" },
  rate: { value: 8, help: "new messages started per second (resends come on top)" },
  concurrency: { value: 8, help: "requests in flight at most" },
  "agent-async": { value: 0.25, help: "share of hand-offs the fake agent answers 202, replying later via the run API" },
  "agent-fail": { value: 0.05, help: "share of hand-offs the fake agent answers 503 (the gateway retries)" },
  "hook-fail": { value: 0.1, help: "share of event deliveries the hook receiver answers 500" },
  "reply-fail": { value: 0.1, help: "share of reply deliveries the reply receiver answers 500" },
  "burst-every": {
    value: 3,
    help: "every Nth key gets its messages in one burst and a slow agent, so queued messages batch (0: none)",
  },
  "slow-ms": { value: 1500, help: "how long the fake agent takes to answer a hand-off of a burst key" },
  "idle-seconds": { value: 3, help: "idle policy of the dm keys, in seconds" },
  "drain-timeout": { value: 120, help: "seconds to wait for answers, ends and finalized events after the load" },
  "start-timeout": { value: 120, help: "seconds one gateway start may take" },
  "max-seconds": { value: 300, help: "the whole run's bound; past it the run stops and fails" },
  "port-base": { value: 8810, help: "first of five loopback ports: gateway, inspector, agent, hooks, replies" },
  seed: { value: null, help: "seed of the random choices (default: random; printed)" },
  ref: { value: "", help: "run the gateway of this commit (git archive) instead of the work tree" },
  keep: { value: false, help: "keep the state directory even when the run passes" },
};

/** Parses `--name value` / `--name=value` / `--keep`; throws naming the flag at fault. */
export function parseFlags(argv) {
  const options = Object.fromEntries(Object.entries(FLAGS).map(([name, flag]) => [name, flag.value]));
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--help" || arg === "-h") return { help: true };
    const match = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!match || !(match[1] in FLAGS)) throw new Error(`unknown argument ${arg} (try --help)`);
    const name = match[1];
    if (typeof FLAGS[name].value === "boolean") {
      options[name] = match[2] === undefined ? true : match[2] !== "false";
      continue;
    }
    const raw = match[2] ?? argv[++i];
    if (typeof FLAGS[name].value === "string") {
      if (!raw) throw new Error(`--${name} needs a value`);
      options[name] = raw;
      continue;
    }
    const value = Number(raw);
    if (raw === undefined || raw === "" || !Number.isFinite(value) || value < 0) {
      throw new Error(`--${name} needs a non-negative number, got ${raw}`);
    }
    options[name] = value;
  }
  for (const name of ["keys", "messages", "rate", "concurrency"]) {
    if (!(options[name] >= 1)) throw new Error(`--${name} must be at least 1`);
  }
  for (const name of ["agent-async", "agent-fail", "hook-fail", "reply-fail"]) {
    if (options[name] > 0.9) throw new Error(`--${name} is a share between 0 and 0.9`);
  }
  if (options["agent-async"] + options["agent-fail"] > 1) throw new Error("--agent-async + --agent-fail exceed 1");
  if (options.seed === null) options.seed = Math.floor(Math.random() * 2 ** 31);
  return options;
}

export function usage() {
  const lines = Object.entries(FLAGS).map(
    ([name, flag]) =>
      `  --${name.padEnd(14)} ${flag.help}${flag.value === null || flag.value === "" ? "" : ` (default ${flag.value})`}`,
  );
  return ["usage: npm run chaos -- [flags]", "", ...lines].join("\n");
}

/** mulberry32: a small, fast, seedable PRNG; `next()` is uniform in [0, 1). */
export function random(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
