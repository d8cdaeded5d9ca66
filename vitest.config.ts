import { cloudflareTest, readD1Migrations } from "@cloudflare/vitest-pool-workers";
import { configDefaults, defineConfig } from "vitest/config";

/** MODEL_STEPS, MODEL_SEED, MODEL_PATH, MODEL_MAX_COMMANDS, MODEL_TIMEOUT_MS, MODEL_TRACE from the environment, when set. */
function modelTestBindings(): Record<string, string> {
  const environment = (globalThis as unknown as { process: { env: Record<string, string | undefined> } }).process.env;
  const names = [
    "MODEL_STEPS",
    "MODEL_SEED",
    "MODEL_PATH",
    "MODEL_MAX_COMMANDS",
    "MODEL_TIMEOUT_MS",
    "MODEL_TRACE",
    "MODEL_NO_SHRINK",
    "MODEL_STRICT",
  ];
  return Object.fromEntries(names.filter((name) => environment[name]).map((name) => [name, environment[name]!]));
}

export default defineConfig(async () => {
  const migrations = await readD1Migrations("./migrations");
  return {
    plugins: [
      cloudflareTest({
        main: "./src/index.ts",
        wrangler: { configPath: "./wrangler.toml" },
        miniflare: {
          bindings: {
            TEST_MIGRATIONS: migrations,
            GENERIC_WEBHOOK_SECRET: "test-generic-secret",
            ADMIN_TOKEN: "test-admin-token",
            // Most tests drive staged work with runDurableObjectAlarm, one step at a
            // time; test/routing/inline-drain.test.ts covers the default, inline.
            OUTBOX_DRAIN: "alarm",
            // The model-based test's budget and replay (npm run soak sets them).
            ...modelTestBindings(),
          },
        },
      }),
    ],
    // The gateway logs a JSON line per routed message: shown only for failing tests.
    test: {
      setupFiles: ["./test/setup.ts"],
      silent: "passed-only" as const,
      // A failed mutation run (npm run mutate) leaves instrumented copies of the repo there.
      exclude: [...configDefaults.exclude, ".stryker-tmp/**"],
    },
  };
});
