/**
 * Slack files: `url_private_download` with the bot token (`files:read`). The token
 * is only ever sent to https://files.slack.com or to the origin of SLACK_API_BASE
 * (a fake in tests), whatever URL an event carried, and redirects are not followed.
 */
import { fetchHeaders, refused, type MediaOpener } from "../media";
import { settingsForSending } from "../settings";
import { slackSettings } from "./settings";

export const SLACK_FILES_ORIGIN = "https://files.slack.com";

/** Whether the bot token may be sent to `url`. */
export function slackTokenMayGo(url: string, apiBase: string): boolean {
  let target: URL;
  try {
    target = new URL(url);
  } catch {
    return false;
  }
  return target.origin === SLACK_FILES_ORIGIN || target.origin === new URL(apiBase).origin;
}

export const openSlackMedia: MediaOpener = async (row, env) => {
  const settings = settingsForSending("slack", slackSettings, env);
  if (!settings) return refused("slack is not configured");
  if (!slackTokenMayGo(row.ref, settings.apiBase)) {
    return refused("the Slack file is not on files.slack.com; the bot token is not sent elsewhere");
  }
  const bytes = await fetchHeaders(
    "slack file download",
    row.ref,
    { headers: { authorization: `Bearer ${settings.botToken}` }, redirect: "manual" },
    [settings.botToken],
  );
  if (!bytes.ok) return bytes.outcome;
  // Without `files:read` Slack answers 200 with its sign-in page instead of the file.
  const type = bytes.response.headers.get("content-type") ?? "";
  if (/^text\/html/i.test(type) && !/^text\/html/i.test(row.mimeType ?? "")) {
    await bytes.response.body?.cancel();
    return refused("slack answered with a sign-in page (does the bot token have the files:read scope?)");
  }
  return { ok: true, response: bytes.response };
};
