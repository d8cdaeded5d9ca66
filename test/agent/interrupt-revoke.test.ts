/**
 * What an interrupt's D1 statements do to today's run API (spec "Overlapping
 * messages", interrupt): the revoked run's heartbeat says 409 `superseded`, its
 * reply through the API is refused and never recorded nor delivered, and its
 * messages wait again for the run that replaces it.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, expect, it } from "vitest";
import { Database } from "../../src/db/client";
import { releaseMessages, revokeInterrupted } from "../../src/db/overlap";
import { T0, genericKey, messagesOf, restoreClock, runAlarm, send, setNow, unique, useConfig } from "../helpers";
import { accepted, agentApi, agentConfig, fakeServices } from "./support";

const db = new Database(env.DB, "background");
let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig());
});
afterEach(() => {
  services?.restore();
  restoreClock();
  useConfig(null);
});

it("an interrupted run is told superseded, its reply is never recorded nor delivered, its message waits again", async () => {
  services = fakeServices(() => accepted());
  const chat = unique("chat");
  const key = genericKey(chat);
  const sent = await send({ chat_id: chat, text: "book Paris" });
  await runAlarm(key);
  const { run_id, run_token } = services.agentCalls()[0]!.json;
  expect((await agentApi(`/v1/runs/${run_id}/heartbeat`, run_token)).body).toEqual({ owns: true });

  const [revoked, released] = await db.batch(revokeInterrupted(run_id), releaseMessages(sent.body.session_id, run_id));
  expect([revoked, released]).toEqual([1, 1]);

  expect(await agentApi(`/v1/runs/${run_id}/heartbeat`, run_token)).toEqual({
    status: 409,
    body: { owns: false, reason: "superseded" },
  });
  expect(await agentApi(`/v1/runs/${run_id}/reply`, run_token, { text: "stale answer" })).toEqual({
    status: 409,
    body: { owns: false, reason: "superseded" },
  });
  // The run's record stays revoked, not finished.
  const runRow = await env.DB.prepare(`SELECT finished_at, revoked_reason FROM runs WHERE id = ?`).bind(run_id).first();
  expect(runRow).toEqual({ finished_at: null, revoked_reason: "superseded" });
  await runAlarm(key);
  expect(services.replies()).toEqual([]);
  const messages = await messagesOf(sent.body.session_id);
  expect(messages.map((m) => m.text)).toEqual(["book Paris"]);
  const row = await env.DB.prepare(`SELECT run_id, not_dispatched FROM messages WHERE session_id = ?`)
    .bind(sent.body.session_id)
    .first();
  expect(row).toEqual({ run_id: null, not_dispatched: null });
});
