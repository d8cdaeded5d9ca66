/**
 * WhatsApp media: `GET {WHATSAPP_API_BASE}/{media-id}` with the access token gives
 * a short-lived `url` (and `file_size`), then `GET url` with the access token gives
 * the bytes. Redirects are not followed with the token.
 */
import * as z from "zod";
import { fetchHeaders, overLimit, refused, type MediaOpener } from "../media";
import { settingsForSending } from "../settings";
import { whatsappSettings } from "./index";

const mediaAnswer = z.looseObject({
  url: z.url({ protocol: /^https?$/ }),
  file_size: z.number().int().nonnegative().optional(),
});

export const openWhatsAppMedia: MediaOpener = async (row, env, config) => {
  const settings = settingsForSending("whatsapp", whatsappSettings, env);
  if (!settings) return refused("whatsapp is not configured");
  const auth = { authorization: `Bearer ${settings.accessToken}` };
  const secrets = [settings.accessToken];
  const meta = await fetchHeaders(
    "whatsapp media lookup",
    `${settings.apiBase}/${encodeURIComponent(row.ref)}`,
    { headers: auth, redirect: "manual" },
    secrets,
  );
  if (!meta.ok) return meta.outcome;
  const answer = mediaAnswer.safeParse(await meta.response.json().catch(() => null));
  if (!answer.success) return refused("whatsapp media lookup gave no url");
  const tooBig = overLimit(answer.data.file_size, config.attachmentMaxBytes);
  if (tooBig) return tooBig;
  const bytes = await fetchHeaders(
    "whatsapp media download",
    answer.data.url,
    { headers: auth, redirect: "manual" },
    secrets,
  );
  return bytes.ok ? { ok: true, response: bytes.response } : bytes.outcome;
};
