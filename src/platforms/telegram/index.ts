/**
 * The Telegram adapter (`POST /webhooks/telegram`): the webhook's secret token in
 * `X-Telegram-Bot-Api-Secret-Token`, updates typed by `@grammyjs/types`, replies
 * through the Bot API's `sendMessage`. See docs/platforms/telegram.md.
 */
import { safeEqual } from "../../crypto";
import { apiError } from "../../http/errors";
import { parseJsonBytes } from "../parse";
import { apiBase, permanentFailure, requiredSecrets, settingsForSending } from "../settings";
import type { PlatformAdapter, PlatformEnv } from "../types";
import { sendTelegram } from "./send";
import { sendTelegramTyping } from "./typing";
import { checkUpdate, inboundOf } from "./update";

export interface TelegramSettings {
  token: string;
  secret: string;
  apiBase: string;
}

const SECRETS = ["TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET"] as const;

/** Telegram's settings: null when off, a ConfigError naming the missing key when partly set. */
export function telegramSettings(env: PlatformEnv): TelegramSettings | null {
  const secrets = requiredSecrets(env, SECRETS);
  if (!secrets) return null;
  return {
    token: secrets.TELEGRAM_BOT_TOKEN,
    secret: secrets.TELEGRAM_WEBHOOK_SECRET,
    apiBase: apiBase(env, "TELEGRAM_API_BASE", "https://api.telegram.org"),
  };
}

const sendSettings = (env: PlatformEnv) => settingsForSending("telegram", telegramSettings, env);

// Telegram answers a webhook's non-2xx by retrying the same update; 200 with any body acknowledges it.
const ACK = { status: 200, body: {} };

export const telegram: PlatformAdapter<TelegramSettings> = {
  name: "telegram",
  methods: ["POST"],

  settings: (env) => telegramSettings(env),

  async handle(input, settings) {
    // Telegram sends the secret as is; a missing header is refused like a wrong one.
    const header = input.headers.get("x-telegram-bot-api-secret-token");
    if (header === null || !safeEqual(header, settings.secret)) {
      throw apiError(401, "bad_signature", "missing or invalid X-Telegram-Bot-Api-Secret-Token");
    }
    const update = checkUpdate(parseJsonBytes(input.rawBody));
    const message = inboundOf(update);
    if (!message) return { kind: "answer", answer: ACK };
    return { kind: "route", messages: [message], answer: () => ACK };
  },

  sender: {
    canDeliver: (target, _config, env) => target.platform === "telegram" && sendSettings(env) !== null,

    async send(message, _config, env) {
      const settings = sendSettings(env);
      if (!settings) return permanentFailure("telegram is not configured");
      return sendTelegram(message, settings);
    },

    typing: {
      cadence: "repeat",
      async send(target, _eventId, _config, env) {
        const settings = sendSettings(env);
        if (!settings) return permanentFailure("telegram is not configured");
        return sendTelegramTyping(target, settings);
      },
    },
  },
};
