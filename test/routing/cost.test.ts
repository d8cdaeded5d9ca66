/**
 * D1 cost of a routed message, from D1's own result meta (deterministic, so it is
 * asserted here; speed is measured by `npm run bench`, never here). A change that
 * adds a query or a row to the path that answers the webhook fails this test.
 */
import { afterEach, beforeEach, expect, it } from "vitest";
import { injectD1Fault } from "../../src/db/client";
import { metrics, resetMetrics } from "../../src/metrics";
import {
  T0,
  alarmAfterRestart,
  genericKey,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentApi, agentConfig, fakeServices, replyWith } from "../agent/support";

beforeEach(() => setNow(T0));

/** A waiting message's own rows in the routing object (measured; see docs/performance.md). */
const WAITING_OBJECT_ROWS_READ = 11;
const WAITING_OBJECT_ROWS_WRITTEN = 4;
/** The routing object's rows written by the turn before a waiting message and the run that carries it (measured). */
const CARRYING_OBJECT_ROWS_WRITTEN = 6;
/** A steady message's rows in the routing object with an external agent answering inline (measured). */
const EXTERNAL_OBJECT_ROWS_READ = 15;
const EXTERNAL_OBJECT_ROWS_WRITTEN = 5;
afterEach(() => {
  restoreClock();
  useConfig(null);
});

/** A session started, then `count` steady messages each answered by the alarm, counted from a fresh metrics slate. */
async function steadyTurns(count: number): Promise<void> {
  const chat = unique("chat");
  await send({ chat_id: chat, text: "first" });
  await runAlarm(genericKey(chat));
  resetMetrics();
  for (let i = 0; i < count; i++) {
    await send({ chat_id: chat, text: `steady ${i}` });
    await runAlarm(genericKey(chat));
  }
}

it("a steady-state message costs one D1 round trip, 2 rows read and 3 rows written on the ingress path", async () => {
  const chat = unique("chat");
  await send({ chat_id: chat, text: "first" }); // creates the session
  await runAlarm(genericKey(chat));
  resetMetrics();
  const count = 10;
  for (let i = 0; i < count; i++) await send({ chat_id: chat, text: `steady ${i}` });
  expect(metrics.messages_routed).toBe(count);
  expect(metrics.d1_batches_ingress).toBe(count);
  expect(metrics.d1_queries_ingress).toBe(3 * count);
  expect(metrics.d1_rows_read_ingress).toBe(2 * count);
  expect(metrics.d1_rows_written_ingress).toBe(3 * count);
});

it("the whole cost of a steady message with its echo reply: two D1 batches, 6 queries, 4 rows read, 6 written", async () => {
  const count = 5;
  await steadyTurns(count);
  // Ingress (session, message, dedupe mark) + the turn (a finished run, session, reply).
  expect(metrics.d1_rows_written).toBe(6 * count);
  expect(metrics.d1_queries).toBe(6 * count);
  // Ingress reads its session row twice (bump, message seq), the turn likewise; the
  // turn's run was inserted in the same batch, so it is not read back.
  expect(metrics.d1_rows_read).toBe(4 * count);
  // The routing object's own storage: the staged hand-off, written and deleted.
  expect(metrics.do_rows_written).toBe(2 * count);
  // And read: whether the message waits (one statement), the alarm's due scans, the
  // item read back under the lock, its delete, the next due time on each re-arm.
  expect(metrics.do_rows_read).toBe(10 * count);
  console.log("whole cost per steady message", {
    queries: metrics.d1_queries / count,
    rows_read: metrics.d1_rows_read / count,
    rows_written: metrics.d1_rows_written / count,
    object_rows_read: metrics.do_rows_read / count,
    object_rows_written: metrics.do_rows_written / count,
  });
});

it("costs the same on the 40th message of a conversation as on the 2nd (nothing grows with its length)", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const cost = async (text: string) => {
    resetMetrics();
    await send({ chat_id: chat, text });
    await runAlarm(key);
    return { read: metrics.d1_rows_read, written: metrics.d1_rows_written, queries: metrics.d1_queries };
  };
  await cost("first");
  const early = await cost("second");
  for (let i = 3; i < 40; i++) await cost(`message ${i}`);
  const late = await cost("fortieth");
  expect(late).toEqual(early);
});

