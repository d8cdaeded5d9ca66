#!/usr/bin/env node
// `npm run chaos`: the crash check. Starts the gateway as `npm start` does, on a
// fresh state directory under the system's temp dir, with a fake agent, a hook
// receiver and a reply receiver on loopback; sends signed messages over many keys;
// `kill -9`s the gateway's whole process group several times mid-load and starts
// it again on the same state; resends what was not acknowledged; waits for the
// outbox to drain and the sessions to end; then checks that every acknowledged
// message was stored once, handed to the agent, answered, and that every
// finalizing session was finalized once. Exits 1 on any loss or double finalize.
// See docs/testing.md ("Crash check").
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Gateway, prepareApp } from "./chaos/gateway.mjs";
import { buildKeys, buildMessages, Load } from "./chaos/load.mjs";
import { parseFlags, random, usage } from "./chaos/options.mjs";
import { FakeAgent, HookReceiver, ReplyReceiver } from "./chaos/receivers.mjs";
import { AdminApi, verify } from "./chaos/verify.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const t0 = Date.now();
const say = (...parts) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(6)}s]`, ...parts);

/** Everything this run started, so that every exit path stops it. */
const started = { gateway: null, peers: [], load: null };
let stateDir = null;

async function stopEverything() {
  started.load?.stop();
  await started.gateway?.stop().catch((error) => console.error(`stopping the gateway: ${error.message}`));
  for (const peer of started.peers) await peer.stop().catch(() => {});
}

async function main(options) {
  const next = random(options.seed);
  const runTag = options.seed.toString(36);
  const hex = () => randomBytes(16).toString("hex");
  const secrets = { generic: hex(), admin: hex(), agent: hex(), hook: hex() };
  const base = options["port-base"];
  const ports = { gateway: base, inspector: base + 1, agent: base + 2, hooks: base + 3, replies: base + 4 };
  stateDir = mkdtempSync(join(tmpdir(), "sessiongate-chaos-"));
  const deadline = t0 + options["max-seconds"] * 1000;
  const pastDeadline = () => Date.now() > deadline;

  say(
    `chaos: seed ${options.seed}; ${options.keys} keys x ${options.messages} messages; ${options.kills} kills;` +
      ` ${options["burst-every"] ? `one key in ${options["burst-every"]} sends bursts to an agent ${options["slow-ms"]} ms slower` : "no bursts"};` +
      ` gateway from ${options.ref || "the work tree"}; state ${stateDir}`,
  );
  const idleMinutes = options["idle-seconds"] / 60;
  prepareApp(
    ROOT,
    join(stateDir, "app"),
    {
      GENERIC_WEBHOOK_SECRET: secrets.generic,
      ADMIN_TOKEN: secrets.admin,
      AGENT_URL: `http://127.0.0.1:${ports.agent}/agent`,
      AGENT_TOKEN: secrets.agent,
      HOOK_URLS: `http://127.0.0.1:${ports.hooks}/hooks`,
      HOOK_SECRET: secrets.hook,
      GENERIC_REPLY_URL: `http://127.0.0.1:${ports.replies}/replies`,
      // dm keys expire by idle (the alarm ends and finalizes them, also across kills);
      // group keys never expire and are ended by the operator API at the end.
      SESSION_RESET: JSON.stringify({
        mode: "none",
        by_chat_type: { dm: { mode: "idle", idle_minutes: idleMinutes } },
      }),
    },
    options.ref || null,
  );

  const gateway = new Gateway({
    appDir: join(stateDir, "app"),
    stateDir,
    port: ports.gateway,
    inspectorPort: ports.inspector,
    startTimeoutMs: options["start-timeout"] * 1000,
  });
  const keys = buildKeys(runTag, options.keys, options["burst-every"]);
  const agent = new FakeAgent({
    port: ports.agent,
    token: secrets.agent,
    gatewayOrigin: gateway.origin,
    runTag,
    next,
    asyncShare: options["agent-async"],
    failShare: options["agent-fail"],
    slowKeys: new Set(keys.filter((k) => k.burst).map((k) => k.key)),
    slowMs: options["slow-ms"],
  });
  const hooks = new HookReceiver({ port: ports.hooks, secret: secrets.hook, next, failShare: options["hook-fail"] });
  const replies = new ReplyReceiver({ port: ports.replies, runTag, next, failShare: options["reply-fail"] });
  for (const peer of [agent, hooks, replies]) {
    await peer.start();
    started.peers.push(peer);
  }

  started.gateway = gateway;
  say(`gateway: applying migrations and starting wrangler dev on ${gateway.origin}`);
  say(`gateway: healthy after ${await gateway.start()} ms`);

  const messages = buildMessages(runTag, keys, options.messages, secrets.generic);
  const load = new Load({
    origin: gateway.origin,
    messages,
    rate: options.rate,
    concurrency: options.concurrency,
    until: pastDeadline,
  });
  started.load = load;
  const loadDone = load.run();

  // The kills: the i-th once i/(kills+1) of the messages are acknowledged, plus a
  // random delay, and only with requests on the wire.
  const kills = [];
  for (let i = 1; i <= options.kills; i++) {
    const threshold = Math.floor((messages.length * i) / (options.kills + 1));
    while (load.acknowledged < threshold && !pastDeadline()) await sleep(20);
    await sleep(Math.floor(next() * 400));
    for (let w = 0; w < 100 && load.inFlight === 0; w++) await sleep(20);
    if (pastDeadline()) break;
    const kill = { acknowledged: load.acknowledged, in_flight: load.inFlight };
    await gateway.kill9();
    say(
      `kill ${i}: kill -9 of the gateway's process group (${kill.acknowledged} acknowledged, ${kill.in_flight} in flight)`,
    );
    kill.restart_ms = await gateway.start();
    say(`kill ${i}: restarted on the same state in ${kill.restart_ms} ms`);
    kills.push(kill);
  }
  await loadDone;
  say(`load: ${load.acknowledged} of ${messages.length} acknowledged after ${load.sends} sends`);

  // Drain: every acknowledged message handed over and its reply delivered.
  const drainUntil = Math.min(deadline, Date.now() + options["drain-timeout"] * 1000);
  const acked = () => messages.filter((m) => m.ack);
  while (Date.now() < drainUntil) {
    const waiting = acked().filter((m) => !agent.seen.has(m.eventId) || !replies.answered.has(m.eventId));
    if (waiting.length === 0 && agent.laterReplies.pending === 0) break;
    await sleep(500);
  }
  say(`drain: replies delivered for ${acked().filter((m) => replies.answered.has(m.eventId)).length} messages`);

  // End: group sessions by the operator; dm sessions end by their idle alarm.
  const admin = new AdminApi(gateway.origin, secrets.admin);
  let operatorEnds = 0;
  for (const key of keys.filter((k) => k.chatType === "group")) {
    const { sessions } = await admin.call("GET", `/admin/sessions?key=${encodeURIComponent(key.key)}&open=true`);
    for (const session of sessions) {
      await admin.call("POST", `/admin/sessions/${encodeURIComponent(session.id)}/end`, { reason: "admin" });
      operatorEnds += 1;
    }
  }
  say(`end: ${operatorEnds} group sessions ended by the operator; waiting for the idle alarms and the events`);

  // Wait for every session to end and for its finalized event to arrive.
  let snapshot = [];
  while (Date.now() < drainUntil) {
    snapshot = await admin.snapshot(keys);
    const finalized = hooks.finalizedBySession();
    const open = snapshot.filter((s) => s.row.end_reason === null);
    const unsent = snapshot.filter((s) => s.events.some((e) => e.status !== "sent"));
    const missing = snapshot.filter(
      (s) => s.row.end_reason && !finalized.has(s.row.id) && s.row.end_reason !== "compression",
    );
    if (open.length === 0 && unsent.length === 0 && missing.length === 0) break;
    await sleep(1500);
  }
  snapshot = await admin.snapshot(keys);

  const { figures, problems, details } = verify({
    runTag,
    messages,
    sessions: snapshot,
    agent,
    hooks,
    replies,
    expectBatches: keys.some((k) => k.burst),
  });
  figures.kills = kills;
  figures.gateway_starts = gateway.starts;
  figures.agent = { handoffs: agent.handoffs, answers: agent.answers, later_replies: agent.laterReplies };
  figures.load = { sends: load.sends, unanswered: load.unanswered, refused: load.refused };
  figures.receivers = { hook_500s: hooks.refused, reply_500s: replies.refused };
  if (kills.length < options.kills) problems.push(`only ${kills.length} of ${options.kills} kills happened`);
  if (pastDeadline()) problems.push(`the run went past --max-seconds ${options["max-seconds"]}`);
  report(options, figures, problems, details);
  const result = { seed: options.seed, options, passed: problems.length === 0, problems, details, figures, messages };
  writeFileSync(join(stateDir, "chaos-result.json"), `${JSON.stringify(result, null, 2)}\n`);
  return problems.length === 0;
}

