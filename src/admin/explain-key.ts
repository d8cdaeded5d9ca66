/** Explain for one key, as `GET /admin/routes/{key}/explain` answers it and the admin page shows it. */
import { now } from "../clock";
import { configOf } from "../config";
import { effectivePolicy, explain, keyConversation } from "../domain/explain";
import { resolveOverlap } from "../domain/overlap";
import { routerFor } from "../routing/client";
import { RUN_LEASE_MS } from "../routing/router";
import { sessionJson } from "../routes/json";

/** Reads what a message for `key` would read (changing nothing) and explains it. */
export async function explainKey(env: Env, key: string) {
  const state = await routerFor(env, key).explainState(key);
  const { platform, chatType } = state.row ?? keyConversation(key);
  const config = configOf(env);
  const { policy, source } = effectivePolicy(config.reset, platform, chatType);
  const explanation = explain({
    ...state,
    key,
    policy,
    policySource: source,
    overlap: resolveOverlap(config.overlap, platform, chatType),
    runLeaseMs: RUN_LEASE_MS,
    now: now(),
  });
  return { ...explanation, session: state.row ? sessionJson(state.row) : null };
}
