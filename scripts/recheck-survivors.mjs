// npm run mutate:recheck -- <area> --tests <file,file,...> [--mutate <file,...>] [--report <mutation.json>]
//                                                     [--instrument <file,...>] [--lines <n,...>]
//
// Runs each mutant a Stryker report lists as survived or not covered again, by
// itself, against the named test files, in a copy of the repository (src/ and
// test/ are never touched). Stryker's per-test coverage in workerd can attribute
// code that a Durable Object runs in the background (an alarm, a drain, a
// restarted instance) to the wrong test, and then runs a mutant against tests that
// never reach it: a "survivor" that the tests do kill. This tells the two apart.
// `--instrument` takes the mutants from Stryker's own instrumenter instead of a
// report (every mutant of those files, with the ids and replacements a Stryker run
// uses, none run yet), so a file can be gone through without a Stryker run;
// `--lines` keeps only the mutants that start on those lines.
// Writes reports/mutation/<area>/recheck.json and prints what is left.
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { Instrumenter } from "@stryker-mutator/instrumenter";

const [area, ...rest] = process.argv.slice(2);
const option = (name) => {
  const at = rest.indexOf(`--${name}`);
  return at === -1 ? null : rest[at + 1].split(",").filter(Boolean);
};
const tests = option("tests");
const only = option("mutate");
const instrument = option("instrument");
const lines = option("lines")?.map(Number) ?? null;
const reportPath = option("report")?.[0] ?? `reports/mutation/${area}/mutation.json`;
if (!area || !tests || (!instrument && !existsSync(reportPath))) {
  console.error("usage: npm run mutate:recheck -- <area> --tests <file,...> [--mutate <file,...>] [--lines <n,...>]");
  console.error(
    `(needs ${reportPath}: run npm run mutate -- ${area ?? "<area>"} first, or pass --instrument <file,...>)`,
  );
  process.exit(2);
}

const report = instrument ? await instrumented(instrument) : JSON.parse(readFileSync(reportPath, "utf8"));

/** A report of every mutant Stryker's instrumenter makes in `files`, each still to run ("NoCoverage"). */
async function instrumented(files) {
  const quiet = () => undefined;
  const logger = {
    debug: quiet,
    info: quiet,
    trace: quiet,
    warn: console.warn,
    error: console.error,
    fatal: console.error,
  };
  for (const level of ["Trace", "Debug", "Info"]) logger[`is${level}Enabled`] = () => false;
  for (const level of ["Warn", "Error", "Fatal"]) logger[`is${level}Enabled`] = () => true;
  const sources = files.map((name) => ({ name, mutate: true, content: readFileSync(name, "utf8") }));
  const { mutants } = await new Instrumenter(logger).instrument(sources, {
    plugins: null,
    excludedMutations: [],
    ignorers: [],
    noHeader: true,
  });
  // The instrumenter counts lines and columns from 0; reports count both from 1.
  const at = ({ line, column }) => ({ line: line + 1, column: column + 1 });
  const result = { files: {} };
  for (const { name, content } of sources) result.files[name] = { source: content, mutants: [] };
  for (const mutant of mutants) {
    result.files[mutant.fileName].mutants.push({
      id: mutant.id,
      mutatorName: mutant.mutatorName,
      replacement: mutant.replacement,
      location: { start: at(mutant.location.start), end: at(mutant.location.end) },
      status: "NoCoverage",
    });
  }
  return result;
}
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
  const candidates = mutants.filter((m) => m.status === "Survived" || m.status === "NoCoverage");
  for (const mutant of candidates.filter((m) => !lines || lines.includes(m.location.start.line))) {
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
      id: mutant.id,
      was: mutant.status,
      status,
    });
    console.log(
      `${status.padEnd(8)} ${file}:${line}:${column} ${mutant.mutatorName} => ${JSON.stringify(mutant.replacement)}`,
    );
  }
}
rmSync(copy, { recursive: true, force: true });

mkdirSync(`reports/mutation/${area}`, { recursive: true });
writeFileSync(`reports/mutation/${area}/recheck.json`, JSON.stringify({ tests, results }, null, 2));
const left = results.filter((r) => r.status === "Survived");
const minutes = ((Date.now() - started) / 60000).toFixed(1);
console.log(
  `\nrecheck: ${results.length} mutants run again, ${results.length - left.length} killed, ${left.length} left (${minutes} min)`,
);
