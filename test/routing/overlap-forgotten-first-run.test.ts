/**
 * The first run of a fresh session says `is_new` (and carries its `reset`) even when
 * the routing entry was forgotten (`DELETE /admin/routes/{key}`) while that session's
 * first message waited for its run (spec "Overlapping messages", the agent hand-off's
 * `session.is_new`). With `debounce_ms` every message waits, so the alarm dispatches
 * the run with no entry, or with one rebuilt from D1. Found by the model-based test.
 */
import { beforeEach, expect, it } from "vitest";
import { HOUR, MINUTE, T0, genericKey, router, runAlarm, send, setNow, unique, useConfig } from "../helpers";
import { injectD1Fault } from "../../src/db/client";
import { replyWith } from "../agent/support";
import { type FakeServices, overlapConfig, overlapHooks, forget } from "./overlap-support";

const fake = overlapHooks({ OVERLAP: JSON.stringify({ mode: "queue", debounce_ms: 1500 }) });
let services: FakeServices;

beforeEach(() => {
  services = fake(() => replyWith("ok"));
});

/** Runs the alarm at `at` and lets the hand-offs it staged go out. */
async function alarmAt(key: string, at: number): Promise<void> {
  setNow(at);
  await runAlarm(key);
  await router(key).drained();
}

const handoffs = () =>
  services.agentCalls().map((c) => ({
    texts: (c.json.messages as { text: string }[]).map((m) => m.text),
    session: c.json.session,
    reset: c.json.reset,
  }));

it("a new key's first message, waiting when the entry is forgotten, goes out as is_new", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text: "hello" });
  await forget(key);
  await alarmAt(key, T0 + 1500);
  expect(handoffs()).toEqual([
    { texts: ["hello"], session: expect.objectContaining({ id: first.body.session_id, is_new: true }), reset: null },
  ]);
});

it("a message after the forgotten entry joins the waiting first one; their run is still is_new", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text: "hello" });
  await forget(key);
  setNow(T0 + 500);
  const second = await send({ chat_id: chat, text: "again" });
  expect(second.body.session_id).toBe(first.body.session_id);
  await alarmAt(key, T0 + 2000);
  expect(handoffs()).toEqual([
    {
      texts: ["hello", "again"],
      session: expect.objectContaining({ id: first.body.session_id, is_new: true }),
      reset: null,
    },
  ]);
});

it("a session that replaced an expired one keeps its reset for its first run across a forgotten entry", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  const old = await send({ chat_id: chat, text: "before" });
  await alarmAt(key, T0 + 1500);
  // Two hours idle (the policy: 60 minutes): this message starts a fresh session and waits there.
  setNow(T0 + 2 * HOUR);
  const fresh = await send({ chat_id: chat, text: "after" });
  expect(fresh.body.session_id).not.toBe(old.body.session_id);
  await forget(key);
  await alarmAt(key, T0 + 2 * HOUR + 1500);
  expect(handoffs()[1]).toEqual({
    texts: ["after"],
    session: expect.objectContaining({ id: fresh.body.session_id, is_new: true }),
    reset: { reason: "idle", had_activity: true, previous_session_id: old.body.session_id },
  });
});

it("once the session's first run went out, a run dispatched after a forgotten entry is not is_new", async () => {
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "one" });
  await alarmAt(key, T0 + 1500);
  setNow(T0 + 2000);
  await send({ chat_id: chat, text: "two" });
  await forget(key);
  await alarmAt(key, T0 + 3500);
  expect(handoffs().map((h) => [h.texts, h.session.is_new, h.reset])).toEqual([
    [["one"], true, null],
    [["two"], false, null],
  ]);
});

it("concurrent: a run of the waiting message, dispatched with no entry, is not is_new while the first run waits in the outbox", async () => {
  useConfig(overlapConfig({ OVERLAP: JSON.stringify({ mode: "concurrent", debounce_ms: 1500 }) }));
  const chat = unique("chat");
  const key = genericKey(chat);
  await send({ chat_id: chat, text: "one" });
  // The first run is staged at the window's end, but D1 fails its dispatch: it stays in the outbox.
  const fault = injectD1Fault({ match: (sql) => sql.some((s) => s.includes("SET current_run_id = ?")) });
  await alarmAt(key, T0 + 1500);
  injectD1Fault(null);
  expect(fault.hits()).toBe(1);
  expect(handoffs()).toEqual([]);
  setNow(T0 + 1600);
  await send({ chat_id: chat, text: "two" });
  await forget(key);
  for (let minute = 1; minute <= 3; minute++) await alarmAt(key, T0 + minute * MINUTE);
  expect(
    handoffs()
      .map((h) => [h.texts, h.session.is_new])
      .sort(),
  ).toEqual([
    [["one"], true],
    [["two"], false],
  ]);
});
