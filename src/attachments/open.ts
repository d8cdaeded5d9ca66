/**
 * Which platform serves an attachment's bytes, by the platform that stored it.
 * Generic clients give a plain http(s) URL, fetched without any credential.
 */
import type { Config } from "../config";
import type { AttachmentRow } from "../db/schema";
import { openDiscordMedia } from "../platforms/discord/media";
import { fetchHeaders, refused, type MediaOpener, type MediaOutcome } from "../platforms/media";
import { openSlackMedia } from "../platforms/slack/media";
import { openTelegramMedia } from "../platforms/telegram/media";
import { openWhatsAppMedia } from "../platforms/whatsapp/media";

const openGenericMedia: MediaOpener = async (row) => {
  const bytes = await fetchHeaders("attachment download", row.ref, {}, []);
  return bytes.ok ? { ok: true, response: bytes.response } : bytes.outcome;
};

const OPENERS: Record<string, MediaOpener> = {
  telegram: openTelegramMedia,
  slack: openSlackMedia,
  discord: openDiscordMedia,
  whatsapp: openWhatsAppMedia,
  generic: openGenericMedia,
};

export function openMedia(row: AttachmentRow, env: object, config: Config): Promise<MediaOutcome> {
  const open = Object.hasOwn(OPENERS, row.platform) ? OPENERS[row.platform] : undefined;
  if (!open) return Promise.resolve(refused(`no way to fetch media of platform ${row.platform}`));
  return open(row, env, config);
}
