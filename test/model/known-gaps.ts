/**
 * Differences between the gateway and the spec that the model found and that are
 * reported, not yet fixed. While a flag is on, the model accepts today's behaviour
 * for that one case (and only it), so the rest of the lifecycle keeps being
 * checked; `npm run soak -- --strict` (MODEL_STRICT=1) turns them all off and then
 * fails on them. Remove a flag with the fix it waits for.
 */
import { env } from "cloudflare:workers";

const strict = !!(env as unknown as Record<string, string | undefined>).MODEL_STRICT;

export const KNOWN_GAPS = {
  /**
   * A message acknowledged before a rotation whose hand-off was still in the
   * outbox is handed over naming the ended parent (`compression`), does not hold
   * the continuation open (invariant 6), and its reply is recorded in no session
   * and never delivered, although its run was not revoked. Spec: the rotation moves
   * the turn, still current, to the continuation.
   */
  stagedHandOffLeftBehindByRotation: !strict,
  /**
   * After a rotation by a run the agent accepted with 202, the routing object no
   * longer watches that run's lease: the continuation's alarm is set for its policy
   * deadline only (none at all for mode `none`), so an owner that vanished is not
   * reaped (`orphan_reap`) when the lease lapses (docs/agent.md: the alarm enforces
   * the lease).
   */
  leaseUnwatchedAfterRotation: !strict,
};
