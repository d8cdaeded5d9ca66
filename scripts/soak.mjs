#!/usr/bin/env node
/**
 * npm run soak -- --steps N [--seed S] [--path P] [--max-commands M] [--strict] [--no-shrink] [--trace]
 *
 * Runs the model-based lifecycle test (test/model/) for as many steps as asked, in
 * workerd, and prints the seed and path of a failure so it can be replayed:
 *   npm run soak -- --seed S --path P      (replays exactly that run)
 * --strict turns off the known gaps of test/model/known-gaps.ts (then fails on them).
 */
import { spawn } from "node:child_process";

const args = process.argv.slice(2);
const option = (name) => {
  const at = args.indexOf(`--${name}`);
  return at >= 0 ? args[at + 1] : undefined;
};
const flag = (name) => args.includes(`--${name}`);

const steps = option("steps") ?? "2000";
const seed = option("seed") ?? String(Date.now() % 2 ** 31);
const path = option("path");
const maxCommands = option("max-commands");
const env = {
  ...process.env,
  WRANGLER_SEND_METRICS: "false",
  MODEL_STEPS: steps,
  MODEL_SEED: seed,
  // Generous: the whole soak runs as one test.
  MODEL_TIMEOUT_MS: String(Math.max(10 * 60_000, Number(steps) * 5_000)),
  ...(path ? { MODEL_PATH: path } : {}),
  ...(maxCommands ? { MODEL_MAX_COMMANDS: maxCommands } : {}),
  ...(flag("strict") ? { MODEL_STRICT: "1" } : {}),
  ...(flag("no-shrink") ? { MODEL_NO_SHRINK: "1" } : {}),
  ...(flag("trace") ? { MODEL_TRACE: "1" } : {}),
};

console.log(`soak: ${path ? `replaying seed ${seed} path ${path}` : `${steps} steps from seed ${seed}`}`);
const started = Date.now();
const child = spawn("npx", ["vitest", "run", "test/model/lifecycle.model.test.ts"], {
  env,
  stdio: ["ignore", "pipe", "pipe"],
});
let output = "";
for (const stream of [child.stdout, child.stderr]) {
  stream.on("data", (chunk) => {
    output += chunk;
    process.stdout.write(chunk);
  });
}
child.on("close", (code) => {
  const seconds = Math.round((Date.now() - started) / 1000);
  const plain = output.replace(/\u001b\[[0-9;]*m/g, "");
  const totals = plain.match(/model: (\d+) steps in (\d+) runs/);
  if (totals) console.log(`soak: ${totals[1]} steps in ${totals[2]} runs, ${seconds} s`);
  if (code === 0) {
    console.log("soak: no violation");
    process.exit(0);
  }
  const report = plain.match(/\{ seed: (-?\d+), path: "([^"]*)"/);
  if (report) {
    console.log(`soak: FAILED at seed ${report[1]} path ${report[2]}`);
    console.log(`soak: replay with: npm run soak -- --seed ${report[1]} --path ${report[2]}`);
  } else {
    console.log("soak: FAILED (no fast-check report found; see the output above)");
  }
  process.exit(code ?? 1);
});
