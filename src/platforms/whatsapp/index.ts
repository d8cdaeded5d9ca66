/**
 * The WhatsApp Cloud API adapter (`GET|POST /webhooks/whatsapp`): the subscription
 * challenge on GET, `X-Hub-Signature-256` on POST, text messages as direct
 * messages, replies through the Graph API. See docs/platforms/whatsapp.md.
 */
import { safeEqual, verifyHmacSha256Hex } from "../../crypto";
import { apiError } from "../../http/errors";
import { parseJsonBytes } from "../parse";
import { apiBase, permanentFailure, requiredSecrets, settingsForSending } from "../settings";
import type { PlatformAdapter, PlatformEnv, WebhookInput } from "../types";
import { inboundMessages } from "./payload";
import { sendWhatsApp } from "./send";
import { sendWhatsAppTyping } from "./typing";

export interface WhatsAppSettings {
  verifyToken: string;
  appSecret: string;
  accessToken: string;
  phoneNumberId: string;
  apiBase: string;
}

const SECRETS = [
  "WHATSAPP_VERIFY_TOKEN",
  "WHATSAPP_APP_SECRET",
  "WHATSAPP_ACCESS_TOKEN",
  "WHATSAPP_PHONE_NUMBER_ID",
] as const;

/** WhatsApp's settings: null when off, a ConfigError naming the missing key when partly set. */
export function whatsappSettings(env: PlatformEnv): WhatsAppSettings | null {
  const secrets = requiredSecrets(env, SECRETS);
  if (!secrets) return null;
  return {
    verifyToken: secrets.WHATSAPP_VERIFY_TOKEN,
    appSecret: secrets.WHATSAPP_APP_SECRET,
    accessToken: secrets.WHATSAPP_ACCESS_TOKEN,
    phoneNumberId: secrets.WHATSAPP_PHONE_NUMBER_ID,
    apiBase: apiBase(env, "WHATSAPP_API_BASE", "https://graph.facebook.com/v21.0"),
  };
}

const sendSettings = (env: PlatformEnv) => settingsForSending("whatsapp", whatsappSettings, env);

const SIGNATURE = /^sha256=([0-9a-fA-F]{64})$/;

/** Checks `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body with the app secret>`. */
async function verifySignature(input: WebhookInput, appSecret: string): Promise<boolean> {
  const header = input.headers.get("x-hub-signature-256");
  const match = header ? SIGNATURE.exec(header.trim()) : null;
  if (!match) return false;
  return verifyHmacSha256Hex(appSecret, input.rawBody, match[1]!);
}

/** The subscription handshake: `hub.mode=subscribe` with the verify token answers `hub.challenge`. */
function challenge(url: URL, verifyToken: string) {
  const params = url.searchParams;
  const token = params.get("hub.verify_token");
  const answer = params.get("hub.challenge");
  if (params.get("hub.mode") !== "subscribe" || token === null || answer === null || !safeEqual(token, verifyToken)) {
    throw apiError(403, "forbidden", "not a valid webhook verification request");
  }
  return { status: 200, body: answer, text: true };
}

// Meta retries a delivery that is not answered 200; the body is not read.
const ACK = { status: 200, body: {} };

export const whatsapp: PlatformAdapter<WhatsAppSettings> = {
  name: "whatsapp",
  methods: ["GET", "POST"],

  settings: (env) => whatsappSettings(env),

  async handle(input, settings) {
    if (input.method === "GET") return { kind: "answer", answer: challenge(input.url, settings.verifyToken) };
    if (!(await verifySignature(input, settings.appSecret))) {
      throw apiError(401, "bad_signature", "missing or invalid X-Hub-Signature-256");
    }
    const messages = inboundMessages(parseJsonBytes(input.rawBody));
    if (messages.length === 0) return { kind: "answer", answer: ACK };
    return { kind: "route", messages, answer: () => ACK };
  },

  sender: {
    canDeliver: (target, _config, env) => target.platform === "whatsapp" && sendSettings(env) !== null,

    async send(message, _config, env) {
      const settings = sendSettings(env);
      if (!settings) return permanentFailure("whatsapp is not configured");
      return sendWhatsApp(message, settings);
    },

    typing: {
      cadence: "once",
      async send(target, eventId, _config, env) {
        const settings = sendSettings(env);
        if (!settings) return permanentFailure("whatsapp is not configured");
        return sendWhatsAppTyping(target, eventId, settings);
      },
    },
  },
};
