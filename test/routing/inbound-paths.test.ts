/**
 * The paths of one routed message, as an operator sees them:
 * - the one log line per routed message (`message routed`) names the routing decision
 *   that took the message where it went (append, reopen, fresh, promoted, duplicate,
 *   command), and a resend counts in `duplicates` of `GET /admin/metrics`;
 * - a platform's resend leaves the route as it was, whichever session holds the
 *   message, also after the operator forgot the route, and costs only its reads;
 * - a message that waited behind a run of a session ended meanwhile starts a fresh
 *   session and goes out at once (nothing left waiting).
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { accepted, agentConfig, fakeServices, replyWith } from "../agent/support";
import {
  MINUTE,
  T0,
  adminFetch,
  genericKey,
  loggedLines,
  restoreClock,
  runAlarm,
  send,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
  type GenericMessage,
} from "../helpers";
import { endBySql } from "./overlap-support";

let services: ReturnType<typeof fakeServices>;

beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ HOOK_URLS: "" }));
  services = fakeServices(() => accepted());
});
afterEach(() => {
  vi.restoreAllMocks();
  services.restore();
  restoreClock();
  useConfig(null);
});

/** Sends `message` and returns its answer with the `message routed` lines it logged. */
async function routed(message: GenericMessage) {
  const spy = vi.spyOn(console, "log").mockImplementation(() => undefined);
  try {
    const sent = await send(message);
    return { ...sent, lines: loggedLines(spy, "message routed") };
  } finally {
    spy.mockRestore();
  }
}

async function duplicatesCounted(): Promise<number> {
  return ((await (await adminFetch("/admin/metrics")).json()) as { duplicates: number }).duplicates;
}

describe("the decision each routed message is logged with", () => {
  it("a new key's first message is fresh, the next one appends", async () => {
    const chat = unique("chat");
    const first = await routed({ chat_id: chat, text: "one" });
    expect(first.lines).toMatchObject([
      { decision: "fresh", session_id: first.body.session_id, session_key: genericKey(chat) },
    ]);
    const second = await routed({ chat_id: chat, text: "two" });
    expect(second.lines).toMatchObject([{ decision: "append", session_id: first.body.session_id }]);
  });

  it("a message to a row the agent released within its policy reopens it", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await endBySql(first.body.session_id, T0 + MINUTE);
    setNow(T0 + 2 * MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.body.session_id).toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "reopen", session_id: first.body.session_id }]);
  });

  it("a message past the deadline, before the alarm ran, is promoted: it ended the old session", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    // The agent's reply lands so nothing holds the session open past its deadline.
    await runAlarm(genericKey(chat));
    setNow(T0 + 61 * MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "promoted", session_id: next.body.session_id }]);
  });

  it("a message after an operator's end starts a fresh session, and says fresh", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await endBySql(first.body.session_id, T0 + MINUTE, "admin");
    setNow(T0 + 2 * MINUTE);
    const next = await routed({ chat_id: chat, text: "two" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    expect(next.lines).toMatchObject([{ decision: "fresh", session_id: next.body.session_id }]);
  });

  it("a platform's resend is a duplicate, counted once in the metrics", async () => {
    services.restore();
    services = fakeServices(() => replyWith("answered"));
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    // Answered: nothing is unfinished, so the resend is not judged as a waiting message.
    await runAlarm(genericKey(chat));
    const before = await duplicatesCounted();
    const resend = await routed({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(resend.lines).toMatchObject([{ decision: "duplicate", session_id: first.body.session_id }]);
    expect(await duplicatesCounted()).toBe(before + 1);
  });

  it("a command is logged as a command", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat, text: "one" });
    const command = await routed({ chat_id: chat, text: "/new" });
    expect(command.status).toBe(200);
    expect(command.lines).toMatchObject([{ decision: "command", session_id: command.body.session_id }]);
  });
});

describe("a message that waits behind an unfinished run (queue mode)", () => {
  it("is logged as appended to the session it waits in", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(genericKey(chat));
    const waiting = await routed({ chat_id: chat, text: "two" });
    expect(waiting.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: false });
    expect(waiting.lines).toMatchObject([{ decision: "append", session_id: first.body.session_id }]);
  });

  it("resent, is a duplicate, counted once in the metrics", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    await runAlarm(genericKey(chat));
    const waiting = await send({ chat_id: chat, text: "two" });
    const before = await duplicatesCounted();
    const resend = await routed({ chat_id: chat, text: "two", event_id: waiting.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(resend.lines).toMatchObject([{ decision: "duplicate", session_id: first.body.session_id }]);
    expect(await duplicatesCounted()).toBe(before + 1);
  });
});

describe("a platform's resend", () => {
  const routeView = async (key: string) =>
    (await (await adminFetch(`/admin/routes/${encodeURIComponent(key)}`)).json()) as any;
  const counters = async () => (await (await adminFetch("/admin/metrics")).json()) as Record<string, number>;

  it("of a message the live session holds costs two ingress batches, every read on the webhook's path", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat, text: "one" });
    const before = await counters();
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    const after = await counters();
    expect(resend.body).toMatchObject({ duplicate: true, session_id: first.body.session_id });
    // The append that finds the dedupe mark, then the reread of the row and the mark.
    expect(after.d1_batches_ingress! - before.d1_batches_ingress!).toBe(2);
    expect(after.d1_rows_read_ingress! - before.d1_rows_read_ingress!).toBe(after.d1_rows_read! - before.d1_rows_read!);
  });

  it("of a message an earlier session holds answers that session and leaves the route on the live one", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    await send({ chat_id: chat, text: "/new" });
    setNow(T0 + MINUTE);
    const live = await send({ chat_id: chat, text: "two" });
    expect(live.body.session_id).not.toBe(first.body.session_id);
    const before = await routeView(key);
    expect(before.alarm_at).toBe(T0 + 61 * MINUTE + 1);
    const counted = await counters();
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend.body).toEqual({ accepted: true, session_id: first.body.session_id, duplicate: true });
    expect(await routeView(key)).toEqual(before);
    // Only the newest row of the key is read to tell the entry is right, on the webhook's path.
    const after = await counters();
    expect(after.d1_batches_ingress! - counted.d1_batches_ingress!).toBe(3);
    expect(after.d1_rows_read_ingress! - counted.d1_rows_read_ingress!).toBe(6);
    // The routing object's own storage: the resend waits behind the live session's run
    // (a row added and removed, with its index), and the entry stands as it was.
    expect(after.do_rows_written! - counted.do_rows_written!).toBe(4);
  });

  it("after the operator forgot the route is still a duplicate of the session that holds it", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "one" });
    const forgotten = await adminFetch(`/admin/routes/${encodeURIComponent(key)}`, { method: "DELETE" });
    expect(forgotten.status).toBe(200);
    const resend = await send({ chat_id: chat, text: "one", event_id: first.eventId });
    expect(resend).toMatchObject({
      status: 200,
      body: { accepted: true, session_id: first.body.session_id, duplicate: true },
    });
    expect((await sessionsOfKey(key)).map((row) => row.id)).toEqual([first.body.session_id]);
  });
});
