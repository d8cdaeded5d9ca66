// npm run mutate:recheck -- <area> --tests <file,file,...> [--mutate <file,...>] [--report <mutation.json>]
//
// Runs each mutant a Stryker report lists as survived or not covered again, by
// itself, against the named test files, in a copy of the repository (src/ and
// test/ are never touched). Stryker's per-test coverage in workerd can attribute
// code that a Durable Object runs in the background (an alarm, a drain, a
// restarted instance) to the wrong test, and then runs a mutant against tests that
// never reach it: a "survivor" that the tests do kill. This tells the two apart.
// Writes reports/mutation/<area>/recheck.json and prints what is left.
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [area, ...rest] = process.argv.slice(2);
const option = (name) => {
  const at = rest.indexOf(`--${name}`);
  return at === -1 ? null : rest[at + 1].split(",").filter(Boolean);
};
const tests = option("tests");
const only = option("mutate");
const reportPath = option("report")?.[0] ?? `reports/mutation/${area}/mutation.json`;
if (!area || !tests || !existsSync(reportPath)) {
  console.error("usage: npm run mutate:recheck -- <area> --tests <file,...> [--mutate <file,...>]");
  console.error(`(needs ${reportPath}: run npm run mutate -- ${area ?? "<area>"} first)`);
  process.exit(2);
}

const report = JSON.parse(readFileSync(reportPath, "utf8"));
const root = resolve(".");
const copy = mkdtempSync(join(tmpdir(), "recheck-"));
for (const entry of [
  "src",
  "test",
  "migrations",
  "vitest.config.ts",
  "wrangler.toml",
  "package.json",
  "tsconfig.json",
]) {
  if (existsSync(entry)) cpSync(entry, join(copy, entry), { recursive: true });
}
symlinkSync(join(root, "node_modules"), join(copy, "node_modules"));

/** The source with one mutant applied (Stryker's locations: lines and columns from 1). */
function mutated(source, { start, end }, replacement) {
  const lines = source.split("\n");
  const offset = (at) => lines.slice(0, at.line - 1).reduce((sum, line) => sum + line.length + 1, 0) + at.column - 1;
  return source.slice(0, offset(start)) + replacement + source.slice(offset(end));
}

const started = Date.now();
const results = [];
for (const [file, { source, mutants }] of Object.entries(report.files).sort()) {
  if (only && !only.includes(file)) continue;
  for (const mutant of mutants.filter((m) => m.status === "Survived" || m.status === "NoCoverage")) {
    writeFileSync(join(copy, file), mutated(source, mutant.location, mutant.replacement));
    const run = spawnSync("npx", ["vitest", "run", "--bail", "1", ...tests], {
      cwd: copy,
      encoding: "utf8",
      timeout: 300_000,
      env: { ...process.env, WRANGLER_SEND_METRICS: "false" },
    });
    const status = run.error ? "Timeout" : run.status === 0 ? "Survived" : "Killed";
    writeFileSync(join(copy, file), source);
    const { line, column } = mutant.location.start;
    results.push({
      file,
      line,
      column,
      mutator: mutant.mutatorName,
      replacement: mutant.replacement,
      was: mutant.status,
      status,
    });
    console.log(
      `${status.padEnd(8)} ${file}:${line}:${column} ${mutant.mutatorName} => ${JSON.stringify(mutant.replacement)}`,
    );
  }
}
rmSync(copy, { recursive: true, force: true });

writeFileSync(`reports/mutation/${area}/recheck.json`, JSON.stringify({ tests, results }, null, 2));
const left = results.filter((r) => r.status === "Survived");
const minutes = ((Date.now() - started) / 60000).toFixed(1);
console.log(
  `\nrecheck: ${results.length} mutants run again, ${results.length - left.length} killed, ${left.length} left (${minutes} min)`,
);
