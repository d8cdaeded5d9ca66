import { cloudflareTest, readD1Migrations } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

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
          },
        },
      }),
    ],
    // The gateway logs a JSON line per routed message: shown only for failing tests.
    test: { setupFiles: ["./test/setup.ts"], silent: "passed-only" as const },
  };
});
