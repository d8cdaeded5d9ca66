/**
 * `GET /healthz`: `{"ok": true, "status": "ok"}` when the configuration is valid,
 * every platform is either off or fully configured, and D1 answers. A platform
 * with only some of its secrets set is `degraded` (200, naming each missing key):
 * the gateway serves, but that platform's webhooks answer 500 until it is fixed.
 * An invalid configuration is a 500 naming every key at fault (src/config.ts);
 * D1 unreachable is a 503. No answer ever carries a configured value.
 */
import { ConfigError, configOf, effectiveEnv } from "./config";
import { Database, query } from "./db/client";
import { apiError } from "./http/errors";
import { ADAPTERS } from "./platforms";

export interface HealthProblem {
  platform: string;
  keys: string[];
  message: string;
}

export interface Health {
  ok: boolean;
  status: "ok" | "degraded";
  problems?: HealthProblem[];
}

/** The platforms whose settings are half there, each with the keys at fault. */
export function platformProblems(env: object): HealthProblem[] {
  const config = configOf(env);
  const problems: HealthProblem[] = [];
  for (const adapter of ADAPTERS) {
    try {
      adapter.settings(effectiveEnv(env), config);
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      problems.push({ platform: adapter.name, keys: error.keys, message: error.message });
    }
  }
  return problems;
}

export async function health(env: Env): Promise<Health> {
  const problems = platformProblems(env); // an invalid configuration throws: 500 naming the keys
  try {
    // Through the counting client: the metrics cover every statement the gateway runs.
    await new Database(env.DB, "background").batch(query("SELECT 1"));
  } catch {
    throw apiError(503, "unavailable", "D1 is not reachable");
  }
  return problems.length === 0 ? { ok: true, status: "ok" } : { ok: false, status: "degraded", problems };
}
