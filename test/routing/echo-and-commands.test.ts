/**
 * The built-in echo agent and the chat commands, end to end: webhook → routing
 * object → D1 → alarm → reply POSTed to GENERIC_REPLY_URL.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  HOUR,
  T0,
  captureFetch,
  eventsOf,
  genericKey,
  messagesOf,
  restoreClock,
  runAlarm,
  send,
  sessionRow,
  sessionsOfKey,
  setNow,
  unique,
  useConfig,
  type Captured,
} from "../helpers";

const REPLY_URL = "https://client.test/replies";
let outbound: { calls: Captured[]; restore: () => void };

beforeEach(() => {
  setNow(T0);
  useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }), GENERIC_REPLY_URL: REPLY_URL });
  outbound = captureFetch((request) => {
    if (request.url !== REPLY_URL) throw new Error(`unexpected outbound request to ${request.url}`);
    return new Response("ok");
  });
});
afterEach(() => {
  outbound.restore();
  restoreClock();
  useConfig(null);
});

describe("echo agent", () => {
  it("records `echo: <text>` as the assistant message and POSTs it to GENERIC_REPLY_URL", async () => {
    const chat = unique("chat");
    const sent = await send({ chat_id: chat, text: "ping" });
    expect(outbound.calls).toHaveLength(0); // nothing leaves before the acknowledgement
    await runAlarm(genericKey(chat));
    expect((await messagesOf(sent.body.session_id)).map((m) => [m.role, m.text])).toEqual([
      ["user", "ping"],
      ["assistant", "echo: ping"],
    ]);
    expect(outbound.calls).toHaveLength(1);
    expect(outbound.calls[0]!.method).toBe("POST");
    expect(outbound.calls[0]!.json).toEqual({
      kind: "reply",
      event_id: sent.eventId,
      session_key: genericKey(chat),
      session_id: sent.body.session_id,
      text: "echo: ping",
    });
  });

  it("records the reply but sends nothing when GENERIC_REPLY_URL is unset", async () => {
    useConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 60 }) });
    const chat = unique("chat");
    const sent = await send({ chat_id: chat, text: "quiet" });
    await runAlarm(genericKey(chat));
    expect((await messagesOf(sent.body.session_id)).map((m) => m.text)).toEqual(["quiet", "echo: quiet"]);
    expect(outbound.calls).toHaveLength(0);
  });

  it("carries the reset notice on the first reply after an idle reset, and only there", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    await send({ chat_id: chat, text: "before" });
    await runAlarm(key);
    setNow(T0 + 2 * HOUR);
    const after = await send({ chat_id: chat, text: "after" });
    await runAlarm(key);
    await send({ chat_id: chat, text: "again" });
    await runAlarm(key);
    const replies = outbound.calls.map((c) => c.json);
    expect(replies.map((r) => [r.text, r.notice])).toEqual([
      ["echo: before", undefined],
      ["echo: after", "idle"],
      ["echo: again", undefined],
    ]);
    expect(replies[1].session_id).toBe(after.body.session_id);
  });
});

describe("commands", () => {
  it("/new ends the session as new_command and starts a fresh, empty, live one at once", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "hello" });
    const command = await send({ chat_id: chat, text: "/new" });
    expect(command.status).toBe(200);
    expect(command.body).toMatchObject({ accepted: true, duplicate: false });
    const fresh = command.body.session_id;
    expect(fresh).not.toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "new_command", ended_at: T0 });
    expect(await sessionRow(fresh)).toMatchObject({ end_reason: null, previous_session_id: first.body.session_id });
    expect(await messagesOf(fresh)).toEqual([]); // commands are never stored as messages
    expect((await messagesOf(first.body.session_id)).map((m) => m.text)).toEqual(["hello"]);
    // The next message goes to the fresh session.
    expect((await send({ chat_id: chat, text: "next" })).body.session_id).toBe(fresh);
    await runAlarm(key);
    const texts = outbound.calls.map((c) => c.json.text);
    expect(texts).toContain("Started a new session.");
    expect(texts).toContain("echo: next");
    expect(texts).not.toContain("echo: /new");
  });

  it("/reset does what /new does", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    const command = await send({ chat_id: chat, text: "/reset" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "new_command" });
    expect(await sessionRow(command.body.session_id)).toMatchObject({ end_reason: null });
  });

  it("/new on a new key creates the session with no previous one", async () => {
    const chat = unique("chat");
    const command = await send({ chat_id: chat, text: "/new" });
    expect(await sessionsOfKey(genericKey(chat))).toHaveLength(1);
    expect(await sessionRow(command.body.session_id)).toMatchObject({ end_reason: null, previous_session_id: null });
  });

  it("/stop ends the session as suspended; the next message starts fresh and its reply notices it", async () => {
    const chat = unique("chat");
    const key = genericKey(chat);
    const first = await send({ chat_id: chat, text: "work" });
    const stop = await send({ chat_id: chat, text: "/stop" });
    expect(stop.body.session_id).toBe(first.body.session_id);
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "suspended" });
    expect(await sessionsOfKey(key)).toHaveLength(1); // nothing starts until the next message
    const next = await send({ chat_id: chat, text: "again" });
    expect(next.body.session_id).not.toBe(first.body.session_id);
    await runAlarm(key);
    const reply = outbound.calls.map((c) => c.json).find((r) => r.text === "echo: again");
    expect(reply?.notice).toBe("suspended");
    // The message staged before /stop belonged to a stopped session: its run is revoked, never answered.
    expect(outbound.calls.map((c) => c.json.text)).not.toContain("echo: work");
  });

  it("a retried command is a duplicate and changes nothing", async () => {
    const chat = unique("chat");
    await send({ chat_id: chat });
    const command = await send({ chat_id: chat, text: "/new" });
    const retry = await send({ chat_id: chat, text: "/new", event_id: command.eventId });
    expect(retry.body).toEqual({ accepted: true, session_id: command.body.session_id, duplicate: true });
    expect(await sessionsOfKey(genericKey(chat))).toHaveLength(2);
  });

  it("/new after the deadline ends the old session by its policy first", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    // Its hand-off is done first: a turn still in the outbox would hold the session open.
    await runAlarm(genericKey(chat));
    setNow(T0 + 2 * HOUR);
    const command = await send({ chat_id: chat, text: "/new" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ end_reason: "idle" });
    // It replaced an auto-reset session with activity: its first reply owes the notice.
    expect(await sessionRow(command.body.session_id)).toMatchObject({ reset_reason: "idle", notice_pending: "idle" });
    const events = await eventsOf(command.body.session_id);
    expect(events.map((e) => [e.type, e.reason])).toContainEqual(["session.reset", "idle"]);
  });

  it("commands never count as activity", async () => {
    const chat = unique("chat");
    const first = await send({ chat_id: chat });
    setNow(T0 + 30 * 60_000);
    await send({ chat_id: chat, text: "/stop" });
    expect(await sessionRow(first.body.session_id)).toMatchObject({ last_active_at: T0, message_count: 1 });
  });
});
