// npm run mutate -- <area> [stryker options]
// Runs StrykerJS over one area (domain, routing, platforms) with its config in
// stryker/, then prints the mutation score of each file from the JSON report.
// Extra options go to `stryker run`, e.g. `--mutate src/domain/reset-policy.ts`.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";

const AREAS = ["domain", "routing", "platforms"];
const [area, ...rest] = process.argv.slice(2);
if (!AREAS.includes(area)) {
  console.error(`usage: npm run mutate -- <${AREAS.join("|")}> [stryker options]`);
  process.exit(2);
}

const started = Date.now();
const run = spawnSync("npx", ["stryker", "run", `stryker/${area}.config.mjs`, ...rest], {
  stdio: "inherit",
  env: { ...process.env, WRANGLER_SEND_METRICS: "false" },
});
const minutes = ((Date.now() - started) / 60000).toFixed(1);

const reportPath = `reports/mutation/${area}/mutation.json`;
if (existsSync(reportPath)) printScores(JSON.parse(readFileSync(reportPath, "utf8")));
console.log(`mutate: ${area} took ${minutes} min; report reports/mutation/${area}/mutation.html`);
process.exit(run.status ?? 1);

/** Score per file as Stryker counts it: detected (killed, timeout) over valid mutants. */
function printScores(report) {
  const DETECTED = ["Killed", "Timeout"];
  const UNDETECTED = ["Survived", "NoCoverage"];
  const rows = [];
  const total = { detected: 0, survived: 0, noCoverage: 0 };
  for (const [file, { mutants }] of Object.entries(report.files).sort()) {
    const count = (statuses) => mutants.filter((mutant) => statuses.includes(mutant.status)).length;
    const detected = count(DETECTED);
    const valid = detected + count(UNDETECTED);
    if (valid === 0) continue;
    const survived = count(["Survived"]);
    const noCoverage = count(["NoCoverage"]);
    total.detected += detected;
    total.survived += survived;
    total.noCoverage += noCoverage;
    rows.push([file, detected, survived, noCoverage, valid]);
  }
  const score = (detected, valid) => (valid === 0 ? "n/a" : `${((100 * detected) / valid).toFixed(1)}%`);
  console.log("\nmutation score per file (killed+timeout / valid; survived; no coverage)");
  for (const [file, detected, survived, noCoverage, valid] of rows) {
    console.log(
      `  ${score(detected, valid).padStart(6)}  ${file}  (${detected}/${valid}; ${survived} survived; ${noCoverage} no coverage)`,
    );
  }
  const valid = total.detected + total.survived + total.noCoverage;
  console.log(`  ${score(total.detected, valid).padStart(6)}  all files (${total.detected}/${valid})`);
}
