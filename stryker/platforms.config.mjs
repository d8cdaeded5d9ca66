// npm run mutate -- platforms: verify, parse and send of each chat platform,
// reached through the worker's own fetch (webhooks, replies, attachments).
import { areaConfig } from "./base.mjs";

export default areaConfig("platforms", {
  mutate: ["src/platforms/**/*.ts"],
  testFiles: [
    "test/platforms/**/*.test.ts",
    "test/ingress/**/*.test.ts",
    "test/attachments/**/*.test.ts",
    "test/routes/utf8.test.ts",
    "test/domain/config.test.ts",
  ],
});
