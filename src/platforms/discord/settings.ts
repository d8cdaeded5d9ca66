/** Discord's configuration: both secrets turn it on; the API base is a variable for tests and fakes. */
import { ConfigError } from "../../config";
import { fromHex } from "../../crypto";
import { apiBase, requiredSecrets } from "../settings";
import type { PlatformEnv } from "../types";

export interface DiscordSettings {
  /** `DISCORD_PUBLIC_KEY`: the application's Ed25519 public key, 32 bytes. */
  publicKey: Uint8Array<ArrayBuffer>;
  publicKeyHex: string;
  applicationId: string;
  /** `DISCORD_API_BASE`, default https://discord.com/api/v10, without a trailing slash. */
  apiBase: string;
}

export const DISCORD_SECRETS = ["DISCORD_PUBLIC_KEY", "DISCORD_APPLICATION_ID"] as const;
export const DISCORD_DEFAULT_API_BASE = "https://discord.com/api/v10";

/**
 * null when neither secret is set (off); a ConfigError naming the key when only one
 * is, or when the public key is not 64 hex characters (a key that could never
 * verify would otherwise refuse every interaction as a bad signature).
 */
export function discordSettings(env: PlatformEnv): DiscordSettings | null {
  const secrets = requiredSecrets(env, DISCORD_SECRETS);
  if (!secrets) return null;
  const publicKey = fromHex(secrets.DISCORD_PUBLIC_KEY);
  if (!publicKey || publicKey.length !== 32) {
    throw new ConfigError("DISCORD_PUBLIC_KEY", "must be 64 hex characters (the application's Ed25519 public key)");
  }
  if (!/^\d{1,20}$/.test(secrets.DISCORD_APPLICATION_ID)) {
    throw new ConfigError("DISCORD_APPLICATION_ID", "must be the application's numeric id (a snowflake)");
  }
  return {
    publicKey,
    publicKeyHex: secrets.DISCORD_PUBLIC_KEY.toLowerCase(),
    applicationId: secrets.DISCORD_APPLICATION_ID,
    apiBase: apiBase(env, "DISCORD_API_BASE", DISCORD_DEFAULT_API_BASE),
  };
}
