// The bench's own dependencies (autocannon, better-sqlite3) live in bench/package.json,
// out of the install every user and CI pays for: better-sqlite3 alone compiles for
// minutes when no prebuilt binary can be downloaded. Installed here on first use.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const BENCH = fileURLToPath(new URL(".", import.meta.url));
const NEEDED = ["autocannon", "better-sqlite3"];

const missing = NEEDED.filter((name) => !existsSync(join(BENCH, "node_modules", name, "package.json")));
if (missing.length > 0) {
  console.log(
    `bench: installing ${missing.join(", ")} into bench/node_modules (once; better-sqlite3 may compile for minutes)`,
  );
  const npm = process.platform === "win32" ? "npm.cmd" : "npm";
  execFileSync(npm, ["ci", "--no-audit", "--no-fund"], { cwd: BENCH, stdio: "inherit" });
}
