/** Slack's configuration: both secrets turn it on; the Web API base is a variable for tests and fakes. */
import { apiBase, requiredSecrets } from "../settings";
import type { PlatformEnv } from "../types";

export interface SlackSettings {
  signingSecret: string;
  botToken: string;
  /** `SLACK_API_BASE`, default https://slack.com/api, without a trailing slash. */
  apiBase: string;
}

export const SLACK_SECRETS = ["SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN"] as const;
export const SLACK_DEFAULT_API_BASE = "https://slack.com/api";

/** null when neither secret is set (off); a ConfigError naming the missing one when only one is. */
export function slackSettings(env: PlatformEnv): SlackSettings | null {
  const secrets = requiredSecrets(env, SLACK_SECRETS);
  if (!secrets) return null;
  return {
    signingSecret: secrets.SLACK_SIGNING_SECRET,
    botToken: secrets.SLACK_BOT_TOKEN,
    apiBase: apiBase(env, "SLACK_API_BASE", SLACK_DEFAULT_API_BASE),
  };
}
