// The gateway under test: a snapshot of the sources started by scripts/start.sh
// (local D1 migrations, then `wrangler dev`) on a state directory of its own, in
// a process group of its own, so that `kill -9` of the group takes wrangler,
// esbuild and workerd down at once, exactly as a crash would.
import { execFileSync, spawn } from "node:child_process";
import {
  closeSync,
  cpSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { tail } from "../../bench/lib/proc.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What `npm start` needs. A snapshot, because another edit of src/ during the run
// would make wrangler dev rebuild and restart the worker: a restart nobody asked for.
const SOURCES = ["wrangler.toml", "package.json", "tsconfig.json", "worker-configuration.d.ts", "src", "migrations"];
const SCRIPTS = ["scripts/start.sh"];

/**
 * Copies the sources into `appDir` (from the work tree, or from the commit `ref`
 * when given), links the work tree's node_modules there, and writes `vars` as
 * its `.dev.vars`.
 */
export function prepareApp(root, appDir, vars, ref = null) {
  mkdirSync(join(appDir, "scripts"), { recursive: true });
  if (ref) {
    const git = (...args) => execFileSync("git", ["-C", root, ...args], { encoding: "utf8" });
    const commit = git("rev-parse", "--verify", `${ref}^{commit}`).trim();
    const paths = [...SOURCES, ...SCRIPTS].filter((name) => {
      try {
        git("cat-file", "-e", `${commit}:${name}`);
        return true;
      } catch {
        return false;
      }
    });
    const archive = join(appDir, "..", "sources.tar");
    git("archive", `--output=${archive}`, commit, ...paths);
    execFileSync("tar", ["-xf", archive, "-C", appDir]);
  } else {
    for (const name of [...SOURCES, ...SCRIPTS]) {
      if (existsSync(join(root, name))) cpSync(join(root, name), join(appDir, name), { recursive: true });
    }
  }
  symlinkSync(join(root, "node_modules"), join(appDir, "node_modules"), "dir");
  // .dev.vars is read by wrangler dev and overrides wrangler.toml, as for `npm start`.
  // Single quotes: the value is taken as written (JSON keeps its double quotes).
  const lines = Object.entries(vars).map(([name, value]) => {
    if (String(value).includes("'")) throw new Error(`${name}: a value with a single quote cannot go in .dev.vars`);
    return `${name}='${value}'`;
  });
  writeFileSync(join(appDir, ".dev.vars"), `${lines.join("\n")}\n`);
}

function childEnv(stateDir) {
  const env = { ...process.env };
  // Loopback only: no telemetry, no Request.cf download (as scripts/start.sh also sets).
  env.WRANGLER_SEND_METRICS = "false";
  env.CLOUDFLARE_CF_FETCH_ENABLED = "false";
  env.WRANGLER_LOG_PATH = join(stateDir, "wrangler-logs");
  env.NO_COLOR = "1";
  delete env.CLOUDFLARE_INCLUDE_PROCESS_ENV;
  delete env.FORCE_COLOR;
  return env;
}

/**
 * Live (not zombie) processes whose process group is `pgid`. Zombies are left out:
 * after a SIGKILL of the group, workerd's zombie waits for init to reap it, which
 * here can take a while (bench/lib/proc.mjs counts zombies, so its stopGroup would
 * wait and fail after every kill; that is why this file spawns on its own).
 */
function liveMembers(pgid) {
  const out = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[2]) === pgid && fields[0] !== "Z") out.push(Number(name));
    } catch {
      // exited while we looked
    }
  }
  return out;
}

export class Gateway {
  constructor({ appDir, stateDir, port, inspectorPort, startTimeoutMs, log }) {
    this.appDir = appDir;
    this.stateDir = stateDir;
    this.port = port;
    this.inspectorPort = inspectorPort;
    this.origin = `http://127.0.0.1:${port}`;
    this.startTimeoutMs = startTimeoutMs;
    this.log = log;
    this.child = null;
    this.starts = 0;
    this.startTimes = [];
  }

  get logFile() {
    return join(this.stateDir, `gateway-${this.starts}.log`);
  }

  /** Starts it as `npm start` does and waits until /healthz answers 200. */
  async start() {
    this.starts += 1;
    const began = Date.now();
    const args = [
      join(this.appDir, "scripts", "start.sh"),
      "--ip",
      "127.0.0.1",
      "--port",
      String(this.port),
      "--inspector-port",
      String(this.inspectorPort),
      "--persist-to",
      join(this.stateDir, "wrangler"),
      "--show-interactive-dev-session=false",
    ];
    const fd = openSync(this.logFile, "a");
    const child = spawn("sh", args, {
      cwd: this.appDir,
      env: childEnv(this.stateDir),
      detached: true,
      stdio: ["ignore", fd, fd],
    });
    closeSync(fd);
    child.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => resolve({ code, signal }));
      child.once("error", (error) => resolve({ code: null, signal: null, error }));
    });
    this.child = child;
    let exited = null;
    child.exited.then((outcome) => (exited = outcome));
    const deadline = began + this.startTimeoutMs;
    for (;;) {
      if (exited)
        throw new Error(`the gateway exited while starting (${exited.code ?? exited.signal}):\n${tail(this.logFile)}`);
      try {
        const response = await fetch(`${this.origin}/healthz`, { signal: AbortSignal.timeout(2000) });
        if (response.ok) break;
        // 500 names a configuration error: waiting will not fix it.
        if (response.status === 500) throw new Error(`the gateway answers /healthz 500: ${await response.text()}`);
      } catch (error) {
        if (String(error.message).includes("/healthz 500")) throw error;
        // not listening yet
      }
      if (Date.now() > deadline)
        throw new Error(`the gateway was not healthy after ${this.startTimeoutMs} ms:\n${tail(this.logFile)}`);
      await sleep(200);
    }
    this.startTimes.push(Date.now() - began);
    return Date.now() - began;
  }

  /** SIGKILL to the whole process group at once, then waits until none of it is left. */
  async kill9() {
    await this.signalAndWait("SIGKILL", 10_000);
  }

  /** Stops it gently (SIGTERM, then SIGKILL after 5 s), as at the end of the run. */
  async stop() {
    if (!this.child) return;
    try {
      await this.signalAndWait("SIGTERM", 5000);
    } catch {
      await this.signalAndWait("SIGKILL", 10_000);
    }
  }

  /** Last resort from a synchronous `exit` handler. */
  killSync() {
    if (!this.child) return;
    try {
      process.kill(-this.child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }

  async signalAndWait(signal, timeoutMs) {
    const child = this.child;
    if (!child) return;
    try {
      process.kill(-child.pid, signal);
    } catch {
      // already gone
    }
    const deadline = Date.now() + timeoutMs;
    while (liveMembers(child.pid).length > 0) {
      if (Date.now() > deadline)
        throw new Error(`process group ${child.pid} still alive ${timeoutMs} ms after ${signal}`);
      await sleep(50);
    }
    await child.exited;
    this.child = null;
  }
}
