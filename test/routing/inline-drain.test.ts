/**
 * OUTBOX_DRAIN=inline (the default): staged work starts in the background of the
 * request that staged it, without waiting for the alarm; the alarm stays armed a
 * little later as the safety net, and failed work keeps its backoff.
 */
import { runInDurableObject } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  MINUTE,
  T0,
  alarmOf,
  genericKey,
  messagesOf,
  restoreClock,
  router,
  runAlarm,
  send,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { accepted, agentConfig, fakeServices, replyWith } from "../agent/support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
});
afterEach(() => {
  services?.restore();
  restoreClock();
  useConfig(null);
});

/** Waits for the background drain of a key's routing object, if one runs. */
async function settled(key: string): Promise<void> {
  const drain = await runInDurableObject(router(key), (instance) => {
    // The drain in flight is private state of the object; the test reaches in to await it.
    const running = (instance as unknown as { activeDrain: Promise<void> | null }).activeDrain;
    return running ? running.then(() => true) : false;
  });
  if (drain) await settled(key);
}

/**
 * An agent that is still working until the test releases it. The response is built
 * in the routing object's own context: I/O objects cannot cross objects.
 */
function held(answer: () => Response) {
  let release!: () => void;
  let reached!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const called = new Promise<void>((resolve) => (reached = resolve));
  const response = () => {
    reached();
    return released.then(answer);
  };
  return { response, called, release };
}

describe("inline drain", () => {
  it("hands the echo reply over without the alarm, then arms the alarm at the session's deadline", async () => {
    useConfig({ ...agentConfig({ OUTBOX_DRAIN: "inline" }), AGENT_URL: "" });
    services = fakeServices(() => {
      throw new Error("no agent is configured");
    });
    const chat = unique("chat");
    const sent = await send({ chat_id: chat, text: "ping" });
    await settled(genericKey(chat));
    expect((await messagesOf(sent.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "ping"],
      ["assistant", "echo: ping"],
    ]);
    expect(services.replies().map((r) => r.text)).toEqual(["echo: ping"]);
    // The safety net stays where the message put it (moving it would be a write per
    // message); when it fires it finds nothing to send and watches the idle deadline.
    expect(await alarmOf(genericKey(chat))).toBe(T0 + 10_000);
    setNow(T0 + 10_000);
    await runAlarm(genericKey(chat));
    expect(services.replies()).toHaveLength(1);
    expect(await alarmOf(genericKey(chat))).toBe(T0 + 60 * MINUTE + 1);
  });

  it("keeps the alarm as a safety net while the hand-off is in flight, and never hands a turn over twice", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    const agent = held(() => replyWith("done"));
    services = fakeServices(() => agent.response());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "slow" });
    await agent.called; // the hand-off started without the alarm
    expect(await alarmOf(key)).toBeGreaterThanOrEqual(T0 + 10_000);
    // The alarm firing while the drain runs joins it rather than starting a second hand-off.
    const alarm = runAlarm(key);
    // Let the alarm reach its drain (a local D1 read) before the agent answers; on a
    // slower machine the alarm only comes later, and the test checks less, never wrongly.
    await new Promise((resolve) => setTimeout(resolve, 100));
    agent.release();
    await alarm;
    await settled(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies().map((r) => r.text)).toEqual(["done"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["slow", "done"]);
    // The reply's delivery left its safety net; firing it sends nothing twice.
    expect(await alarmOf(key)).toBe(T0 + 10_000);
    setNow(T0 + 10_000);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies()).toHaveLength(1);
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);
  });

  it("starts a second message's hand-off while the first is still in flight", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    const first = held(accepted);
    services = fakeServices((request) => (request.json.message.text === "first" ? first.response() : accepted()));
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "first" });
    await first.called;
    await send({ chat_id: chat, text: "second" });
    await expect.poll(() => services.agentCalls().map((c) => c.json.message.text)).toEqual(["first", "second"]);
    first.release();
    await settled(key);
    expect(services.agentCalls()).toHaveLength(2);
  });

  it("leaves a failed hand-off to the alarm at its backoff, and the turn arrives once when the agent is back", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    let up = false;
    services = fakeServices(() => (up ? replyWith("back") : new Response("down", { status: 503 })));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await settled(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(await alarmOf(key)).toBe(T0 + 1_000); // first retry after 1 s
    up = true;
    setNow(T0 + 1_000);
    await runAlarm(key);
    await settled(key);
    expect(services.agentCalls()).toHaveLength(2);
    expect(services.replies().map((r) => r.text)).toEqual(["back"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["hello", "back"]);
  });
});
