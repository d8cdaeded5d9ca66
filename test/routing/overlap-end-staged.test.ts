/**
 * A run staged for waiting messages and not yet handed over when its session ends
 * (spec "Overlapping messages", invariant 11): the end records those messages as not
 * dispatched, so the staged run leaves the outbox with them and is never handed to
 * the agent, even when the session reopens (a recoverable end) and a new message
 * comes: neither an interrupt nor the queue carries them on. Found by the model test.
 */
import { expect, it } from "vitest";
import { T0, genericKey, router, runAlarm, send, setNow, unique, useConfig } from "../helpers";
import { accepted, agentApi } from "../agent/support";
import { type FakeServices, overlapHooks, overlapConfig, carriedBy, userMessages } from "./overlap-support";

const fake = overlapHooks();
let services: FakeServices;

const carried = () => carriedBy(services);

for (const mode of ["interrupt", "queue"] as const) {
  it(`${mode}: an agent end drops the run staged for the waiting message; after the reopen it is never handed over`, async () => {
    useConfig(overlapConfig({ OVERLAP: JSON.stringify({ mode }) }));
    services = fake(() => accepted());
    const chat = unique("chat");
    const key = genericKey(chat);
    // "one" is handed over and accepted (202); "two" waits behind it.
    const one = await send({ chat_id: chat, text: "one" });
    const sessionId = one.body.session_id as string;
    await runAlarm(key);
    const run = services.agentCalls()[0]!.json;
    setNow(T0 + 1);
    await send({ chat_id: chat, text: "two" });
    // The reply through the run API finishes "one": a run for "two" is staged (the alarm hands it over).
    setNow(T0 + 2);
    expect((await agentApi(`/v1/runs/${run.run_id}/reply`, run.run_token, { text: "answer one" })).status).toBe(200);
    // Before that hand-off, the agent ends the session (recoverable): "two" is not dispatched.
    setNow(T0 + 3);
    const ended = await agentApi(`/v1/sessions/${sessionId}/end`, run.run_token, { reason: "agent_close" });
    expect(ended.status).toBe(200);
    // A new message reopens the same session; its run carries only itself.
    setNow(T0 + 4);
    const three = await send({ chat_id: chat, text: "three" });
    expect(three.body.session_id).toBe(sessionId);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(carried()).toEqual([["one"], ["three"]]);
    const runIds = services.agentCalls().map((c) => c.json.run_id as string);
    expect(await userMessages(sessionId)).toEqual([
      { text: "one", run_id: runIds[0], not_dispatched: null },
      { text: "two", run_id: null, not_dispatched: "session_ended" },
      { text: "three", run_id: runIds[1], not_dispatched: null },
    ]);
  });
}

it("queue: an end drops a hand-off still being retried (its run is revoked); after the reopen the next message gets its own run", async () => {
  useConfig(overlapConfig());
  // The agent takes "one" but answers 503 (it goes on working), then ends the session.
  services = fake((request) =>
    request.json.message.text === "one" ? new Response("busy", { status: 503 }) : accepted(),
  );
  const chat = unique("chat");
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  await runAlarm(key);
  const first = services.agentCalls()[0]!.json;
  const sessionId = one.body.session_id as string;
  const ended = await agentApi(`/v1/sessions/${sessionId}/end`, first.run_token, { reason: "agent_close" });
  expect(ended.status).toBe(200);
  const two = await send({ chat_id: chat, text: "two" });
  expect(two.body).toMatchObject({ session_id: sessionId });
  // "two" got a run of its own at once: the revoked run no longer holds the session.
  expect((await userMessages(sessionId)).map((m) => [m.text, typeof m.run_id])).toEqual([
    ["one", "string"],
    ["two", "string"],
  ]);
  setNow(T0 + 10 * 60_000);
  await runAlarm(key);
  await router(key).drained();
  // The revoked run's hand-off is not made again.
  expect(carried()).toEqual([["one"], ["two"]]);
});
