#!/usr/bin/env node
// `npm run bench`: sessiongate and the floor (bench/floor/), side by side, on this
// machine. For each target: a fresh state directory, the local D1 migrations, then
// `wrangler dev` on local D1 and Durable Objects (the gateway exactly as `npm start`
// runs it: echo agent, no hooks, no reply URL), and four scenarios driven over
// loopback: steady, cold, burst and grown. Prints a table of each gateway figure
// and its ratio to the floor's, and writes the whole run to bench/results/.
// See bench/README.md.
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { abortLoad, manyKeys, oneKey, round, runLoad, signedRequests } from "./lib/load.mjs";
import {
  freePort,
  killAllGroupsSync,
  RssMonitor,
  runToEnd,
  startGroup,
  stopAllGroups,
  stopGroup,
  tail,
} from "./lib/proc.mjs";
import { budget, perMessage, table } from "./lib/report.mjs";
import { checkSequence, findD1File, seedGrown } from "./lib/seed.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const WRANGLER = join(ROOT, "node_modules", "wrangler", "bin", "wrangler.js");
const STATE = join(ROOT, "bench", ".state");
const RESULTS = join(ROOT, "bench", "results");
const SCENARIOS = ["steady", "cold", "burst", "grown"];

// Each target runs from a snapshot of its sources taken when its turn starts, so an
// edit made in the work tree during a run cannot make wrangler dev rebuild and
// restart the worker mid-scenario (that answers in-flight requests with 503s).
const TARGETS = {
  gateway: {
    source: ROOT,
    files: ["wrangler.toml", "package.json", "tsconfig.json", "worker-configuration.d.ts", "src", "migrations"],
    describe: "sessiongate: the root wrangler.toml, src/ and migrations/, run as `npm start` runs them",
  },
  floor: {
    source: join(ROOT, "bench", "floor"),
    files: ["wrangler.toml", "tsconfig.json", "src", "migrations"],
    describe: "bench/floor/",
  },
};

// ------------------------------------------------------------------ configuration

function readConfig(env) {
  const scale = Number(env.BENCH_SCALE ?? "1");
  if (!(scale > 0)) throw new Error(`BENCH_SCALE must be a positive number, got ${env.BENCH_SCALE}`);
  const int = (name, fallback, min = 1) => {
    const raw = env[name];
    const value = raw === undefined || raw === "" ? fallback : Number(raw);
    if (!Number.isInteger(value) || value < min) throw new Error(`${name} must be an integer >= ${min}, got ${raw}`);
    return value;
  };
  const scaled = (n, min = 1) => Math.max(min, Math.round(n * scale));
  const list = (name, all, fallback) => {
    const values = (env[name] ?? fallback.join(","))
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    const unknown = values.filter((v) => !all.includes(v));
    if (unknown.length > 0) throw new Error(`${name}: unknown ${unknown.join(", ")} (choose from ${all.join(", ")})`);
    return values;
  };
  return {
    scale,
    targets: list("BENCH_TARGETS", Object.keys(TARGETS), Object.keys(TARGETS)),
    scenarios: list("BENCH_SCENARIOS", SCENARIOS, SCENARIOS),
    connections: int("BENCH_CONNECTIONS", 64),
    steady_keys: int("BENCH_STEADY_KEYS", scaled(1000)),
    steady_per_key: int("BENCH_STEADY_PER_KEY", 20),
    cold_messages: int("BENCH_COLD_MESSAGES", scaled(5000)),
    burst_messages: int("BENCH_BURST", 200),
    grown_sessions: int("BENCH_GROWN_SESSIONS", scaled(100_000)),
    grown_messages: int("BENCH_GROWN_MESSAGES", scaled(1_000_000), 0),
    warmup_messages: int("BENCH_WARMUP", 200, 0),
    max_scenario_seconds: int("BENCH_MAX_SECONDS", 900),
    drain_timeout_seconds: int("BENCH_DRAIN_TIMEOUT", 300),
    settle_ms: int("BENCH_SETTLE_MS", 2000),
    start_timeout_seconds: int("BENCH_START_TIMEOUT", 180),
    log_level: env.BENCH_LOG_LEVEL ?? "warn",
    // Extra gateway variables, `NAME=value` comma-separated (e.g. OUTBOX_DRAIN=alarm).
    gateway_vars: (env.BENCH_GATEWAY_VARS ?? "")
      .split(",")
      .map((pair) => pair.trim())
      .filter(Boolean)
      .map((pair) => {
        const at = pair.indexOf("=");
        if (at < 1) throw new Error(`BENCH_GATEWAY_VARS: expected NAME=value, got ${pair}`);
        return `${pair.slice(0, at)}:${pair.slice(at + 1)}`;
      }),
  };
}