function report(options, f, problems, details) {
  const ids = (x) => (x.count === 0 ? "0" : `${x.count} (${x.ids.join(", ")}${x.count > x.ids.length ? ", …" : ""})`);
  const lines = [
    [
      "messages sent",
      `${f.messages} (${f.sends} sends: ${f.load.unanswered} unanswered, refused ${JSON.stringify(f.load.refused)})`,
    ],
    [
      "kills",
      `${f.kills.length}: ${f.kills.map((k) => `at ${k.acknowledged} acked/${k.in_flight} in flight, back in ${k.restart_ms} ms`).join("; ")}`,
    ],
    [
      "acknowledged",
      `${f.acknowledged} (${f.acknowledged_as_duplicate} answered duplicate: true after a resend); never: ${ids(f.never_acknowledged)}`,
    ],
    ["stored once", `${f.stored_once}; stored but never acknowledged: ${ids(f.stored_without_ack)}`],
    ["duplicates", ids(f.duplicates)],
    ["lost", ids(f.lost)],
    ["misfiled", ids(f.misfiled)],
    [
      "handed over",
      `${f.handed_over} (${f.handed_over_again} handed over more than once); not: ${ids(f.not_handed_over)}`,
    ],
    ["replies stored", `${f.replies_stored_once} once; none: ${ids(f.unanswered)}; twice: ${ids(f.answered_twice)}`],
    [
      "answered",
      `${f.answered} at the reply receiver; not: ${ids(f.reply_not_delivered)}; by two deliveries: ${ids(f.reply_delivered_twice)}`,
    ],
    [
      "runs",
      `${f.runs_carrying} carried messages; ${f.runs_batched} carried more than one (largest ${f.largest_batch}); not dispatched: ${JSON.stringify(f.not_dispatched)}`,
    ],
    [
      "one run each",
      `waiting at the end: ${ids(f.still_waiting)}; in two runs: ${ids(f.in_two_runs)}; agent and D1 disagree: ${ids(f.run_mismatch)}; run unknown to its session: ${ids(f.run_unknown)}`,
    ],
    [
      "batch answers",
      `replies not once per run: ${ids(f.run_not_answered_once)}; a reply naming other messages than its run: ${ids(f.reply_batch_mismatch)}`,
    ],
    ["sessions", `${f.sessions} ${JSON.stringify(f.sessions_by_end_reason)}; live left: ${ids(f.live_sessions_left)}`],
    [
      "finalized once",
      `${f.finalized_once} of ${f.finalizing_sessions}; missing: ${ids(f.finalized_missing)}; twice: ${ids(f.finalized_twice)}; wrongly: ${ids(f.finalized_without_finalizing_end)}`,
    ],
    ["transcripts", `differing from D1: ${ids(f.transcript_mismatch)}`],
    [
      "events",
      `${f.events_received} received, ${f.events_redelivered_same_id} redelivered with the same id (at least once: fine); ${f.receivers.hook_500s} answered 500 on purpose`,
    ],
    [
      "agent",
      `${f.agent.handoffs} hand-offs ${JSON.stringify(f.agent.answers)}; later replies ${JSON.stringify(f.agent.later_replies)}`,
    ],
  ];
  console.log("");
  for (const [name, value] of lines) console.log(`  ${name.padEnd(15)} ${value}`);
  console.log("");
  if (problems.length === 0) {
    console.log(`chaos: PASS (seed ${options.seed})`);
  } else {
    console.log(`chaos: FAIL (seed ${options.seed}; state kept in ${stateDir})`);
    for (const problem of problems) console.log(`  - ${problem}`);
    if (details.length > 0)
      console.log("\nFailing messages (first 20; all in chaos-result.json and the gateway-*.log files):");
    for (const d of details) {
      console.log(`  ${d.event_id} on ${d.key}: acked ${JSON.stringify(d.ack)} after ${d.attempts} sends`);
      console.log(`    stored in: ${d.stored_in.join("; ") || "nothing"}`);
      console.log(`    agent: ${d.agent.join("; ")}`);
      console.log(`    runs: ${d.runs.join("; ") || "none"}`);
      console.log(`    replies stored ${d.reply_stored}, received ${d.reply_received}`);
    }
  }
}

let interrupted = false;
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    if (interrupted) return;
    interrupted = true;
    console.error(`\n${signal}: stopping everything the crash check started…`);
    stopEverything().finally(() => {
      if (stateDir) console.error(`chaos: state kept in ${stateDir}`);
      process.exit(signal === "SIGINT" ? 130 : 143);
    });
  });
}
// Last resort: never leave a gateway running behind us.
process.on("exit", () => started.gateway?.killSync());

let options;
try {
  options = parseFlags(process.argv.slice(2));
} catch (error) {
  console.error(`chaos: ${error.message}`);
  process.exit(2);
}
if (options.help) {
  console.log(usage());
  process.exit(0);
}
main(options)
  .then(async (passed) => {
    await stopEverything();
    if (passed && !options.keep && stateDir) rmSync(stateDir, { recursive: true, force: true });
    process.exit(passed ? 0 : 1);
  })
  .catch(async (error) => {
    if (!interrupted) console.error(`chaos: ${error.stack ?? error}`);
    await stopEverything();
    if (stateDir) console.error(`chaos: state kept in ${stateDir}`);
    process.exit(1);
  });
