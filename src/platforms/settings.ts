/**
 * Reading a platform's secrets: all set turns it on, none set leaves it off, and
 * some set is a configuration error naming every missing key.
 */
import { ConfigError } from "../config";
import { describe } from "../http/outbound";
import { log } from "../log";
import type { PlatformEnv, SendOutcome } from "./types";

function read(env: PlatformEnv, key: string): string | null {
  const value = (env as Record<string, unknown>)[key];
  if (typeof value !== "string") return null;
  const trimmed = value.trim();
  return trimmed === "" ? null : trimmed;
}

/** The platform's required secrets, or null when none is set. */
export function requiredSecrets<K extends string>(env: PlatformEnv, keys: readonly K[]): Record<K, string> | null {
  const values = keys.map((key) => [key, read(env, key)] as const);
  if (values.every(([, value]) => value === null)) return null;
  const missing = values.filter(([, value]) => value === null);
  if (missing.length > 0)
    throw ConfigError.all(
      missing.map(([key]) => new ConfigError(key, "is required when the platform's other secrets are set")),
    );
  return Object.fromEntries(values) as Record<K, string>;
}

/** An API base URL variable, without a trailing slash, or the platform's default. */
export function apiBase(env: PlatformEnv, key: string, fallback: string): string {
  const value = read(env, key) ?? fallback;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new ConfigError(key, "is not a URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new ConfigError(key, "must be an http(s) URL");
  return value.replace(/\/+$/, "");
}

/**
 * A platform's settings for sending: never throws. Off is null; a configuration
 * error is logged (the webhook answers 500 naming the key meanwhile) and is null too.
 */
export function settingsForSending<S>(
  platform: string,
  read: (env: PlatformEnv) => S | null,
  env: PlatformEnv,
): S | null {
  try {
    return read(env);
  } catch (error) {
    log.error("replies not sent: invalid configuration", { platform, error: describe(error) });
    return null;
  }
}

/** A send that will not succeed by trying again. */
export function permanentFailure(error: string, status: number | null = null): SendOutcome {
  return { ok: false, retryable: false, retryAfterMs: null, status, error };
}
