// Processes the bench starts: each in a process group of its own, so that it and
// everything it spawned (wrangler's second node, esbuild, workerd) is stopped
// together, and nothing it started outlives it, even on an error or Ctrl-C.
import { spawn } from "node:child_process";
import { openSync, closeSync, readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:net";

/** Process group ids started by this process and not yet seen empty. */
const groups = new Set();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Reads pid, comm, ppid and pgrp of every process from /proc. */
export function listProcesses() {
  const out = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    let stat;
    try {
      stat = readFileSync(`/proc/${name}/stat`, "utf8");
    } catch {
      continue; // it exited while we looked
    }
    const close = stat.lastIndexOf(")");
    const comm = stat.slice(stat.indexOf("(") + 1, close);
    const fields = stat.slice(close + 2).split(" ");
    out.push({ pid: Number(name), comm, ppid: Number(fields[1]), pgrp: Number(fields[2]) });
  }
  return out;
}

/** Members of a process group, plus any descendant of its leader that left the group. */
export function groupMembers(pgid, processes = listProcesses()) {
  const members = new Map(processes.filter((p) => p.pgrp === pgid).map((p) => [p.pid, p]));
  let grew = true;
  for (let rounds = 0; grew && rounds < 16; rounds++) {
    grew = false;
    for (const p of processes) {
      if (!members.has(p.pid) && (members.has(p.ppid) || p.ppid === pgid)) {
        members.set(p.pid, p);
        grew = true;
      }
    }
  }
  return [...members.values()];
}

function signalGroup(pgid, signal) {
  try {
    process.kill(-pgid, signal);
  } catch {
    // already gone
  }
  // Stragglers that moved to a group of their own (none expected): by pid.
  for (const p of groupMembers(pgid)) {
    if (p.pgrp === pgid) continue;
    try {
      process.kill(p.pid, signal);
    } catch {
      // gone
    }
  }
}

/** Starts a command in a new process group, its output appended to `logFile`. */
export function startGroup(command, args, { cwd, env, logFile }) {
  const fd = openSync(logFile, "a");
  const child = spawn(command, args, { cwd, env, detached: true, stdio: ["ignore", fd, fd] });
  closeSync(fd);
  groups.add(child.pid);
  child.exited = new Promise((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
    child.once("error", (error) => resolve({ code: null, signal: null, error }));
  });
  return child;
}

/** Stops a group: SIGTERM, then SIGKILL after `graceMs`; resolves once no member is left. */
export async function stopGroup(pgid, graceMs = 5000) {
  if (!groups.has(pgid)) return;
  signalGroup(pgid, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline && groupMembers(pgid).length > 0) await sleep(100);
  if (groupMembers(pgid).length > 0) {
    signalGroup(pgid, "SIGKILL");
    const hard = Date.now() + 5000;
    while (Date.now() < hard && groupMembers(pgid).length > 0) await sleep(100);
  }
  const left = groupMembers(pgid);
  if (left.length > 0) throw new Error(`process group ${pgid} did not stop: ${left.map((p) => p.pid).join(", ")}`);
  groups.delete(pgid);
}

/** Stops every group this process started (used on errors and signals). */
export async function stopAllGroups() {
  for (const pgid of [...groups]) await stopGroup(pgid).catch((error) => console.error(String(error)));
}

/** Last resort from a synchronous `exit` handler: SIGKILL every group still known. */
export function killAllGroupsSync() {
  for (const pgid of groups) signalGroup(pgid, "SIGKILL");
}

/** Runs a command to its end in its own group; throws with the log's tail when it fails or times out. */
export async function runToEnd(command, args, { cwd, env, logFile, timeoutMs }) {
  const child = startGroup(command, args, { cwd, env, logFile });
  const timer = sleep(timeoutMs).then(() => "timeout");
  const outcome = await Promise.race([child.exited, timer]);
  if (outcome === "timeout") {
    await stopGroup(child.pid);
    throw new Error(`${args.slice(0, 4).join(" ")} timed out after ${timeoutMs} ms (log: ${logFile})`);
  }
  await stopGroup(child.pid, 1000);
  if (outcome.code !== 0) {
    throw new Error(`${args.slice(0, 4).join(" ")} failed (${outcome.code ?? outcome.signal}):\n${tail(logFile)}`);
  }
}

export function tail(file, lines = 30) {
  try {
    return readFileSync(file, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return "";
  }
}

/** A free TCP port on 127.0.0.1 (the OS picks it; it is closed again before use). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function rssKb(pid) {
  try {
    const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return match ? Number(match[1]) : 0;
  } catch {
    return 0;
  }
}

/**
 * Samples VmRSS of the workerd processes of one process group every `intervalMs`.
 * Keeps the overall peak and the peak since the last `mark()` (of the sum over
 * those processes, and of the largest one alone).
 */
export class RssMonitor {
  constructor(pgid, intervalMs = 200) {
    this.pgid = pgid;
    this.pids = [];
    this.ticks = 0;
    this.samples = 0;
    this.peak = { sumKb: 0, maxKb: 0, processes: 0 };
    this.window = { sumKb: 0, maxKb: 0, processes: 0 };
    this.timer = setInterval(() => this.sample(), intervalMs);
    this.timer.unref();
    this.sample();
  }

  sample() {
    if (this.ticks++ % 5 === 0 || this.pids.length === 0) this.pids = this.workerdPids();
    const values = this.pids.map(rssKb).filter((kb) => kb > 0);
    if (values.length === 0) return;
    this.samples += 1;
    const sumKb = values.reduce((a, b) => a + b, 0);
    const maxKb = Math.max(...values);
    for (const record of [this.peak, this.window]) {
      record.sumKb = Math.max(record.sumKb, sumKb);
      record.maxKb = Math.max(record.maxKb, maxKb);
      record.processes = Math.max(record.processes, values.length);
    }
  }

  /** The workerd processes of the group now (a change means wrangler dev restarted the runtime). */
  workerdPids() {
    return groupMembers(this.pgid)
      .filter((p) => p.comm === "workerd")
      .map((p) => p.pid)
      .sort((a, b) => a - b);
  }

  /** The peak since the previous mark, then starts a new window. */
  mark() {
    this.sample();
    const window = this.window;
    this.window = { sumKb: 0, maxKb: 0, processes: 0 };
    return window;
  }

  stop() {
    clearInterval(this.timer);
  }
}
