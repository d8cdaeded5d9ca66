/**
 * The page's retry buttons call the operator JSON API in-process, one function per
 * kind, so the page and `POST /admin/{runs|deliveries|events}/{id}/retry` can
 * never disagree about what a retry does or answers (200, 404, 409).
 */
import type { PageRetryKind } from "./forms";

/** The app's own fetch, given to the page when it is mounted (src/index.ts). */
export type ApiFetch = (request: Request, env: Env) => Response | Promise<Response>;

export interface RetryOutcome {
  status: number;
  message: string;
}

async function post(api: ApiFetch, env: Env, adminToken: string, path: string): Promise<RetryOutcome> {
  const response = await api(
    new Request(new URL(path, "https://sessiongate.internal"), {
      method: "POST",
      headers: { authorization: `Bearer ${adminToken}` },
    }),
    env,
  );
  const body = (await response.json().catch(() => null)) as { error?: { message?: string } } | null;
  return {
    status: response.status,
    message: response.ok ? "retried" : (body?.error?.message ?? `HTTP ${response.status}`),
  };
}

/** `POST /admin/runs/{id}/retry`: hand a failed run to the agent again. */
export const retryRun = (api: ApiFetch, env: Env, token: string, runId: string) =>
  post(api, env, token, `/admin/runs/${encodeURIComponent(runId)}/retry`);

/** `POST /admin/deliveries/{event_id}/retry`: send a failed reply delivery again. */
export const retryDelivery = (api: ApiFetch, env: Env, token: string, eventId: string) =>
  post(api, env, token, `/admin/deliveries/${encodeURIComponent(eventId)}/retry`);

/** `POST /admin/events/{id}/retry`: deliver a dead-lettered lifecycle event again. */
export const retryEvent = (api: ApiFetch, env: Env, token: string, eventId: string) =>
  post(api, env, token, `/admin/events/${encodeURIComponent(eventId)}/retry`);

export const RETRY: Record<PageRetryKind, typeof retryRun> = {
  run: retryRun,
  delivery: retryDelivery,
  event: retryEvent,
};
