/**
 * Configuration from variables and secrets (spec "Configuration"), parsed and
 * validated once per `env` object. Invalid values are a `ConfigError` naming every
 * key at fault (not only the first), never a silent default; an unset optional
 * value means "off". No message ever quotes a value: they reach unauthenticated
 * callers (a webhook answers 500 naming the key) and a value may be a secret.
 */
import type * as z from "zod";
import { overlapConfigSchema, type OverlapConfig } from "./domain/overlap";
import { resetConfigSchema, type ResetConfig } from "./domain/reset-policy";
import { registerSecrets } from "./log";

export class ConfigError extends Error {
  /** Every key at fault, `key` first. */
  readonly keys: string[];

  constructor(
    readonly key: string,
    /** What is wrong with `key`, without its value. */
    readonly detail: string,
    more: ConfigError[] = [],
  ) {
    super([`${key}: ${detail}`, ...more.map((e) => e.message)].join("; "));
    this.name = "ConfigError";
    this.keys = [key, ...more.flatMap((e) => e.keys)];
  }

  /** One error naming every key of `errors` (at least one). */
  static all(errors: ConfigError[]): ConfigError {
    const [first, ...rest] = errors;
    if (!first) throw new Error("ConfigError.all needs an error");
    if (rest.length === 0) return first;
    return new ConfigError(first.key, first.detail, rest);
  }
}

export interface Config {
  reset: ResetConfig;
  /** `OVERLAP`: what happens to a message that arrives while a run is unfinished (docs/overlap.md). */
  overlap: OverlapConfig;
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
    throw new ConfigError(key, "is not a URL");
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new ConfigError(key, "must be an http(s) URL");
  }
  return value;
}

function bool(env: ConfigEnv, key: string, fallback: boolean): boolean {
  const value = text(env, key);
  if (value === null) return fallback;
  const parsed = BOOLEAN_WORDS[value.toLowerCase()];
  if (parsed === undefined) throw new ConfigError(key, "must be true or false");
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
  if (!values.includes(value)) throw new ConfigError(key, `must be one of ${values.join(", ")}`);
  return value as T[number];
}

function positiveInt(env: ConfigEnv, key: string, fallback: number): number {
  const value = text(env, key);
  if (value === null) return fallback;
  const parsed = Number(value);
  if (!Number.isInteger(parsed) || parsed <= 0) throw new ConfigError(key, "must be a positive integer");
  return parsed;
}

/**
 * A JSON variable checked against `schema`: unset is `{}`; every issue is named at
 * its own path (`KEY.by_platform.slack.mode`), an unknown key anywhere being one of them.
 */
function jsonVariable<S extends z.ZodType<object>>(env: ConfigEnv, key: string, schema: S): z.infer<S> {
  const raw = text(env, key);
  if (raw === null) return {} as z.infer<S>;
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ConfigError(key, "is not valid JSON");
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    throw ConfigError.all(
      parsed.error.issues.map((issue) => {
        const where = issue.path.length > 0 ? `.${issue.path.join(".")}` : "";
        return new ConfigError(`${key}${where}`, issue.message);
      }),
    );
  }
  return parsed.data;
}

function resetConfig(env: ConfigEnv): ResetConfig {
  return jsonVariable(env, "SESSION_RESET", resetConfigSchema);
}

/**
 * A signing secret (Standard Webhooks key): any text, but one written `whsec_…`
 * must be base64 after the prefix, as receivers' libraries decode it.
 */
function signingSecret(env: ConfigEnv, key: string): string | null {
  const value = text(env, key);
  if (value === null || !value.startsWith("whsec_")) return value;
  const encoded = value.slice("whsec_".length);
  let decoded = "";
  try {
    decoded = atob(encoded);
  } catch {
    throw new ConfigError(key, "starts with whsec_ but the rest is not base64");
  }
  if (decoded.length === 0) throw new ConfigError(key, "starts with whsec_ but holds no key");
  return value;
}

function parseConfig(env: ConfigEnv): Config {
  const problems: ConfigError[] = [];
  /** Reads one value; a ConfigError is kept (so every key at fault is named) and `fallback` stands in. */
  const read = <T>(parse: () => T, fallback: T): T => {
    try {
      return parse();
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      problems.push(error);
      return fallback;
    }
  };
  const agentUrl = read(() => url(env, "AGENT_URL"), null);
  const agentToken = read(() => text(env, "AGENT_TOKEN"), null);
  if (agentUrl && !agentToken) problems.push(new ConfigError("AGENT_TOKEN", "is required when AGENT_URL is set"));
  const hookUrls = read(
    () =>
      (text(env, "HOOK_URLS") ?? "")
        .split(",")
        .map((part) => part.trim())
        .filter((part) => part !== "")
        .map((part, index) => {
          try {
            return checkUrl("HOOK_URLS", part);
          } catch (error) {
            // Say which entry, never what it holds.
            throw new ConfigError("HOOK_URLS", `entry ${index + 1} ${(error as ConfigError).detail}`);
          }
        }),
    [],
  );
  const hookSecret = read(() => signingSecret(env, "HOOK_SECRET"), null);
  if (hookUrls.length > 0 && !hookSecret && problems.every((p) => p.key !== "HOOK_SECRET"))
    problems.push(new ConfigError("HOOK_SECRET", "is required when HOOK_URLS is set"));
  const config: Config = {
    reset: read(() => resetConfig(env), {}),
    overlap: read(() => jsonVariable(env, "OVERLAP", overlapConfigSchema), {}),
    groupSessionsPerUser: read(() => bool(env, "GROUP_SESSIONS_PER_USER", true), true),
    agentUrl,
    agentToken,
    agentTimeoutMs: read(() => positiveInt(env, "AGENT_TIMEOUT_MS", 30_000), 30_000),
    hookUrls,
    hookSecret,
    adminToken: read(() => text(env, "ADMIN_TOKEN"), null),
    genericWebhookSecret: read(() => signingSecret(env, "GENERIC_WEBHOOK_SECRET"), null),
    genericReplyUrl: read(() => url(env, "GENERIC_REPLY_URL"), null),
    outboxDrain: read(() => oneOf(env, "OUTBOX_DRAIN", ["inline", "alarm"] as const, "inline"), "inline"),
    attachmentMaxBytes: read(() => positiveInt(env, "ATTACHMENT_MAX_BYTES", 25 * 1024 * 1024), 25 * 1024 * 1024),
  };
  if (problems.length > 0) throw ConfigError.all(problems);
  return config;
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
      const vars = overrides ? { ...(env as ConfigEnv), ...overrides.vars } : (env as ConfigEnv);
      registerSecrets(vars); // no log line may ever carry one of them
      entry = parseConfig(vars);
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
