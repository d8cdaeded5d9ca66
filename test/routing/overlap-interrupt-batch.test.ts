/**
 * OVERLAP `interrupt` with a small `max_batch` (spec "Overlapping messages",
 * invariant 11): when more messages wait than one run may carry, the run takes the
 * oldest ones and the rest wait for the next run. Those left behind are older than
 * that run, so they do not interrupt it, and no message is ever carried by two runs,
 * even when the first run fails for good. Found by the model-based test.
 */
import { env } from "cloudflare:test";
import { expect, it } from "vitest";
import { T0, adminFetch, genericKey, router, runAlarm, send, setNow, unique, useConfig } from "../helpers";
import { accepted, replyWith } from "../agent/support";
import { type FakeServices, overlapHooks, overlapConfig, carriedBy, userMessages } from "./overlap-support";

const fake = overlapHooks({ OVERLAP: JSON.stringify({ mode: "interrupt", max_batch: 2, debounce_ms: 1_000 }) });
let services: FakeServices;

const carried = () => carriedBy(services);

for (const [outcome, answer] of [
  ["refuses each run (400, failed for good)", () => new Response("no", { status: 400 })],
  ["answers each run", () => replyWith("ok")],
] as const) {
  it(`the agent ${outcome}: the leftover message gets a run of its own, the first run is not revoked`, async () => {
    services = fake(answer);
    const chat = unique("chat");
    const key = `${genericKey(chat, "group")}:u1`;
    const one = await send({ chat_id: chat, chat_type: "group", text: "one" });
    await send({ chat_id: chat, chat_type: "group", text: "two" });
    await send({ chat_id: chat, chat_type: "group", text: "three" });
    setNow(T0 + 1_000);
    await runAlarm(key);
    await router(key).drained();
    await runAlarm(key);
    expect(carried()).toEqual([["one", "two"], ["three"]]);
    const runIds = services.agentCalls().map((c) => c.json.run_id as string);
    const { results: revoked } = await env.DB.prepare(
      `SELECT id FROM runs WHERE id IN (?, ?) AND revoked_reason IS NOT NULL`,
    )
      .bind(runIds[0]!, runIds[1]!)
      .all();
    expect(revoked).toEqual([]);
    expect((await userMessages(one.body.session_id)).map((m) => m.run_id)).toEqual([runIds[0], runIds[0], runIds[1]]);
  });
}

it("behind a hand-off of an ended session: no message is carried by a second run after its first failed", async () => {
  useConfig(overlapConfig({ OVERLAP: JSON.stringify({ mode: "interrupt", max_batch: 2 }) }));
  services = fake(() => new Response("no", { status: 400 }));
  const chat = unique("chat");
  const key = `${genericKey(chat, "group")}:u1`;
  const first = await send({ chat_id: chat, chat_type: "group", text: "before" });
  // An operator ends the session while its run is still in the outbox.
  const ended = await adminFetch(`/admin/sessions/${first.body.session_id}/end`, {
    method: "POST",
    body: JSON.stringify({ reason: "admin" }),
  });
  expect(ended.status).toBe(200);
  const one = await send({ chat_id: chat, chat_type: "group", text: "one" });
  await send({ chat_id: chat, chat_type: "group", text: "two" });
  await send({ chat_id: chat, chat_type: "group", text: "three" });
  expect(one.body.session_id).not.toBe(first.body.session_id);
  await runAlarm(key);
  await router(key).drained();
  await runAlarm(key);
  const texts = carried().flat();
  expect(new Set(texts).size).toBe(texts.length);
  expect(texts.sort()).toEqual(["one", "three", "two"]);
});

it("an interrupt's run counts the revoked run's messages in max_batch: the rest of the waiting ones wait for the next run", async () => {
  useConfig(overlapConfig({ OVERLAP: JSON.stringify({ mode: "interrupt", max_batch: 2 }) }));
  // "one" is taken (202) and then interrupted; every later run is answered.
  services = fake((request) => (request.json.message.text === "one" ? accepted() : replyWith("ok")));
  const chat = unique("chat");
  const key = `${genericKey(chat, "group")}:u1`;
  await send({ chat_id: chat, chat_type: "group", text: "one" });
  await runAlarm(key);
  setNow(T0 + 1);
  for (const text of ["two", "three", "four"]) await send({ chat_id: chat, chat_type: "group", text });
  await runAlarm(key);
  await router(key).drained();
  await runAlarm(key);
  await router(key).drained();
  // The revoked "one" rides again, with as many waiting messages as max_batch leaves room for.
  expect(carried()).toEqual([["one"], ["one", "two"], ["three", "four"]]);
});
