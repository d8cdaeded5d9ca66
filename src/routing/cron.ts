/**
 * Cron: `POST /v1/cron/runs` runs a scheduled job's text as the first message of
 * its own session (`cron:{job_id}:{run_id}`), handed to the agent like any message.
 * The job's data (its platform, key and message) lives in src/domain/cron.ts.
 */
import { CRON_PLATFORM, cronMessage } from "../domain/cron";
import { policyFor, type RouterContext } from "./context";
import type { Inbound } from "./inbound";
import type { AcceptedBody, RpcResult } from "./results";

export class Cron {
  constructor(
    private readonly ctx: RouterContext,
    private readonly inbound: Inbound,
  ) {}

  /** Stores the job's run as its session's first message, with the run id the scheduler chose. */
  start(jobId: string, runId: string, text: string, now: number): Promise<RpcResult<AcceptedBody>> {
    const message = cronMessage(jobId, runId, text, now);
    return this.inbound.storeAndStage(message, policyFor(this.ctx, CRON_PLATFORM, "dm"), runId);
  }
}
