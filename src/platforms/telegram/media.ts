/**
 * Telegram media: `getFile` with the bot token gives a `file_path`, then
 * `GET {TELEGRAM_API_BASE}/file/bot{token}/{file_path}` gives the bytes. Both URLs
 * carry the token, so errors are redacted and redirects are not followed.
 */
import * as z from "zod";
import { callJson } from "../../http/outbound";
import { fetchHeaders, overLimit, redact, refused, type MediaOpener } from "../media";
import { settingsForSending } from "../settings";
import { telegramSettings } from "./index";

const getFileAnswer = z.looseObject({
  ok: z.literal(true),
  result: z.looseObject({ file_path: z.string().min(1), file_size: z.number().int().nonnegative().optional() }),
});

export const openTelegramMedia: MediaOpener = async (row, env, config) => {
  const settings = settingsForSending("telegram", telegramSettings, env);
  if (!settings) return refused("telegram is not configured");
  const secrets = [settings.token];
  const meta = await callJson(
    `${settings.apiBase}/bot${settings.token}/getFile`,
    { file_id: row.ref },
    {
      timeoutMs: 10_000,
    },
  );
  if (!meta.ok) return refused(`telegram getFile: ${redact(meta.error ?? "failed", secrets)}`);
  const answer = getFileAnswer.safeParse(meta.json);
  // A file over the Bot API's download limit (20 MB) comes without a file_path.
  if (!answer.success) return refused("telegram getFile gave no file_path");
  const tooBig = overLimit(answer.data.result.file_size, config.attachmentMaxBytes);
  if (tooBig) return tooBig;
  const bytes = await fetchHeaders(
    "telegram file download",
    `${settings.apiBase}/file/bot${settings.token}/${answer.data.result.file_path}`,
    { redirect: "manual" },
    secrets,
  );
  return bytes.ok ? { ok: true, response: bytes.response } : bytes.outcome;
};
