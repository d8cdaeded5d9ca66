/**
 * Discord attachments: the CDN URL in the interaction's `resolved.attachments`,
 * fetched without any credential (the URL is signed by Discord and expires).
 */
import { fetchHeaders, type MediaOpener } from "../media";

export const openDiscordMedia: MediaOpener = async (row) => {
  const bytes = await fetchHeaders("discord attachment download", row.ref, {}, []);
  return bytes.ok ? { ok: true, response: bytes.response } : bytes.outcome;
};
