// npm run mutate -- domain: the pure rules of src/domain, scored by their own
// table-driven tests in test/domain (a domain rule is pinned next to it).
import { areaConfig } from "./base.mjs";

export default areaConfig("domain", {
  mutate: ["src/domain/**/*.ts"],
  testFiles: ["test/domain/**/*.test.ts"],
});
