/**
 * The adapter contract: what every chat platform must do, whatever its wire format.
 * Each platform test file runs it once, `adapterContract(fixture)`, with a fixture
 * built from that file's own request builders (signing, fresh ids) and its own fake
 * of the platform API, so a behaviour is written once and checked for every adapter:
 * dedupe of a redelivered event, commands in the message text, the reset notice,
 * delivery retries and permanent failures, and no silent drop when D1 fails.
 *
 * It relies on the setup of the file that calls it: the clock at T0 before each test,
 * `SESSION_RESET` idle after 60 minutes, no AGENT_URL (the echo agent answers
 * `echo: {text}`), and outbound fetch captured with the platform API's answers queued
 * (an empty queue answers a successful send). Every test drives each message to its
 * reply (post, then the alarm) before the next, so none depends on how the overlap
 * mode groups messages into runs.
 */
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { NOTICE_TEXT } from "../../src/platforms/types";
import { HOUR, T0, deliveriesOf, messagesOf, router, runAlarm, sessionRow, sessionsOfKey, setNow } from "../helpers";

/** A webhook's answer as the contract compares it. */
export interface Answer {
  status: number;
  body: unknown;
}

/** A call to the platform API that delivers a message, as the contract compares it. */
export interface SendCall {
  method: string;
  url: string;
  json: unknown;
}

/** One conversation of the platform: its session key, plus whatever ids the fixture needs. */
export interface ContractChat {
  key: string;
}

export interface AdapterFixture<Chat extends ContractChat, Event> {
  platform: string;
  /** A conversation of its own (storage is shared by the tests of a file). */
  chat(): Chat;
  /** A new inbound text message in `chat`, with a fresh event id. */
  message(chat: Chat, text: string): Event;
  /** The id the gateway remembers the event by (`inbound_events.event_id`). */
  eventId(event: Event): string;
  /** Posts the event, signed, through the worker's own fetch; `redelivery` n > 0 is the platform's n-th retry of it. */
  post(event: Event, redelivery?: number): Promise<Answer>;
  /** The body of the 2xx that acknowledges a routed message. */
  accepted: unknown;
  /**
   * Where `/new`, `/reset` and `/stop` are answered: in the chat (a send, recorded as a
   * `command` delivery), or in the webhook's own response (`body(text)`), with no send.
   */
  commandAnswer: { in: "chat" } | { in: "response"; body: (text: string) => unknown };
  /** The calls captured so far that deliver a message to a chat, oldest first. */
  sends(): SendCall[];
  /** The call that delivers `text` to `chat`, as `sends()` shows it. */
  sendTo(chat: Chat, text: string): SendCall;
  /** Queues the platform API's answers to the next sends; a factory that throws is a network error. */
  answerNext(...answers: (() => Response)[]): void;
  failures: {
    /** 5xx answers, one per failed attempt, in order: each is retried with backoff. */
    serverErrors: (() => Response)[];
    /** A 429 and the delay it asks for, read the platform's way (header or body field). */
    rateLimit: { answer: () => Response; retryAfterMs: number };
    /** Answers that fail for good (4xx), with a phrase the recorded error must carry, if any. */
    permanent: { what: string; answer: () => Response; error?: string }[];
  };
}

export const STARTED_TEXT = "Started a new session.";
export const STOPPED_TEXT = "Stopped. Your next message starts a new session.";
export const DUPLICATE_COMMAND_TEXT = "This command was already handled.";

/** A webhook response read as the contract compares it (an empty body is null). */
export async function answerOf(response: Response): Promise<Answer> {
  const text = await response.text();
  return { status: response.status, body: text === "" ? null : JSON.parse(text) };
}

/** Runs `action` while D1 cannot store a message: the `messages` table is renamed away. */
async function whileMessagesTableIsGone<T>(action: () => Promise<T>): Promise<T> {
  await env.DB.exec("ALTER TABLE messages RENAME TO messages_away");
  try {
    return await action();
  } finally {
    await env.DB.exec("ALTER TABLE messages_away RENAME TO messages");
  }
}

