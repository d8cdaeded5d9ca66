/**
 * OUTBOX_DRAIN=inline (the default): staged work starts in the background of the
 * request that staged it, without waiting for the alarm; the alarm stays armed a
 * little later as the safety net, and failed work keeps its backoff.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
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
import { COMMAND_REPLIES } from "../../src/domain/commands";
import { OutboxTable as RouterStorage } from "../../src/routing/outbox-table";
import type { DeliveryWork } from "../../src/routing/work";
import { accepted, agentConfig, CONCURRENT, fakeServices, replyWith } from "../agent/support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
});
afterEach(() => {
  services?.restore();
  restoreClock();
  useConfig(null);
});

/** Waits for the background drain of a key's routing object, if one runs (its `drained()` seam). */
async function settled(key: string): Promise<void> {
  await router(key).drained();
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
    // Let the alarm reach its drain (a local D1 read) before the agent answers. On a
    // slow machine it may come only after the drain ended; it then finds nothing to
    // do and the alarm is at the deadline already (accepted below).
    await new Promise((resolve) => setTimeout(resolve, 100));
    agent.release();
    await alarm;
    await settled(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies().map((r) => r.text)).toEqual(["done"]);
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["slow", "done"]);
    // The reply's delivery left its safety net; firing it sends nothing twice.
    expect([T0 + 10_000, T0 + 60 * MINUTE + 1]).toContain(await alarmOf(key));
    setNow(T0 + 10_000);
    await runAlarm(key);
    expect(services.agentCalls()).toHaveLength(1);
    expect(services.replies()).toHaveLength(1);
    expect(await alarmOf(key)).toBe(T0 + 60 * MINUTE + 1);
  });

  it("drained() resolves only once the background drain has ended (the seam tests wait on)", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    const agent = held(() => replyWith("later"));
    services = fakeServices(() => agent.response());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "wait for me" });
    await agent.called;
    let done = false;
    const drained = router(key)
      .drained()
      .then(() => (done = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(done).toBe(false);
    agent.release();
    await drained;
    // Once drained, the reply is recorded and delivered: nothing is still in flight.
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["wait for me", "later"]);
    expect(services.replies().map((r) => r.text)).toEqual(["later"]);
  });

  it("starts a second message's hand-off while the first is still in flight (concurrent mode)", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline", ...CONCURRENT }));
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

describe("command answers (staged before the command's D1 batch)", () => {
  const commandAnswers = () => services.replies().filter((r) => r.text === COMMAND_REPLIES.started);

  it("are sent only once D1 has stored the command: a failed batch sends nothing, its retry answers once", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "hello" });
    await settled(key);
    await env.DB.exec("ALTER TABLE deliveries RENAME TO deliveries_away");
    let failed;
    try {
      failed = await send({ chat_id: chat, text: "/new" });
      await settled(key);
    } finally {
      await env.DB.exec("ALTER TABLE deliveries_away RENAME TO deliveries");
    }
    expect(failed.status).toBe(503);
    expect(commandAnswers()).toHaveLength(0);
    expect(await router(key).outbox()).toEqual([]);

    const retry = await send({ chat_id: chat, text: "/new", event_id: failed.eventId });
    expect(retry.status).toBe(200);
    await settled(key);
    expect(commandAnswers()).toHaveLength(1);
  });

  it("are dropped, not sent, when the object restarted before D1 stored the command", async () => {
    useConfig(agentConfig({ OUTBOX_DRAIN: "inline" }));
    services = fakeServices(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "hello" });
    await settled(key);
    // What a restart leaves behind when the object died before its batch reached D1:
    // the staged answer, with no delivery row.
    await runInDurableObject(router(key), (_instance, state) => {
      // The object's own outbox table, through its storage class (no private field).
      const store = new RouterStorage(state.storage.sql);
      store.add({
        id: "dl_never_stored",
        kind: "delivery",
        payload: {
          deliveryId: "dl_never_stored",
          sessionId: sent.body.session_id,
          sessionKey: key,
          platform: "generic",
          kind: "command",
          text: COMMAND_REPLIES.started,
          notice: null,
          eventId: "evt_never_stored",
          target: { platform: "generic", chatId: chat },
        } satisfies DeliveryWork,
        dueAt: T0,
        attempts: 0,
        lastError: null,
        createdAt: T0,
      });
    });
    await runAlarm(key);
    await settled(key);
    expect(commandAnswers()).toHaveLength(0);
    expect(await router(key).outbox()).toEqual([]);
  });
});
