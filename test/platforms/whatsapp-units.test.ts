/**
 * WhatsApp's sender one piece at a time, where whatsapp.test.ts (end to end)
 * cannot reach every case: reply targets refused before any call (for replies
 * and the typing indicator), a long reply whose later part fails, and the sender
 * once WhatsApp is turned off or misconfigured.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { whatsapp } from "../../src/platforms/whatsapp";
import { sendWhatsApp, WHATSAPP_TEXT_LIMIT } from "../../src/platforms/whatsapp/send";
import { sendWhatsAppTyping } from "../../src/platforms/whatsapp/typing";
import type { PlatformEnv } from "../../src/platforms/types";
import { captureFetch, loggedLines, type Captured } from "../helpers";
import { outboundReply } from "./outbound";

const settings = { accessToken: "wa-unit-token", phoneNumberId: "1000", apiBase: "https://graph.test" };
const URL = "https://graph.test/1000/messages";
const REFUSED = {
  ok: false,
  retryable: false,
  retryAfterMs: null,
  status: null,
  error: "malformed whatsapp reply target",
};

let answers: (() => Response)[];
let outbound: { calls: Captured[]; restore: () => void };
beforeEach(() => {
  answers = [];
  outbound = captureFetch(() => (answers.shift() ?? (() => Response.json({ messages: [{ id: "wamid.x" }] })))());
});
afterEach(() => outbound.restore());

const reply = (target: Record<string, unknown>, text?: string) => outboundReply("whatsapp", target, text);

describe("reply targets refused before any call", () => {
  it.each<[string, Record<string, unknown>]>([
    ["neither to nor recipient", {}],
    ["an empty to", { to: "" }],
    ["a to that is not a string", { to: 4915100079946 }],
  ])("%s: a permanent failure, nothing sent", async (_what, target) => {
    expect(await sendWhatsApp(reply(target), settings)).toEqual(REFUSED);
    expect(outbound.calls).toEqual([]);
  });

  it("the typing indicator needs the message it marks read, and a usable number to send from", async () => {
    expect(await sendWhatsAppTyping({ platform: "whatsapp", to: "4915100079946" }, "", settings)).toEqual(REFUSED);
    expect(await sendWhatsAppTyping({ platform: "whatsapp", phone_number_id: 1000 }, "wamid.in", settings)).toEqual(
      REFUSED,
    );
    expect(outbound.calls).toEqual([]);
  });

  it("a user known only by a business-scoped id is addressed as recipient", async () => {
    expect(await sendWhatsApp(reply({ recipient: "BSUID.1" }), settings)).toMatchObject({ ok: true });
    expect(outbound.calls.map((c) => [c.url, c.json])).toEqual([
      [URL, { messaging_product: "whatsapp", recipient: "BSUID.1", type: "text", text: { body: "hi" } }],
    ]);
  });
});

describe("a reply longer than one message", () => {
  const long = "a".repeat(WHATSAPP_TEXT_LIMIT) + "b".repeat(10);

  it("goes in parts, in order", async () => {
    expect(await sendWhatsApp(reply({ to: "491" }, long), settings)).toMatchObject({ ok: true });
    expect(outbound.calls.map((c) => c.json.text.body.length)).toEqual([WHATSAPP_TEXT_LIMIT, 10]);
  });

  it("a first part refused is retried as the platform said; a later one fails for good, naming the part", async () => {
    answers = [() => new Response("busy", { status: 503 })];
    expect(await sendWhatsApp(reply({ to: "491" }, long), settings)).toMatchObject({ ok: false, retryable: true });
    expect(outbound.calls).toHaveLength(1);
    answers = [() => Response.json({ messages: [{}] }), () => new Response("busy", { status: 503 })];
    const outcome = await sendWhatsApp(reply({ to: "491" }, long), settings);
    // A retry would send the first part twice: the user already has it.
    expect(outcome).toMatchObject({ ok: false, retryable: false, status: 503 });
    expect(outcome.error).toMatch(/^part 2 of 2 not sent: /);
    expect(outbound.calls).toHaveLength(3);
  });
});

describe("the sender once WhatsApp is turned off or misconfigured", () => {
  const config = {} as never;
  const target = { platform: "whatsapp", to: "4915100079946", phone_number_id: "1000" };
  const configured = {
    WHATSAPP_VERIFY_TOKEN: "v",
    WHATSAPP_APP_SECRET: "s",
    WHATSAPP_ACCESS_TOKEN: settings.accessToken,
    WHATSAPP_PHONE_NUMBER_ID: settings.phoneNumberId,
    WHATSAPP_API_BASE: settings.apiBase,
  };
  const { WHATSAPP_APP_SECRET: _, ...misconfigured } = configured;
  const unconfigured = { ok: false, retryable: false, retryAfterMs: null, status: null };

  it("turned off: nothing can be delivered, and a reply or typing indicator fails for good without a call", async () => {
    const off = {} as PlatformEnv;
    const sender = whatsapp.sender;
    expect(sender.canDeliver(target, config, configured)).toBe(true);
    expect(sender.canDeliver(target, config, off)).toBe(false);
    expect(await sender.send(reply(target), config, off)).toEqual({
      ...unconfigured,
      error: "whatsapp is not configured",
    });
    expect(await sender.typing!.send(target, "wamid.in", config, off)).toEqual({
      ...unconfigured,
      error: "whatsapp is not configured",
    });
    expect(outbound.calls).toEqual([]);
  });

  it("misconfigured: the same, and each attempt is logged naming WhatsApp and the missing key", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    try {
      const sender = whatsapp.sender;
      expect(sender.canDeliver(target, config, misconfigured)).toBe(false);
      expect(await sender.send(reply(target), config, misconfigured)).toMatchObject({
        error: "whatsapp is not configured",
      });
      expect(await sender.typing!.send(target, "wamid.in", config, misconfigured)).toMatchObject({
        error: "whatsapp is not configured",
      });
      const lines = loggedLines(errors, "replies not sent: invalid configuration");
      expect(lines.map((line) => line.platform)).toEqual(["whatsapp", "whatsapp", "whatsapp"]);
      for (const line of lines) expect(line.error).toContain("WHATSAPP_APP_SECRET");
      expect(outbound.calls).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });
});
