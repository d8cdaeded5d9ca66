/**
 * The hand-off body of a run carrying several messages: `messages` oldest first,
 * `message` the newest, each in the shape today's single-message body has (so the
 * switch-over changes no field an agent already reads).
 */
import { describe, expect, it } from "vitest";
import { handoffMessage, handoffRequest, type HandoffInput } from "../../src/agent/handoff";
import type { RoutedMessage } from "../../src/domain/inbound";
import { agentRequest, type RunWork } from "../../src/routing/work";

const T = 1_900_000_000_000;

function routed(eventId: string, receivedAt: number, overrides: Partial<RoutedMessage> = {}): RoutedMessage {
  return {
    platform: "telegram",
    eventId,
    chatId: "42",
    chatType: "group",
    userId: "7",
    threadId: "3",
    text: `text ${eventId}`,
    sentAt: null,
    replyTo: { platform: "telegram", chat_id: 42, message_thread_id: 3 },
    sessionKey: "telegram:group:42:3:7",
    receivedAt,
    ...overrides,
  };
}

const input = (messages: RoutedMessage[]): HandoffInput => ({
  runId: "run_1",
  token: "tok",
  sessionId: "ses_1",
  sessionKey: "telegram:group:42:3:7",
  isNew: false,
  parentId: null,
  reset: { reason: "idle", had_activity: true, previous_session_id: "ses_0" },
  messages,
});

describe("handoffRequest", () => {
  it("lists every carried message oldest first; message is the newest", () => {
    const body = handoffRequest(input([routed("c", T + 2), routed("a", T), routed("b", T + 1)]));
    expect(body.messages.map((m) => m.event_id)).toEqual(["a", "b", "c"]);
    expect(body.message).toEqual(body.messages[2]);
    expect(body).toMatchObject({
      run_id: "run_1",
      run_token: "tok",
      session: { id: "ses_1", key: "telegram:group:42:3:7", is_new: false, parent_id: null },
      reset: { reason: "idle", had_activity: true, previous_session_id: "ses_0" },
    });
  });

  it("keeps the stored order of messages received at the same instant", () => {
    const body = handoffRequest(input([routed("x", T), routed("y", T), routed("z", T)]));
    expect(body.messages.map((m) => m.event_id)).toEqual(["x", "y", "z"]);
    expect(body.message.event_id).toBe("z");
  });

  it("each message has the shape of today's message, attachments as ids and paths only", () => {
    const m = routed("a", T, {
      attachments: [
        {
          id: "att_1",
          kind: "image",
          mimeType: "image/jpeg",
          name: null,
          size: 10,
          source: { platform: "telegram", ref: "secret-file-id" },
        },
      ],
    });
    const work: RunWork = {
      stage: "dispatch",
      runId: "run_1",
      token: "tok",
      sessionId: "ses_1",
      isNew: false,
      parentId: null,
      reset: null,
      message: m,
    };
    const today = agentRequest(work);
    const body = handoffRequest({ ...input([m]), reset: null });
    expect(body.message).toEqual(today.message);
    expect(body.messages).toEqual([today.message]);
    expect({ ...body, messages: undefined }).toEqual({ ...today, messages: undefined });
    expect(JSON.stringify(body)).not.toContain("secret-file-id");
    expect(handoffMessage(m).attachments).toEqual([
      { id: "att_1", kind: "image", mime_type: "image/jpeg", name: null, size: 10, path: "/v1/attachments/att_1" },
    ]);
  });

  it("refuses a run with no message", () => {
    expect(() => handoffRequest(input([]))).toThrow(/at least one/);
  });
});
