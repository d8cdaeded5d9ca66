// npm run mutate -- routing: every unit of the routing Durable Object under
// src/routing/, reached through the DO binding by the lifecycle, agent, ingress,
// admin and platform tests. The model-based test (test/model) is left out: it
// covers nearly every mutant and costs ~10 s a run.
import { areaConfig } from "./base.mjs";

export default areaConfig("routing", {
  mutate: ["src/routing/**/*.ts"],
  testFiles: [
    "test/routing/**/*.test.ts",
    "test/lifecycle/**/*.test.ts",
    "test/agent/**/*.test.ts",
    "test/ingress/**/*.test.ts",
    "test/db/**/*.test.ts",
    "test/hooks/**/*.test.ts",
    "test/routes/**/*.test.ts",
    "test/attachments/**/*.test.ts",
    "test/platforms/**/*.test.ts",
    "test/sweep.test.ts",
  ],
});
