#!/usr/bin/env node
/**
 * npm run soak -- --steps N [--seed S] [--chunk C] [--path P] [--max-commands M] [--strict] [--no-shrink] [--trace]
 *
 * Runs the model-based lifecycle test (test/model/) for as many steps as asked, in
 * workerd, and prints the seed and path of a failure so it can be replayed:
 *   npm run soak -- --seed S --path P      (replays exactly that run)
 * --strict turns off the known gaps of test/model/known-gaps.ts (then fails on them).
 *
 * The steps run in chunks of C (default 300), one vitest process (one workerd) per
 * chunk, chunk i from seed S + 1000 i (a chunk itself moves on to S + 1, S + 2, ...
 * when one seed's runs fall short of its steps): the pinned vitest-pool-workers wraps a Durable
 * Object class's prototype in one more Proxy each time an object is constructed, so
 * one process that constructs thousands of routing objects ends with a Proxy chain
 * deep enough to overflow the stack. A fresh process per chunk keeps it shallow.
 */
import { spawn } from "node:child_process";

const args = process.argv.slice(2);
const option = (name) => {
  const at = args.indexOf(`--${name}`);
  return at >= 0 ? args[at + 1] : undefined;
};
const flag = (name) => args.includes(`--${name}`);

const totalSteps = Number(option("steps") ?? "2000");
const chunkSteps = Math.max(1, Number(option("chunk") ?? "300"));
const firstSeed = Number(option("seed") ?? String(Date.now() % 2 ** 31));
const path = option("path");
const maxCommands = option("max-commands");
// Chunks start this far apart, so their seeds never overlap.
const SEED_STRIDE = 1000;

/** One vitest process over `steps` steps from `seed`; resolves with its outcome. */
function runChunk(seed, steps) {
  const env = {
    ...process.env,
    WRANGLER_SEND_METRICS: "false",
    MODEL_STEPS: String(steps),
    MODEL_SEED: String(seed),
    // Generous: the whole chunk runs as one test.
    MODEL_TIMEOUT_MS: String(Math.max(10 * 60_000, steps * 5_000)),
    ...(path ? { MODEL_PATH: path } : {}),
    ...(maxCommands ? { MODEL_MAX_COMMANDS: maxCommands } : {}),
    ...(flag("strict") ? { MODEL_STRICT: "1" } : {}),
    ...(flag("no-shrink") ? { MODEL_NO_SHRINK: "1" } : {}),
    ...(flag("trace") ? { MODEL_TRACE: "1" } : {}),
  };
  return new Promise((resolve) => {
    const child = spawn("npx", ["vitest", "run", "--silent=false", "test/model/lifecycle.model.test.ts"], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    current = child;
    let output = "";
    for (const stream of [child.stdout, child.stderr]) {
      stream.on("data", (chunk) => {
        output += chunk;
        process.stdout.write(chunk);
      });
    }
    child.on("close", (code) => {
      current = null;
      const plain = output.replace(/\u001b\[[0-9;]*m/g, "");
      const totals = plain.match(/model: (\d+) steps in (\d+) runs/);
      const report = plain.match(/\{ seed: (-?\d+), path: "([^"]*)"/);
      resolve({
        code: code ?? 1,
        steps: totals ? Number(totals[1]) : 0,
        runs: totals ? Number(totals[2]) : 0,
        report: report ? { seed: report[1], path: report[2] } : null,
      });
    });
  });
}

let current = null;
process.on("SIGINT", () => {
  current?.kill("SIGINT");
  process.exit(130);
});

const started = Date.now();
const seconds = () => Math.round((Date.now() - started) / 1000);
let steps = 0;
let runs = 0;

if (path) {
  console.log(`soak: replaying seed ${firstSeed} path ${path}`);
  const outcome = await runChunk(firstSeed, totalSteps);
  steps = outcome.steps;
  runs = outcome.runs;
  finish(outcome, firstSeed);
} else {
  const chunks = Math.ceil(totalSteps / chunkSteps);
  console.log(`soak: ${totalSteps} steps from seed ${firstSeed}, ${chunks} chunk(s) of up to ${chunkSteps}`);
  for (let chunk = 0; chunk < chunks && steps < totalSteps; chunk++) {
    const seed = firstSeed + chunk * SEED_STRIDE;
    const outcome = await runChunk(seed, Math.min(chunkSteps, totalSteps - steps));
    steps += outcome.steps;
    runs += outcome.runs;
    console.log(
      `soak: chunk ${chunk + 1}/${chunks} (seed ${seed}): ${outcome.steps} steps; ${steps} in all, ${seconds()} s`,
    );
    if (outcome.code !== 0 || outcome.steps === 0) finish(outcome, seed);
  }
  finish({ code: 0 }, firstSeed);
}

function finish(outcome, seed) {
  console.log(`soak: ${steps} steps in ${runs} runs, ${seconds()} s`);
  if (outcome.code === 0 && (path || steps > 0)) {
    console.log("soak: no violation");
    process.exit(0);
  }
  if (outcome.report) {
    console.log(`soak: FAILED at seed ${outcome.report.seed} path ${outcome.report.path}`);
    console.log(`soak: replay with: npm run soak -- --seed ${outcome.report.seed} --path ${outcome.report.path}`);
  } else {
    console.log(`soak: FAILED in the chunk on seed ${seed} (no fast-check report found; see the output above)`);
  }
  process.exit(outcome.code || 1);
}
