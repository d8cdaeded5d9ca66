/**
 * OVERLAP `debounce_ms` through the worker's own fetch and the routing object's
 * alarm (spec "Overlapping messages"): in any mode a run is dispatched only once
 * `debounce_ms` passed without a new message for the session; the messages of that
 * window join one run, and the alarm (armed by the alarm plan at the window's end)
 * dispatches it.
 */
import { describe, expect, it } from "vitest";
import { T0, alarmOf, genericKey, router, runAlarm, send, sessionRow, setNow, unique, useConfig } from "../helpers";
import { accepted, replyWith } from "../agent/support";
import { type FakeServices, overlapHooks, overlapConfig, carriedBy } from "./overlap-support";

const fake = overlapHooks();
let services: FakeServices;

const debounce = (mode: string) => overlapConfig({ OVERLAP: JSON.stringify({ mode, debounce_ms: 1500 }) });

const callTexts = () => carriedBy(services);

describe("debounce_ms (queue)", () => {
  it("the window's messages join one run, dispatched by the alarm once the window is quiet", async () => {
    useConfig(debounce("queue"));
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "so" });
    expect(first).toMatchObject({ status: 200, body: { accepted: true, duplicate: false } });
    expect(await alarmOf(key)).toBe(T0 + 1500);
    setNow(T0 + 800);
    await send({ chat_id: chat, text: "about that" });
    // The alarm never moves later by itself: it comes at the first window's end, finds
    // the window still open, and re-arms at its new end.
    setNow(T0 + 1500);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([]);
    expect(await alarmOf(key)).toBe(T0 + 2300);
    setNow(T0 + 2300);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["so", "about that"]]);
    // The first run of a new session says so.
    expect(services.agentCalls()[0]!.json.session).toMatchObject({ id: first.body.session_id, is_new: true });
    expect(services.replies().map((r) => r.text)).toEqual(["ok"]);
    // The next window's run is not the session's first any more.
    setNow(T0 + 5000);
    await send({ chat_id: chat, text: "and another thing" });
    setNow(T0 + 6500);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["so", "about that"], ["and another thing"]]);
    expect(services.agentCalls()[1]!.json.session).toMatchObject({ id: first.body.session_id, is_new: false });
  });
});

describe("debounce_ms (concurrent)", () => {
  it("a window's messages join one run; the next window does not wait for an unfinished run", async () => {
    useConfig(debounce("concurrent"));
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "a" });
    setNow(T0 + 100);
    await send({ chat_id: chat, text: "b" });
    setNow(T0 + 1600);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["a", "b"]]);
    // Run one is unfinished (202); a new window still gets its run once quiet.
    setNow(T0 + 2000);
    await send({ chat_id: chat, text: "c" });
    // A wake within the window dispatches nothing; the alarm then waits for the window's
    // end, not for run one's lease to end.
    await runAlarm(key);
    expect(callTexts()).toEqual([["a", "b"]]);
    expect(await alarmOf(key)).toBe(T0 + 3500);
    setNow(T0 + 3500);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["a", "b"], ["c"]]);
  });
});

describe("debounce_ms past the session's deadline", () => {
  it("a message that waits for its window does not hold the expired session open for itself: it starts a fresh one", async () => {
    useConfig(debounce("queue"));
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "so" });
    setNow(T0 + 1500);
    await runAlarm(key);
    await router(key).drained();
    // Idle for longer than the test config's 60 minutes since the reply.
    setNow(T0 + 1500 + 61 * 60_000);
    const later = await send({ chat_id: chat, text: "a new day" });
    expect(later.body.session_id).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    setNow(T0 + 3000 + 61 * 60_000);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["so"], ["a new day"]]);
    expect(services.agentCalls()[1]!.json.session).toMatchObject({ id: later.body.session_id, is_new: true });
  });
});

/** queue mode with a 1.5 s window, and a daily reset at 13:00 UTC (an hour after T0). */
const dailyAtOne = () =>
  overlapConfig({
    SESSION_RESET: JSON.stringify({ mode: "daily", at_hour: 13, at_minute: 0, timezone: "UTC" }),
    OVERLAP: JSON.stringify({ mode: "queue", debounce_ms: 1500 }),
  });

describe("debounce_ms across a daily boundary", () => {
  it("a message acknowledged before the boundary, still in its window, holds the session: the alarm comes back at the window's end and its run goes there", async () => {
    // T0 is 12:00 UTC; the boundary is 13:00 UTC.
    useConfig(dailyAtOne());
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "morning" });
    setNow(T0 + 1500);
    await runAlarm(key);
    await router(key).drained();
    const HOUR = 3_600_000;
    setNow(T0 + HOUR - 1000);
    await send({ chat_id: chat, text: "just before one" });
    // The boundary passes while the message waits for its window: the alarm does not end the
    // session under it, and comes back at the window's end (not every millisecond until then).
    const alarms: number[] = [];
    for (let i = 0; i < 10; i++) {
      const at = await alarmOf(key);
      if (at === null || at > T0 + HOUR + 500) break;
      alarms.push(at - T0);
      setNow(at);
      await runAlarm(key);
      await router(key).drained();
    }
    expect(alarms.filter((at) => at >= HOUR - 1000)).toEqual([HOUR, HOUR + 500]);
    expect(callTexts()).toEqual([["morning"], ["just before one"]]);
    expect(services.agentCalls()[1]!.json.session.id).toBe(first.body.session_id);
    // Its reply came after the boundary: the session lives to the next one (as a hand-off
    // retried across the boundary does).
    await runAlarm(key);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
  });
});

describe("debounce_ms: a second message after the boundary, the first still in its window", () => {
  it("joins the session the first message holds open: both go in one run there, and no session ends under them", async () => {
    useConfig(dailyAtOne());
    services = fake(() => replyWith("ok"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const HOUR = 3_600_000;
    setNow(T0 + HOUR - 1000);
    const first = await send({ chat_id: chat, text: "just before one" });
    setNow(T0 + HOUR + 200);
    const second = await send({ chat_id: chat, text: "and after" });
    expect(second.body.session_id).toBe(first.body.session_id);
    setNow(T0 + HOUR + 1700);
    await runAlarm(key);
    await router(key).drained();
    expect(callTexts()).toEqual([["just before one", "and after"]]);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: null });
  });
});
