// Settings shared by every mutation-testing area (see docs/mutation-testing.md).
// Each area config (domain, routing, platforms) adds what it mutates, the test
// files that may kill its mutants, and where its reports go.

/**
 * @param {string} area the area's name, used for its report paths
 * @param {{ mutate: string[], testFiles: string[] }} scope
 * @returns {import("@stryker-mutator/api/core").PartialStrykerOptions}
 */
export function areaConfig(area, { mutate, testFiles }) {
  return {
    packageManager: "npm",
    testRunner: "vitest",
    // The suite runs in workerd through @cloudflare/vitest-pool-workers. Most
    // code is reached through the worker's fetch or the Durable Object binding,
    // not an import, so vitest's "related" lookup would find no tests (or, via
    // test/helpers.ts -> src/config.ts, all of them): name the test files instead.
    vitest: { configFile: "vitest.config.ts", related: false },
    testFiles,
    mutate,
    // Stryker records which tests reach each mutant and runs only those.
    coverageAnalysis: "perTest",
    // Two shared cores: one sandbox at a time.
    concurrency: 1,
    // Top-level mutants (tables, schemas) would need a fresh workerd and every test each.
    ignoreStatic: true,
    // TypeScript 7 lacks the JS API Stryker's tsconfig rewriting calls: point it at a
    // file that does not exist so that step is skipped (the sandbox needs no rewrite).
    tsconfigFile: "stryker/no-such-tsconfig.json",
    timeoutMS: 10000,
    dryRunTimeoutMinutes: 20,
    ignorePatterns: [".wrangler", "bench/.state", "bench/results", "test/browser", "reports"],
    reporters: ["clear-text", "progress", "html", "json"],
    clearTextReporter: { allowColor: false, logTests: false, reportMutants: true, reportScoreTable: true },
    htmlReporter: { fileName: `reports/mutation/${area}/mutation.html` },
    jsonReporter: { fileName: `reports/mutation/${area}/mutation.json` },
    // Reruns keep the results of mutants whose code and covering tests did not change.
    incremental: true,
    incrementalFile: `reports/mutation/${area}/incremental.json`,
  };
}