async function onlySession(key: string) {
  const rows = await sessionsOfKey(key);
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

async function deliveryItems(key: string) {
  return (await router(key).outbox()).filter((item) => item.kind === "delivery");
}

async function dedupeMark(eventId: string) {
  return env.DB.prepare(`SELECT 1 FROM inbound_events WHERE event_id = ?`).bind(eventId).first();
}

const userTexts = async (sessionId: string) =>
  (await messagesOf(sessionId)).filter((m) => m.role === "user").map((m) => m.text);

/** Registers the contract's tests for one adapter. */
export function adapterContract<Chat extends ContractChat, Event>(f: AdapterFixture<Chat, Event>): void {
  const accepted: Answer = { status: 200, body: f.accepted };

  /** Sends "hello" in a fresh chat and runs the alarm once: the first reply is attempted. */
  async function firstReply() {
    const chat = f.chat();
    expect(await f.post(f.message(chat, "hello"))).toEqual(accepted);
    await runAlarm(chat.key);
    return { chat, session: await onlySession(chat.key) };
  }

  describe(`adapter contract: ${f.platform}`, () => {
    describe("dedupe on the event id (invariant 9)", () => {
      it("stores a redelivered event once and answers it once, even when it comes after the reply", async () => {
        const chat = f.chat();
        const event = f.message(chat, "hello");
        expect(await f.post(event)).toEqual(accepted);
        expect(await f.post(event, 1)).toEqual(accepted);
        const session = await onlySession(chat.key);
        expect(await messagesOf(session.id)).toHaveLength(1);
        await runAlarm(chat.key);
        expect(await f.post(event, 2)).toEqual(accepted); // a late retry, after the reply
        await runAlarm(chat.key);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: hello")]);
        expect((await messagesOf(session.id)).map((m) => [m.role, m.text])).toEqual([
          ["user", "hello"],
          ["assistant", "echo: hello"],
        ]);
      });

      it("remembers event ids for 24 hours, across an idle reset", async () => {
        const chat = f.chat();
        const event = f.message(chat, "hello");
        await f.post(event);
        await runAlarm(chat.key);
        setNow(T0 + 23 * HOUR);
        expect(await f.post(event, 1)).toEqual(accepted);
        await runAlarm(chat.key);
        expect(await sessionsOfKey(chat.key)).toHaveLength(1);
        expect(f.sends()).toHaveLength(1);
      });

      it("routes a new event id with the same text as a new message", async () => {
        const chat = f.chat();
        for (let i = 0; i < 2; i++) {
          expect(await f.post(f.message(chat, "same"))).toEqual(accepted);
          await runAlarm(chat.key);
        }
        const session = await onlySession(chat.key);
        expect(await userTexts(session.id)).toEqual(["same", "same"]);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: same"), f.sendTo(chat, "echo: same")]);
      });
    });

    describe("commands in the message text", () => {
      it("/new ends the session, starts a fresh empty one, and is answered once", async () => {
        const chat = f.chat();
        await f.post(f.message(chat, "hello"));
        await runAlarm(chat.key);
        const first = await onlySession(chat.key);
        const answer = await f.post(f.message(chat, "/new"));
        expect(await sessionRow(first.id)).toMatchObject({ end_reason: "new_command" });
        const rows = await sessionsOfKey(chat.key);
        expect(rows).toHaveLength(2);
        expect(rows[1]).toMatchObject({ end_reason: null, previous_session_id: first.id });
        expect(await messagesOf(rows[1]!.id)).toEqual([]);
        await runAlarm(chat.key);
        if (f.commandAnswer.in === "chat") {
          expect(answer).toEqual(accepted);
          expect(f.sends()).toEqual([f.sendTo(chat, "echo: hello"), f.sendTo(chat, STARTED_TEXT)]);
          expect(await deliveriesOf(rows[1]!.id)).toMatchObject([{ kind: "command", status: "sent", attempts: 1 }]);
        } else {
          expect(answer).toEqual({ status: 200, body: f.commandAnswer.body(STARTED_TEXT) });
          expect(f.sends()).toEqual([f.sendTo(chat, "echo: hello")]);
          expect(await deliveriesOf(rows[1]!.id)).toEqual([]);
        }
      });

      it("/reset does what /new does", async () => {
        const chat = f.chat();
        await f.post(f.message(chat, "hello"));
        await runAlarm(chat.key);
        const first = await onlySession(chat.key);
        expect((await f.post(f.message(chat, "/reset"))).status).toBe(200);
        expect(await sessionRow(first.id)).toMatchObject({ end_reason: "new_command" });
        expect((await sessionsOfKey(chat.key)).map((s) => s.end_reason)).toEqual(["new_command", null]);
      });

      it("/stop suspends the session; the next reply carries the notice on its first line", async () => {
        const chat = f.chat();
        await f.post(f.message(chat, "hello"));
        const first = await onlySession(chat.key);
        const answer = await f.post(f.message(chat, "/stop"));
        expect(await sessionRow(first.id)).toMatchObject({ end_reason: "suspended" });
        await f.post(f.message(chat, "again"));
        await runAlarm(chat.key);
        // The run of "hello" was revoked by /stop: its echo is never sent.
        const reply = f.sendTo(chat, `${NOTICE_TEXT.suspended}\necho: again`);
        if (f.commandAnswer.in === "chat") {
          expect(f.sends()).toEqual([f.sendTo(chat, STOPPED_TEXT), reply]);
        } else {
          expect(answer).toEqual({ status: 200, body: f.commandAnswer.body(STOPPED_TEXT) });
          expect(f.sends()).toEqual([reply]);
        }
      });

      it("a redelivered command is handled once and answered once", async () => {
        const chat = f.chat();
        const command = f.message(chat, "/new");
        const first = await f.post(command);
        const retry = await f.post(command, 1);
        await runAlarm(chat.key);
        expect(await sessionsOfKey(chat.key)).toHaveLength(1);
        if (f.commandAnswer.in === "chat") {
          expect([first, retry]).toEqual([accepted, accepted]);
          expect(f.sends()).toEqual([f.sendTo(chat, STARTED_TEXT)]);
        } else {
          expect(first).toEqual({ status: 200, body: f.commandAnswer.body(STARTED_TEXT) });
          expect(retry).toEqual({ status: 200, body: f.commandAnswer.body(DUPLICATE_COMMAND_TEXT) });
          expect(f.sends()).toEqual([]);
        }
      });
    });

    describe("reset notice (invariant 10)", () => {
      it("puts the reset notice on the first line of the first reply after an idle reset, and only there", async () => {
        const chat = f.chat();
        await f.post(f.message(chat, "before"));
        await runAlarm(chat.key);
        setNow(T0 + 2 * HOUR);
        await f.post(f.message(chat, "after"));
        await runAlarm(chat.key);
        await f.post(f.message(chat, "again"));
        await runAlarm(chat.key);
        expect(f.sends()).toEqual([
          f.sendTo(chat, "echo: before"),
          f.sendTo(chat, `${NOTICE_TEXT.idle}\necho: after`),
          f.sendTo(chat, "echo: again"),
        ]);
      });
    });

    describe("delivery of replies (visible in the operator API)", () => {
      it("retries 5xx answers with backoff, resending the same message, then records it sent", async () => {
        const { serverErrors } = f.failures;
        // Made here for their status only; the fake API makes its own when asked.
        const statuses = serverErrors.map((answer) => answer().status);
        f.answerNext(...serverErrors);
        const { chat, session } = await firstReply();
        let now = T0;
        for (const [i, status] of statuses.entries()) {
          expect(status).toBeGreaterThanOrEqual(500);
          expect(await deliveriesOf(session.id)).toMatchObject([
            { kind: "reply", status: "pending", attempts: i + 1, last_status: status, last_error: expect.any(String) },
          ]);
          const [item] = await deliveryItems(chat.key);
          expect(item).toMatchObject({ dueAt: now + 1_000 * 2 ** i, attempts: i + 1 });
          now = item!.dueAt;
          setNow(now);
          await runAlarm(chat.key);
        }
        expect(await deliveriesOf(session.id)).toMatchObject([
          { kind: "reply", status: "sent", attempts: statuses.length + 1, last_status: 200, last_error: null },
        ]);
        expect(f.sends()).toEqual(Array(statuses.length + 1).fill(f.sendTo(chat, "echo: hello")));
        expect(await deliveryItems(chat.key)).toEqual([]);
      });

      it("retries a 429 after the platform's retry-after, not before, then records it sent", async () => {
        const { answer, retryAfterMs } = f.failures.rateLimit;
        f.answerNext(answer);
        const { chat, session } = await firstReply();
        expect(await deliveriesOf(session.id)).toMatchObject([
          {
            kind: "reply",
            status: "pending",
            attempts: 1,
            last_status: 429,
            last_error: expect.stringContaining("429"),
          },
        ]);
        const [item] = await deliveryItems(chat.key);
        expect(item).toMatchObject({ dueAt: T0 + retryAfterMs, attempts: 1 });
        setNow(T0 + retryAfterMs - 1);
        await runAlarm(chat.key);
        expect(f.sends()).toHaveLength(1); // not due yet
        setNow(T0 + retryAfterMs);
        await runAlarm(chat.key);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: hello"), f.sendTo(chat, "echo: hello")]);
        expect(await deliveriesOf(session.id)).toMatchObject([
          { kind: "reply", status: "sent", attempts: 2, last_status: 200, last_error: null },
        ]);
        expect(await deliveryItems(chat.key)).toEqual([]);
      });

      it("retries a network error", async () => {
        f.answerNext(() => {
          throw new TypeError("Network connection lost.");
        });
        const { chat, session } = await firstReply();
        expect(await deliveriesOf(session.id)).toMatchObject([
          { kind: "reply", status: "pending", attempts: 1, last_status: null, last_error: expect.any(String) },
        ]);
        setNow(T0 + 1_000);
        await runAlarm(chat.key);
        expect(await deliveriesOf(session.id)).toMatchObject([{ status: "sent", attempts: 2, last_status: 200 }]);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: hello"), f.sendTo(chat, "echo: hello")]);
      });

      for (const { what, answer, error } of f.failures.permanent) {
        it(`records ${what} as failed without retrying`, async () => {
          const status = answer().status; // made here for its status only
          expect(status).toBeGreaterThanOrEqual(400);
          expect(status).toBeLessThan(500);
          f.answerNext(answer);
          const { chat, session } = await firstReply();
          expect(await deliveriesOf(session.id)).toMatchObject([
            {
              kind: "reply",
              status: "failed",
              attempts: 1,
              last_status: status,
              last_error: error === undefined ? expect.any(String) : expect.stringContaining(error),
            },
          ]);
          expect(await deliveryItems(chat.key)).toEqual([]);
          setNow(T0 + HOUR);
          await runAlarm(chat.key);
          expect(f.sends()).toHaveLength(1);
        });
      }
    });

    describe("no silent drop (invariant 1)", () => {
      it("answers 503 when D1 fails in a live session, marks nothing; the retry is stored once and answered once", async () => {
        const chat = f.chat();
        await f.post(f.message(chat, "before"));
        await runAlarm(chat.key);
        const session = await onlySession(chat.key);
        const event = f.message(chat, "during");
        const failed = await whileMessagesTableIsGone(() => f.post(event));
        expect(failed).toEqual({ status: 503, body: { error: { code: "unavailable", message: expect.any(String) } } });
        expect(await userTexts(session.id)).toEqual(["before"]);
        expect(await dedupeMark(f.eventId(event))).toBeNull();

        expect(await f.post(event, 1)).toEqual(accepted);
        expect(await f.post(event, 2)).toEqual(accepted);
        expect(await userTexts(session.id)).toEqual(["before", "during"]);
        await runAlarm(chat.key);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: before"), f.sendTo(chat, "echo: during")]);
      });

      it("answers 503 when D1 fails on a chat's first message and starts no session; the retry is stored once and answered once", async () => {
        const chat = f.chat();
        const event = f.message(chat, "first words");
        const failed = await whileMessagesTableIsGone(() => f.post(event));
        expect(failed).toEqual({ status: 503, body: { error: { code: "unavailable", message: expect.any(String) } } });
        expect(await sessionsOfKey(chat.key)).toEqual([]);
        expect(await dedupeMark(f.eventId(event))).toBeNull();

        expect(await f.post(event, 1)).toEqual(accepted);
        expect(await f.post(event, 2)).toEqual(accepted);
        const session = await onlySession(chat.key);
        expect(await userTexts(session.id)).toEqual(["first words"]);
        await runAlarm(chat.key);
        expect(f.sends()).toEqual([f.sendTo(chat, "echo: first words")]);
        expect(await sessionRow(session.id)).toMatchObject({ end_reason: null });
      });
    });
  });
}
