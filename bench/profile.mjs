// A CPU profile of the gateway's isolate while the bench drives it: connects to the
// `--inspector-port` of the `wrangler dev` the bench started (found with `ps`), records
// for a while through the Chrome DevTools protocol, writes the .cpuprofile and prints
// where the samples fell (self time by function, and by source file).
//
//   node bench/profile.mjs [seconds=8] [out=/tmp/gateway.cpuprofile]
//   node bench/profile.mjs --read /tmp/gateway.cpuprofile     (summarise one recorded before)
//
// Start it once the bench prints that the steady scenario runs (or after its warm-up).
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
// wrangler's inspector proxy refuses Node 20's built-in WebSocket handshake; `ws` (in the
// project's install, through wrangler) speaks it plainly.
import WebSocket from "ws";

const seconds = Number(process.argv[2] ?? 8);
const out = process.argv[3] ?? "/tmp/gateway.cpuprofile";

function inspectorPort() {
  const lines = execFileSync("ps", ["-eo", "args"], { encoding: "utf8" }).split("\n");
  const line = lines.find((l) => l.includes("wrangler") && l.includes(" dev ") && l.includes("bench/.state/gateway"));
  const match = line?.match(/--inspector-port (\d+)/);
  if (!match) throw new Error("no wrangler dev of the bench's gateway is running");
  return Number(match[1]);
}

async function record() {
  const port = inspectorPort();
  const targets = await (await fetch(`http://127.0.0.1:${port}/json`)).json();
  const target = targets.find((t) => t.webSocketDebuggerUrl) ?? targets[0];
  const socket = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    socket.on("open", resolve);
    socket.on("error", reject);
  });
  let nextId = 1;
  const pending = new Map();
  socket.on("message", (data) => {
    const message = JSON.parse(String(data));
    if (message.id && pending.has(message.id)) {
      pending.get(message.id)(message);
      pending.delete(message.id);
    }
  });
  const send = (method, params = {}) =>
    new Promise((resolve) => {
      const id = nextId++;
      pending.set(id, resolve);
      socket.send(JSON.stringify({ id, method, params }));
    });

  await send("Profiler.enable");
  await send("Profiler.setSamplingInterval", { interval: 200 });
  await send("Profiler.start");
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  const { result } = await send("Profiler.stop");
  socket.close();
  writeFileSync(out, JSON.stringify(result.profile));
  return result.profile;
}

// `--read file.cpuprofile`: only summarise a profile recorded before.
const profile = process.argv[2] === "--read" ? JSON.parse(readFileSync(process.argv[3], "utf8")) : await record();
const byNode = new Map(profile.nodes.map((node) => [node.id, node]));
const parentOf = new Map();
for (const node of profile.nodes) for (const child of node.children ?? []) parentOf.set(child, node.id);
const frameName = (node) => {
  const { functionName, url, lineNumber } = node.callFrame;
  return `${functionName || "(anonymous)"} ${url ? url.replace(/^.*\//, "") : "(native)"}:${lineNumber + 1}`;
};
const IDLE = new Set(["(idle)", "(program)", "(root)"]);
const samples = profile.samples.filter((id) => !IDLE.has(byNode.get(id).callFrame.functionName));
const total = samples.length;
const self = new Map();
const inclusive = new Map();
const sqlBy = new Map();
for (const id of samples) {
  const leaf = byNode.get(id);
  self.set(frameName(leaf), (self.get(frameName(leaf)) ?? 0) + 1);
  const seen = new Set();
  const stack = [];
  for (let at = id; at !== undefined; at = parentOf.get(at)) stack.push(byNode.get(at));
  for (const node of stack) {
    // Inclusive time of the bundle's named methods (minified helpers have 1-2 letter names).
    const name = node.callFrame.functionName;
    if (!name || name.length <= 2 || seen.has(name)) continue;
    seen.add(name);
    inclusive.set(name, (inclusive.get(name) ?? 0) + 1);
  }
  // The routing object's SQLite (`exec`), by the first named method above it.
  if (leaf.callFrame.functionName === "exec" && !leaf.callFrame.url) {
    const caller = stack.slice(1).find((n) => (n.callFrame.functionName ?? "").length > 2);
    const key = caller ? caller.callFrame.functionName : "(unknown)";
    sqlBy.set(key, (sqlBy.get(key) ?? 0) + 1);
  }
}
const top = (map, k) =>
  [...map.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, k)
    .map(([name, n]) => `${((100 * n) / total).toFixed(1).padStart(5)}%  ${name}`)
    .join("\n");
console.log(
  `${profile.samples.length} samples, ${total} busy (${((100 * total) / profile.samples.length).toFixed(0)}%); shares of busy samples`,
);
console.log("self time by function:\n" + top(self, 25));
console.log("inclusive time by named function:\n" + top(inclusive, 40));
console.log("routing object SQLite (exec) by caller:\n" + top(sqlBy, 15));