it("the first message of a new key costs one D1 round trip too", async () => {
  resetMetrics();
  const count = 5;
  for (let i = 0; i < count; i++) await send({ chat_id: unique("new"), text: "hello" });
  expect(metrics.sessions_created).toBe(count);
  expect(metrics.d1_batches_ingress).toBe(count);
});

it("on the webhook's path the routing object reads 4 rows and writes 1 (the staged hand-off)", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  const count = 5;
  let objectRead = 0;
  let objectWritten = 0;
  for (let i = 0; i < count; i++) {
    resetMetrics();
    await send({ chat_id: chat, text: `steady ${i}` });
    objectRead += metrics.do_rows_read;
    objectWritten += metrics.do_rows_written;
    await runAlarm(key);
  }
  // Whether the message waits (queue mode) is one statement over the outbox, the
  // waiting messages and the accepted runs (an empty table scanned costs a row read),
  // then one row for the next due time; one row written: the staged hand-off.
  expect(objectRead).toBe(4 * count);
  expect(objectWritten).toBe(1 * count);
});

it("a message that waits behind an unfinished run costs what any message costs in D1, and its waiting row", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  // Its run stays staged (the alarm has not run): the next message waits behind it.
  await send({ chat_id: chat, text: "unfinished" });
  resetMetrics();
  await send({ chat_id: chat, text: "waits" });
  expect(metrics.d1_batches_ingress).toBe(1);
  expect(metrics.d1_queries_ingress).toBe(3);
  expect(metrics.d1_rows_read_ingress).toBe(2);
  expect(metrics.d1_rows_written_ingress).toBe(3);
  console.log("cost of a waiting message", {
    object_rows_read: metrics.do_rows_read,
    object_rows_written: metrics.do_rows_written,
  });
  expect(metrics.do_rows_read).toBe(WAITING_OBJECT_ROWS_READ);
  expect(metrics.do_rows_written).toBe(WAITING_OBJECT_ROWS_WRITTEN);
  // The run before it is answered, then a run carries the waiting message: the batch
  // of each turn, and no read between them (the routing entry names the session, so
  // the carrying run's context needs nothing from D1).
  const batches: string[][] = [];
  injectD1Fault({ match: (sql) => (batches.push([...sql]), false), times: Infinity });
  resetMetrics();
  await runAlarm(key);
  await runAlarm(key);
  injectD1Fault(null);
  expect(batches.map((sql) => sql.length)).toEqual([3, 6]);
  expect(metrics.do_rows_written).toBe(CARRYING_OBJECT_ROWS_WRITTEN);
});

it("a hand-off to an external agent on a platform without typing costs the object no typing rows", async () => {
  useConfig(agentConfig());
  const services = fakeServices(() => replyWith("done"));
  try {
    const count = 5;
    await steadyTurns(count);
    expect(services.agentCalls()).toHaveLength(count + 1);
    // Measured when this test was written: a typing row for a platform that has no
    // typing call would add its lookup, insert and delete to every hand-off.
    expect(metrics.do_rows_written).toBe(EXTERNAL_OBJECT_ROWS_WRITTEN * count);
    expect(metrics.do_rows_read).toBe(EXTERNAL_OBJECT_ROWS_READ * count);
  } finally {
    services.restore();
  }
});

it("a restarted object's alarm before the deadline reads its session and writes nothing to D1", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  resetMetrics();
  // A fresh instance does not know the deadline: it reads the row, finds it not due, and leaves sweep_at as it is.
  const batches: string[][] = [];
  injectD1Fault({ match: (sql) => (batches.push([...sql]), false), times: Infinity });
  await alarmAfterRestart(key);
  injectD1Fault(null);
  // Two reads (the row, then its open runs for the lease), and no statement that writes.
  expect(batches.map((sql) => sql.map((s) => s.split(" ")[0]!.toUpperCase()))).toEqual([["SELECT"], ["SELECT"]]);
  expect(metrics.d1_rows_written).toBe(0);
});

