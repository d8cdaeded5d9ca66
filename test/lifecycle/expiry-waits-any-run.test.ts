/**
 * Expiry waits for every unfinished run of the session, not only the current one
 * (spec invariant 6, "an acknowledged message is never dropped by expiry"): each
 * message is its own run, and a run only superseded by a newer one is not revoked
 * and delivers its reply. The crash check found an earlier run, answered 202 after
 * a restart, dropped by the idle alarm once the newer, current run had finished.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  MINUTE,
  T0,
  alarmOf,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { RUN_LEASE_MS } from "../../src/domain/turn-hold";
import { accepted, agentApi, agentConfig, CONCURRENT, fakeServices, replyWith } from "../agent/support";

const IDLE_1 = JSON.stringify({ mode: "idle", idle_minutes: 1 });
let services: ReturnType<typeof fakeServices>;

beforeEach(() => setNow(T0));
afterEach(() => {
  services?.restore();
  restoreClock();
  useConfig(null);
});

async function alarmsUntil(key: string, until: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const at = await alarmOf(key);
    if (at === null || at > until) return;
    setNow(at);
    await runAlarm(key);
  }
  throw new Error("the alarm did not settle");
}

/** m1 accepted with 202 at T0; m2, ten seconds later, answered at once and finished (the current run). */
async function earlierRunStillOpen(chat: string) {
  services = fakeServices((request) => (request.json.message.text === "one" ? accepted() : replyWith("two answered")));
  const key = genericKey(chat);
  const first = await send({ chat_id: chat, text: "one" });
  await runAlarm(key);
  const m1 = services.agentCalls()[0]!.json;
  setNow(T0 + 10_000);
  const second = await send({ chat_id: chat, text: "two" });
  expect(second.body.session_id).toBe(first.body.session_id);
  await runAlarm(key);
  expect(services.replies().map((r) => r.text)).toEqual(["two answered"]);
  return { key, sessionId: first.body.session_id as string, runId: m1.run_id as string, token: m1.run_token as string };
}

describe("an earlier run still open when the current one finished", () => {
  it("holds the session past its deadline; its late reply is recorded and delivered, then idle ends it", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "", ...CONCURRENT }));
    const chat = unique("chat");
    const m1 = await earlierRunStillOpen(chat);
    await alarmsUntil(m1.key, T0 + 5 * MINUTE);
    expect(await sessionRow(m1.sessionId)).toMatchObject({ end_reason: null });
    setNow(T0 + 6 * MINUTE);
    expect(await agentApi(`/v1/runs/${m1.runId}/reply`, m1.token, { text: "one answered" })).toEqual({
      status: 200,
      body: { recorded: true },
    });
    await alarmsUntil(m1.key, T0 + 6 * MINUTE + 1_000);
    expect(services.replies().map((r) => r.text)).toEqual(["two answered", "one answered"]);
    expect((await messagesOf(m1.sessionId)).map((m) => m.text)).toEqual(["one", "two", "two answered", "one answered"]);
    await alarmsUntil(m1.key, T0 + 20 * MINUTE);
    expect(await sessionRow(m1.sessionId)).toMatchObject({ end_reason: "idle", ended_at: T0 + 7 * MINUTE + 1 });
  });

  it("gone silent: the session ends by its policy when that run's lease runs out, not before", async () => {
    useConfig(agentConfig({ SESSION_RESET: IDLE_1, HOOK_URLS: "", ...CONCURRENT }));
    const chat = unique("chat");
    const m1 = await earlierRunStillOpen(chat);
    await alarmsUntil(m1.key, T0 + RUN_LEASE_MS - 1);
    expect(await sessionRow(m1.sessionId)).toMatchObject({ end_reason: null });
    await alarmsUntil(m1.key, T0 + RUN_LEASE_MS);
    expect(await sessionRow(m1.sessionId)).toMatchObject({ end_reason: "idle", ended_at: T0 + RUN_LEASE_MS });
  });
});