// ------------------------------------------------------------------ small helpers

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const t0 = Date.now();
const stamp = () => `[${((Date.now() - t0) / 1000).toFixed(1).padStart(6)}s]`;
const say = (...parts) => console.log(stamp(), ...parts);

function childEnv(stateDir) {
  const env = { ...process.env };
  // Nothing here needs the internet (the same as scripts/start.sh), and no variable
  // leaks in from the shell or a .dev.vars: only what --var passes.
  env.WRANGLER_SEND_METRICS = "false";
  env.CLOUDFLARE_CF_FETCH_ENABLED = "false";
  env.WRANGLER_LOG_PATH = join(stateDir, "wrangler-logs");
  env.NO_COLOR = "1";
  delete env.CLOUDFLARE_INCLUDE_PROCESS_ENV;
  delete env.FORCE_COLOR;
  return env;
}

async function getJson(server, path, { timeoutMs = 30_000 } = {}) {
  const response = await fetch(`${server.origin}${path}`, {
    headers: { authorization: `Bearer ${server.adminToken}` },
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`GET ${path}: ${response.status} ${text.slice(0, 300)}`);
  return JSON.parse(text);
}

const COUNTERS = [
  "messages_routed",
  "d1_queries",
  "d1_rows_read",
  "d1_rows_written",
  "d1_batches_ingress",
  "d1_queries_ingress",
  "d1_rows_read_ingress",
  "d1_rows_written_ingress",
  "do_rows_read",
  "do_rows_written",
];

const counters = (metrics) => Object.fromEntries(COUNTERS.map((k) => [k, metrics[k]]));
const signature = (metrics) =>
  ["messages_routed", "d1_queries", "d1_rows_read", "d1_rows_written"].map((k) => metrics[k]).join("/");

function delta(before, after) {
  return Object.fromEntries(
    COUNTERS.map((k) => [
      k,
      typeof after[k] === "number" && typeof before[k] === "number" ? after[k] - before[k] : undefined,
    ]),
  );
}

// ------------------------------------------------------------------ one wrangler dev

async function startServer(ctx, target, label) {
  const port = await freePort();
  const inspectorPort = await freePort();
  const logFile = join(ctx.stateDir, `wrangler-dev-${label}.log`);
  const args = [
    WRANGLER,
    "dev",
    "--ip",
    "127.0.0.1",
    "--port",
    String(port),
    "--inspector-port",
    String(inspectorPort),
    "--persist-to",
    ctx.stateDir,
    "--var",
    `GENERIC_WEBHOOK_SECRET:${ctx.secret}`,
    "--var",
    `ADMIN_TOKEN:${ctx.adminToken}`,
    ...(target === "gateway" ? ctx.config.gateway_vars.flatMap((v) => ["--var", v]) : []),
    "--env-file",
    ctx.emptyEnvFile,
    "--show-interactive-dev-session=false",
    "--log-level",
    ctx.config.log_level,
  ];
  const started = Date.now();
  const child = startGroup(process.execPath, args, { cwd: ctx.appDir, env: childEnv(ctx.stateDir), logFile });
  const server = {
    child,
    origin: `http://127.0.0.1:${port}`,
    adminToken: ctx.adminToken,
    rss: new RssMonitor(child.pid),
    logFile,
    settled: null,
  };
  let exited = null;
  child.exited.then((outcome) => (exited = outcome));
  const deadline = Date.now() + ctx.config.start_timeout_seconds * 1000;
  for (;;) {
    if (exited) {
      await stopServer(server);
      throw new Error(
        `wrangler dev (${target}) exited (${exited.code ?? exited.signal}): ${reasonIn(logFile)}\n${tail(logFile)}`,
      );
    }
    try {
      const response = await fetch(`${server.origin}/healthz`, { signal: AbortSignal.timeout(2000) });
      if (response.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stopServer(server);
      throw new Error(
        `wrangler dev (${target}) not healthy after ${ctx.config.start_timeout_seconds}s:\n${tail(logFile)}`,
      );
    }
    await sleep(200);
  }
  server.startMs = Date.now() - started;
  return server;
}

/** The first error line of a wrangler log, else its last line. */
function reasonIn(logFile) {
  const lines = tail(logFile, 400)
    .split("\n")
    .map((line) => line.replace(/\x1b\[[0-9;]*m/g, "").trim())
    .filter(Boolean);
  return lines.find((line) => /ERROR|✘|Invalid values|Error:/.test(line)) ?? lines[lines.length - 1] ?? "";
}

async function stopServer(server) {
  server.rss.stop();
  await stopGroup(server.child.pid);
}

/**
 * Waits until background work has drained: the totals (messages, D1 queries, rows)
 * have not changed for `settle_ms`. Bounded by the drain timeout.
 */
async function drain(ctx, server, sinceMs = Date.now()) {
  let metrics = await getJson(server, "/admin/metrics");
  let last = signature(metrics);
  let lastChange = Date.now();
  let polls = 0;
  const deadline = Date.now() + ctx.config.drain_timeout_seconds * 1000;
  while (Date.now() - lastChange < ctx.config.settle_ms || polls < 4) {
    if (Date.now() > deadline) {
      return { metrics, timed_out: true, settled_after_ms: null };
    }
    await sleep(250);
    polls += 1;
    metrics = await getJson(server, "/admin/metrics");
    const now = signature(metrics);
    if (now !== last) {
      last = now;
      lastChange = Date.now();
    }
  }
  server.settled = last;
  return { metrics, timed_out: false, settled_after_ms: Math.max(0, lastChange - sinceMs) };
}

/** A quiescent baseline: the last drained figures if nothing moved since, else drain again. */
async function baseline(ctx, server) {
  const metrics = await getJson(server, "/admin/metrics");
  if (server.settled !== null && signature(metrics) === server.settled) return metrics;
  return (await drain(ctx, server)).metrics;
}

async function runScenario(ctx, server, name, messages, connections) {
  const requests = signedRequests(ctx.secret, messages);
  const before = await baseline(ctx, server);
  const runtimeBefore = server.rss.workerdPids().join(",");
  server.rss.mark();
  say(`${ctx.target} ${name}: ${requests.length} messages, ${Math.min(connections, requests.length)} in flight`);
  const load = await runLoad({
    origin: server.origin,
    requests,
    connections,
    maxSeconds: ctx.config.max_scenario_seconds,
  });
  const loadEnded = Date.now();
  const ingress = await getJson(server, "/admin/metrics");
  const drained = await drain(ctx, server, loadEnded);
  const rss = server.rss.mark();
  const runtimeAfter = server.rss.workerdPids().join(",");
  const d = delta(before, drained.metrics);
  const result = {
    load,
    messages_routed: d.messages_routed,
    delta: d,
    delta_ingress_at_last_ack: delta(before, ingress),
    // Per message stored (messages_routed); equal to the requests sent when all were acknowledged.
    per_message: perMessage(d, d.messages_routed > 0 ? d.messages_routed : load.requests),
    drain: { settled_after_ms: drained.settled_after_ms, timed_out: drained.timed_out },
    rss: { sum_kb: rss.sumKb, max_process_kb: rss.maxKb, processes: rss.processes },
  };
  const problems = [];
  if (load.ok !== load.requests) {
    const other = Object.entries(load.statuses).filter(([status]) => status !== "200");
    problems.push(
      `${load.requests - load.ok} of ${load.requests} not acknowledged (${[
        ...other.map(([status, n]) => `${n} x ${status}`),
        ...(load.unanswered > 0 ? [`${load.unanswered} connection closed without an answer`] : []),
      ].join(", ")})`,
    );
  }
  if (load.accepted !== load.ok) problems.push(`${load.ok - load.accepted} answers without "accepted":true`);
  if (d.messages_routed !== load.requests)
    problems.push(`messages_routed grew by ${d.messages_routed}, not ${load.requests}`);
  if (load.overflow > 0) problems.push(`${load.overflow} requests were resent`);
  if (load.stopped_early) problems.push(`stopped after BENCH_MAX_SECONDS=${ctx.config.max_scenario_seconds}`);
  if (drained.timed_out) problems.push(`background work still running after BENCH_DRAIN_TIMEOUT`);
  if (runtimeBefore !== runtimeAfter || COUNTERS.some((k) => d[k] < 0)) {
    problems.push("workerd restarted during the scenario (wrangler dev reloads when a source file changes): not valid");
  }
  if (load.failures.length > 0) problems.push(`first failures: ${load.failures.slice(0, 3).join(" | ")}`);
  result.problems = problems;
  if (problems.length > 0) result.wrangler_log_tail = tail(server.logFile, 60);
  say(
    `${ctx.target} ${name}: ${load.messages_per_second} msg/s, p50 ${load.latency_ms.p50} ms, p99 ${load.latency_ms.p99} ms,` +
      ` drained ${drained.settled_after_ms ?? "?"} ms after the last ack${problems.length ? ` — ${problems.join("; ")}` : ""}`,
  );
  return result;
}

/** Burst check through the operator API: one session, every message once, times non-decreasing. */
async function verifyBurstApi(server, prefix, count, acknowledged) {
  const key = `generic:dm:${prefix}`;
  const { sessions } = await getJson(server, `/admin/sessions?key=${encodeURIComponent(key)}`);
  const out = { session_key: key, sessions: sessions.length };
  if (sessions.length !== 1) return { ...out, ok: false, summary: `${sessions.length} sessions for the key` };
  const id = sessions[0].id;
  const { messages } = await getJson(server, `/admin/sessions/${encodeURIComponent(id)}`);
  const users = messages.filter((m) => m.role === "user");
  const tags = users.map((m) => Number(/#(\d+) of/.exec(m.text)?.[1] ?? NaN));
  const seen = new Map();
  for (const tag of tags) seen.set(tag, (seen.get(tag) ?? 0) + 1);
  const missing = [];
  for (let i = 1; i <= count; i++) if (!seen.has(i)) missing.push(i);
  const duplicated = [...seen].filter(([, n]) => n > 1).map(([tag]) => tag);
  let decreasingAt = 0;
  for (let i = 1; i < messages.length; i++) if (messages[i].at < messages[i - 1].at) decreasingAt += 1;
  let inversions = 0;
  for (let i = 1; i < tags.length; i++) if (tags[i] < tags[i - 1]) inversions += 1;
  const seqs = messages.map((m) => m.seq).filter((s) => typeof s === "number");
  const seqOk = seqs.length === 0 ? null : seqs.every((s, i) => s === i + 1);
  const ok =
    users.length === count && missing.length === 0 && duplicated.length === 0 && decreasingAt === 0 && seqOk !== false;
  return {
    ...out,
    session_id: id,
    ok,
    // Every acknowledged message stored exactly once (those refused with a non-2xx may be missing).
    acknowledged,
    acknowledged_stored_once: users.length === acknowledged && duplicated.length === 0,
    messages: messages.length,
    user_messages: users.length,
    assistant_messages: messages.filter((m) => m.role === "assistant").length,
    missing: missing.slice(0, 20),
    missing_count: missing.length,
    duplicated: duplicated.slice(0, 20),
    created_at_decreases: decreasingAt,
    api_seq_contiguous: seqOk,
    // Informational: 200 requests on 200 connections reach the server in no fixed order.
    stored_order_vs_send_order_inversions: inversions,
  };
}

// ------------------------------------------------------------------ one target

async function runTarget(ctx) {
  const { config, target } = ctx;
  const timings = {};
  const scenarios = {};
  const wants = (name) => config.scenarios.includes(name);
  const time = async (name, fn) => {
    const started = Date.now();
    try {
      return await fn();
    } finally {
      timings[name] = Date.now() - started;
    }
  };

  rmSync(ctx.stateDir, { recursive: true, force: true });
  mkdirSync(ctx.stateDir, { recursive: true });
  writeFileSync(ctx.emptyEnvFile, "");
  const snapshot = takeSnapshot(target, ctx.appDir);
  say(`${target}: fresh state in ${relative(ROOT, ctx.stateDir)}; applying D1 migrations`);
  await time("migrate_ms", () =>
    runToEnd(process.execPath, [WRANGLER, "d1", "migrations", "apply", "DB", "--local", "--persist-to", ctx.stateDir], {
      cwd: ctx.appDir,
      env: childEnv(ctx.stateDir),
      logFile: join(ctx.stateDir, "migrations.log"),
      timeoutMs: 180_000,
    }),
  );

  const warm = async (server, tag) => {
    if (config.warmup_messages === 0) return;
    const keys = Math.min(10, config.warmup_messages);
    const perKey = Math.ceil(config.warmup_messages / keys);
    const requests = signedRequests(ctx.secret, manyKeys(`warmup-${tag}-${ctx.runTag}`, keys, perKey));
    await runLoad({ origin: server.origin, requests, connections: config.connections, maxSeconds: 120 });
    await drain(ctx, server);
  };

  let server = null;
  try {
    const first = ["steady", "cold", "burst"].filter(wants);
    if (first.length > 0) {
      server = await time("start_ms", () => startServer(ctx, target, "1"));
      say(`${target}: wrangler dev healthy at ${server.origin} after ${server.startMs} ms`);
      await time("warmup_ms", () => warm(server, "1"));
      if (wants("steady")) {
        const messages = manyKeys(`steady-${ctx.runTag}`, config.steady_keys, config.steady_per_key);
        scenarios.steady = await time("steady_ms", () =>
          runScenario(ctx, server, "steady", messages, config.connections),
        );
      }
      if (wants("cold")) {
        const messages = manyKeys(`cold-${ctx.runTag}`, config.cold_messages, 1);
        scenarios.cold = await time("cold_ms", () => runScenario(ctx, server, "cold", messages, config.connections));
      }
      let burstApi = null;
      const burstPrefix = `burst-${ctx.runTag}`;
      if (wants("burst")) {
        const messages = oneKey(burstPrefix, config.burst_messages);
        scenarios.burst = await time("burst_ms", () =>
          runScenario(ctx, server, "burst", messages, config.burst_messages),
        );
        burstApi = await time("burst_verify_api_ms", () =>
          verifyBurstApi(server, burstPrefix, config.burst_messages, scenarios.burst.load.ok),
        );
      }
      await time("stop_ms", () => stopServer(server));
      server = null;
      if (burstApi) {
        const file = findD1File(ctx.stateDir);
        const db = burstApi.session_id ? checkSequence(file, burstApi.session_id) : null;
        const ok = burstApi.ok && db !== null && db.seq_contiguous && db.user_messages === config.burst_messages;
        const summary = ok
          ? `${burstApi.user_messages} user messages once each in one session, seq 1..${db.messages} contiguous, created_at non-decreasing`
          : burstApi.sessions !== 1
            ? `FAILED: ${burstApi.sessions} sessions for the key`
            : `FAILED: ${burstApi.user_messages} of ${config.burst_messages} stored` +
              ` (missing ${burstApi.missing_count}${burstApi.missing_count ? `: #${burstApi.missing.join(", #")}` : ""};` +
              ` ${config.burst_messages - burstApi.acknowledged} not acknowledged);` +
              ` every acknowledged message stored once: ${burstApi.acknowledged_stored_once ? "yes" : "NO"};` +
              ` duplicates ${burstApi.duplicated.length}; created_at decreases ${burstApi.created_at_decreases};` +
              ` D1 seq 1..${db?.messages} contiguous: ${db?.seq_contiguous ? "yes" : "NO"}`;
        scenarios.burst.verify = { ok, summary, api: burstApi, d1: db };
        say(`${target} burst check: ${summary}`);
      }
    }

    if (wants("grown")) {
      const file = findD1File(ctx.stateDir);
      say(`${target} grown: seeding ${config.grown_sessions} ended sessions, ${config.grown_messages} messages`);
      const seed = await time("seed_ms", () =>
        seedGrown(file, { sessions: config.grown_sessions, messages: config.grown_messages }),
      );
      say(
        `${target} grown: seeded in ${seed.ms} ms; D1 now holds ${seed.totals.sessions} sessions, ${seed.totals.messages} messages`,
      );
      server = await time("restart_ms", () => startServer(ctx, target, "2"));
      await time("grown_warmup_ms", () => warm(server, "2"));
      const messages = manyKeys(`grown-${ctx.runTag}`, config.steady_keys, config.steady_per_key);
      scenarios.grown = await time("grown_ms", () => runScenario(ctx, server, "grown", messages, config.connections));
      scenarios.grown.seed = seed;
      await time("grown_stop_ms", () => stopServer(server));
      server = null;
    }
  } finally {
    if (server) await stopServer(server).catch((error) => console.error(String(error)));
  }
  return { snapshot, scenarios, timings };
}

/** Copies the target's sources to `appDir`; returns a digest of what was copied. */
function takeSnapshot(target, appDir) {
  const { source, files } = TARGETS[target];
  mkdirSync(appDir, { recursive: true });
  const hash = createHash("sha256");
  let count = 0;
  const walk = (rel) => {
    const from = join(source, rel);
    if (statSync(from).isDirectory()) {
      for (const name of readdirSync(from).sort()) walk(join(rel, name));
      return;
    }
    hash.update(`${rel}\0`).update(readFileSync(from)).update("\0");
    count += 1;
  };
  for (const name of files) {
    if (!existsSync(join(source, name))) continue;
    cpSync(join(source, name), join(appDir, name), { recursive: true });
    walk(name);
  }
  // Packages resolve from the work tree's node_modules (an ancestor of appDir).
  return { from: relative(ROOT, source) || ".", files: count, sha256: hash.digest("hex").slice(0, 16) };
}

// ------------------------------------------------------------------ main

function versions() {
  const version = (name) => {
    try {
      const local = join(ROOT, "bench", "node_modules", name, "package.json");
      const file = existsSync(local) ? local : join(ROOT, "node_modules", name, "package.json");
      return JSON.parse(readFileSync(file, "utf8")).version;
    } catch {
      return null;
    }
  };
  let commit = null;
  try {
    commit = execFileSync("git", ["rev-parse", "HEAD"], { cwd: ROOT, encoding: "utf8" }).trim();
  } catch {
    // not a checkout
  }
  return {
    node: process.version,
    wrangler: version("wrangler"),
    workerd: version("workerd"),
    autocannon: version("autocannon"),
    commit,
  };
}

async function main() {
  const config = readConfig(process.env);
  const startedAt = new Date();
  const cpus = os.cpus();
  const results = {
    started_at: startedAt.toISOString(),
    machine: {
      cpus: cpus.length,
      cpu_model: cpus[0]?.model ?? null,
      memory_gib: round(os.totalmem() / 2 ** 30, 1),
      loadavg_at_start: os.loadavg().map((v) => round(v)),
      platform: `${os.platform()} ${os.release()}`,
    },
    versions: versions(),
    config,
    targets: {},
    errors: [],
  };
  say(`bench: targets ${config.targets.join(", ")}; scenarios ${config.scenarios.join(", ")}; scale ${config.scale}`);
  const runTag = randomBytes(3).toString("hex");
  for (const target of config.targets) {
    const stateDir = join(STATE, target);
    const ctx = {
      config,
      target,
      runTag,
      stateDir,
      appDir: join(stateDir, "app"),
      emptyEnvFile: join(stateDir, "empty.env"),
      secret: randomBytes(16).toString("hex"),
      adminToken: randomBytes(16).toString("hex"),
    };
    const started = Date.now();
    try {
      results.targets[target] = await runTarget(ctx);
    } catch (error) {
      if (interrupted) throw error;
      console.error(`${target} failed: ${error.stack ?? error}`);
      results.errors.push({ target, error: String(error.message ?? error) });
      results.targets[target] = { scenarios: {}, timings: {}, error: String(error.message ?? error) };
    }
    results.targets[target].timings.total_ms = Date.now() - started;
  }
  results.finished_at = new Date().toISOString();
  results.machine.loadavg_at_end = os.loadavg().map((v) => round(v));
  results.budget = budget(results);

  mkdirSync(RESULTS, { recursive: true });
  const file = join(RESULTS, `${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
  writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);

  console.log("");
  console.log(table(results, config.scenarios));
  console.log("");
  if (results.budget.length > 0) {
    console.log("Budget of issue 5 (informational; ratios from this run):");
    for (const check of results.budget) console.log(`  ${check.ok ? "ok  " : "MISS"} ${check.name}: ${check.detail}`);
    console.log("");
  }
  const problems = [];
  for (const [target, r] of Object.entries(results.targets)) {
    for (const [name, s] of Object.entries(r.scenarios ?? {})) {
      for (const p of s.problems ?? []) problems.push(`${target} ${name}: ${p}`);
      if (s.verify && !s.verify.ok) problems.push(`${target} ${name}: ${s.verify.summary}`);
    }
  }
  for (const e of results.errors) problems.push(`${e.target}: ${e.error.split("\n")[0]}`);
  if (problems.length > 0) {
    console.log("Problems:");
    for (const p of problems) console.log(`  ${p}`);
    console.log("");
  }
  console.log("Timings (s):");
  for (const [target, r] of Object.entries(results.targets)) {
    const parts = Object.entries(r.timings).map(([k, v]) => `${k.replace(/_ms$/, "")} ${(v / 1000).toFixed(1)}`);
    console.log(`  ${target}: ${parts.join(", ")}`);
  }
  console.log(`Results: ${relative(ROOT, file)}`);
  return problems.length === 0 ? 0 : 1;
}

let interrupted = false;
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    if (interrupted) return;
    interrupted = true;
    console.error(`\n${signal}: stopping everything the bench started…`);
    abortLoad();
    stopAllGroups().finally(() => process.exit(signal === "SIGINT" ? 130 : 143));
  });
}
process.on("exit", killAllGroupsSync);

main()
  .then((code) => stopAllGroups().then(() => process.exit(code)))
  .catch(async (error) => {
    if (!interrupted) console.error(error.stack ?? String(error));
    await stopAllGroups();
    process.exit(1);
  });