it("with no reset policy, the alarm that answers a steady message reads no session row (it knows there is no deadline)", async () => {
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "none" }) });
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  await send({ chat_id: chat, text: "steady" });
  const batches: string[][] = [];
  injectD1Fault({ match: (sql) => (batches.push([...sql]), false), times: Infinity });
  await runAlarm(key);
  injectD1Fault(null);
  // Only the turn's own batch: no read of the session for its deadline.
  expect(batches.map((sql) => sql.length)).toEqual([3]);
});

it("a restarted object's alarm past the deadline, the accepted run still holding the session, writes nothing to D1", async () => {
  useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 5 }) }));
  const services = fakeServices(() => accepted());
  try {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "first" });
    await runAlarm(key);
    // Past the idle deadline: the alarm finds the lease holding and notes its end as the next look.
    setNow(T0 + 5 * 60_000 + 1);
    await runAlarm(key);
    setNow(T0 + 6 * 60_000);
    resetMetrics();
    const batches: string[][] = [];
    injectD1Fault({ match: (sql) => (batches.push([...sql]), false), times: Infinity });
    await alarmAfterRestart(key);
    injectD1Fault(null);
    // It reads what it needs to know (the row, its open runs), and the next look is already noted.
    expect(batches.flat().every((sql) => sql.trimStart().toUpperCase().startsWith("SELECT"))).toBe(true);
    expect(batches.length).toBeGreaterThan(0);
    expect(metrics.d1_rows_written).toBe(0);
  } finally {
    injectD1Fault(null);
    services.restore();
  }
});

it("the alarm over a session the agent closed reads its row alone, before its deadline and when it ends it", async () => {
  useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 5 }) }));
  const services = fakeServices(() => accepted());
  try {
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "first" });
    await runAlarm(key);
    const { run_token } = services.agentCalls()[0]!.json;
    const closed = await agentApi(`/v1/sessions/${sent.body.session_id}/end`, run_token, { reason: "agent_close" });
    expect(closed.status).toBe(200);
    const shapes: string[][] = [];
    injectD1Fault({
      match: (sql) => (shapes.push(sql.map((s) => s.trimStart().split(/\s/)[0]!.toUpperCase())), false),
      times: Infinity,
    });
    // A closed session holds no run: there is no lease to read, only its deadline.
    setNow(T0 + 60_000);
    await alarmAfterRestart(key);
    const before = shapes.splice(0);
    setNow(T0 + 5 * 60_000 + 1);
    await alarmAfterRestart(key);
    injectD1Fault(null);
    expect(before).toEqual([["SELECT"]]);
    // Past it: the row, then the batch that ends it for good (no read of its runs between).
    expect(shapes).toEqual([["SELECT"], ["UPDATE", "UPDATE", "UPDATE", "UPDATE", "INSERT", "INSERT"]]);
  } finally {
    injectD1Fault(null);
    services.restore();
  }
});

it("after a reset, the echo turn that took the notice leaves the next turns costing what any steady turn costs", async () => {
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 5 }) });
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "first" });
  await runAlarm(key);
  // Idle past the policy: the next message starts a fresh session that owes the reset notice.
  setNow(T0 + 6 * 60_000);
  const fresh = await send({ chat_id: chat, text: "after the break" });
  expect((await sessionRow(fresh.body.session_id))?.notice_pending).not.toBeNull();
  await runAlarm(key);
  expect((await sessionRow(fresh.body.session_id))?.notice_pending).toBeNull();
  resetMetrics();
  await send({ chat_id: chat, text: "steady" });
  await runAlarm(key);
  // As any steady message with its echo reply: the turn's batch no longer clears the
  // notice, which its first reply took (the object remembers it owes none).
  expect(metrics.d1_queries).toBe(6);
  expect(metrics.d1_rows_read).toBe(4);
  expect(metrics.d1_rows_written).toBe(6);
});
