/**
 * Configuration from variables and secrets (spec "Configuration"), parsed and
 * validated once per `env` object. Invalid values are a `ConfigError` naming the
 * key, never a silent default; an unset optional value means "off".
 */
import { resetConfigSchema, type ResetConfig } from "./domain/reset-policy";

export class ConfigError extends Error {
  constructor(
    readonly key: string,
    detail: string,
  ) {
    super(`${key}: ${detail}`);
    this.name = "ConfigError";
  }
}

export interface Config {
  reset: ResetConfig;
  groupSessionsPerUser: boolean;
  /** null: the built-in echo agent answers. */
  agentUrl: string | null;
  agentToken: string | null;
  agentTimeoutMs: number;
  hookUrls: string[];
  hookSecret: string | null;
  adminToken: string | null;
  genericWebhookSecret: string | null;
  genericReplyUrl: string | null;
  /**
   * How staged work (hand-offs, replies, events) starts: `inline`, in the background
   * of the request that staged it, the alarm being its safety net; or `alarm`, from
   * the routing object's alarm only.
   */
  outboxDrain: "inline" | "alarm";
  /** `ATTACHMENT_MAX_BYTES`: the largest attachment `GET /v1/attachments/{id}` streams (default 25 MiB). */
  attachmentMaxBytes: number;
}

/** The variables this module reads; all are strings in `env` (wrangler vars or secrets). */
export type ConfigEnv = Partial<Record<string, unknown>>;

const BOOLEAN_WORDS: Record<string, boolean> = {
  true: true,
  false: false,
  "1": true,
  "0": false,
  on: true,
  off: false,
  yes: true,
  no: false,
};

function text(env: ConfigEnv, key: string): string | null {
  const value = env[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== "string") throw new ConfigError(key, "must be a string");
  const trimmed = value.trim();
  return trimmed === "" ? null : trimmed;
}

function url(env: ConfigEnv, key: string): string | null {
  const value = text(env, key);
  if (value === null) return null;
  return checkUrl(key, value);
}

function checkUrl(key: string, value: string): string {
  let parsed: URL;
  try {
    parsed = new URL(value);
  } catch {
    throw new ConfigError(key, `not a URL: ${JSON.stringify(value)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new ConfigError(key, `must be an http(s) URL: ${JSON.stringify(value)}`);
  }
  return value;
}

function bool(env: ConfigEnv, key: string, fallback: boolean): boolean {
  const value = text(env, key);
  if (value === null) return fallback;
  const parsed = BOOLEAN_WORDS[value.toLowerCase()];
  if (parsed === undefined) throw new ConfigError(key, `must be true or false, got ${JSON.stringify(value)}`);
  return parsed;
}

function oneOf<const T extends readonly string[]>(
  env: ConfigEnv,
  key: string,
  values: T,
  fallback: T[number],
): T[number] {
  const value = text(env, key);
  if (value === null) return fallback;
  if (!values.includes(value))
    throw new ConfigError(key, `must be one of ${values.join(", ")}, got ${JSON.stringify(value)}`);
  return value as T[number];
}

function positiveInt(env: ConfigEnv, key: string, fallback: number): number {
  const value = text(env, key);
  if (value === null) return fallback;
  const parsed = Number(value);
  if (!Number.isInteger(parsed) || parsed <= 0)
    throw new ConfigError(key, `must be a positive integer, got ${JSON.stringify(value)}`);
  return parsed;
}

function resetConfig(env: ConfigEnv): ResetConfig {
  const raw = text(env, "SESSION_RESET");
  if (raw === null) return {};
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ConfigError("SESSION_RESET", "is not valid JSON");
  }
  const parsed = resetConfigSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue && issue.path.length > 0 ? `.${issue.path.join(".")}` : "";
    throw new ConfigError(`SESSION_RESET${where}`, issue?.message ?? "is invalid");
  }
  return parsed.data;
}

function parseConfig(env: ConfigEnv): Config {
  const agentUrl = url(env, "AGENT_URL");
  const agentToken = text(env, "AGENT_TOKEN");
  if (agentUrl && !agentToken) throw new ConfigError("AGENT_TOKEN", "is required when AGENT_URL is set");
  const hookUrls = (text(env, "HOOK_URLS") ?? "")
    .split(",")
    .map((part) => part.trim())
    .filter((part) => part !== "")
    .map((part) => checkUrl("HOOK_URLS", part));
  const hookSecret = text(env, "HOOK_SECRET");
  if (hookUrls.length > 0 && !hookSecret) throw new ConfigError("HOOK_SECRET", "is required when HOOK_URLS is set");
  return {
    reset: resetConfig(env),
    groupSessionsPerUser: bool(env, "GROUP_SESSIONS_PER_USER", true),
    agentUrl,
    agentToken,
    agentTimeoutMs: positiveInt(env, "AGENT_TIMEOUT_MS", 30_000),
    hookUrls,
    hookSecret,
    adminToken: text(env, "ADMIN_TOKEN"),
    genericWebhookSecret: text(env, "GENERIC_WEBHOOK_SECRET"),
    genericReplyUrl: url(env, "GENERIC_REPLY_URL"),
    outboxDrain: oneOf(env, "OUTBOX_DRAIN", ["inline", "alarm"] as const, "inline"),
    attachmentMaxBytes: positiveInt(env, "ATTACHMENT_MAX_BYTES", 25 * 1024 * 1024),
  };
}

const cache = new WeakMap<object, Config | ConfigError>();

/**
 * Test seam: variables laid over `env` for every caller in this isolate (the
 * worker and its Durable Objects share it in workerd tests), so a test can try
 * another reset policy or agent URL without another Miniflare instance.
 */
let overrides: { vars: ConfigEnv } | null = null;

export function overrideConfigForTests(vars: ConfigEnv | null): void {
  overrides = vars ? { vars } : null;
}

/**
 * The variables as every reader should see them: `env`, with the test overrides
 * laid over it when a test set some. Platform adapters read their own secrets from this.
 */
export function effectiveEnv<E extends object>(env: E): E {
  return overrides ? ({ ...env, ...overrides.vars } as E) : env;
}

/** The parsed configuration of `env`; throws the same `ConfigError` on every call while it is invalid. */
export function configOf(env: object): Config {
  const source = overrides ? overrides : env;
  let entry = cache.get(source);
  if (!entry) {
    try {
      entry = parseConfig(overrides ? { ...(env as ConfigEnv), ...overrides.vars } : (env as ConfigEnv));
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      entry = error;
    }
    cache.set(source, entry);
  }
  if (entry instanceof ConfigError) throw entry;
  return entry;
}

/** Parses without caching (tests, and tools that check a candidate configuration). */
export function parseConfigFresh(env: ConfigEnv): Config {
  return parseConfig(env);
}
