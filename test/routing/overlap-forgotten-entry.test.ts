/**
 * OVERLAP `queue` after the routing entry is forgotten (`DELETE /admin/routes/{key}`,
 * spec "Overlapping messages", invariant 11): the next message resolves its session
 * from D1, and while a run of that session is still unfinished it waits, as with the
 * entry; a session never gets a second unfinished run. Found by the model-based test.
 */
import { env } from "cloudflare:test";
import { expect, it } from "vitest";
import { adminFetch, genericKey, router, runAlarm, send, unique } from "../helpers";
import { replyWith } from "../agent/support";
import { type FakeServices, overlapHooks } from "./overlap-support";

const fake = overlapHooks({});
let services: FakeServices;

it("a message after a forgotten entry waits behind the run still in the outbox, then one run carries it", async () => {
  services = fake((request) => replyWith(`re ${request.json.messages.length}`));
  const chat = unique("chat");
  const key = genericKey(chat);
  const one = await send({ chat_id: chat, text: "one" });
  const forgot = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
  expect(forgot.status).toBe(200);
  const two = await send({ chat_id: chat, text: "two" });
  expect(two.body.session_id).toBe(one.body.session_id);
  const { results } = await env.DB.prepare(
    `SELECT text, run_id FROM messages WHERE session_id = ? AND role = 'user' ORDER BY seq`,
  )
    .bind(one.body.session_id)
    .all<{ text: string; run_id: string | null }>();
  // "two" waits (no run of its own beside the unfinished one).
  expect(results[1]).toMatchObject({ text: "two", run_id: null });
  await runAlarm(key);
  await router(key).drained();
  await runAlarm(key);
  const carried = services.agentCalls().map((c) => (c.json.messages as { text: string }[]).map((m) => m.text));
  expect(carried).toEqual([["one"], ["two"]]);
});
