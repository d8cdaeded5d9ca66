/** The answers of the routing object's RPC methods: an HTTP status and the JSON body the worker passes on. */
import type { RunRow, SessionRow } from "../db/schema";
import type { Handoff } from "../domain/explain";
import type { NotOwnedReason } from "../domain/ownership";
import { describe } from "../http/outbound";
import type { Entry } from "./entry";

export interface ErrorBody {
  error: { code: string; message: string };
}

/** What an RPC method answers: an HTTP status and JSON body for the worker to pass on. */
export type RpcResult<B> =
  { status: 200; body: B } | { status: 409; body: NotOwnedBody } | { status: 404 | 500 | 503; body: ErrorBody };

/** The routing entry as the operator API shows it. */
export interface EntryView {
  session_key: string;
  session_id: string;
  platform: string;
  chat_type: string;
  last_active_at: number | null;
  parent_session_id: string | null;
  reset: Entry["reset"];
  first_run_pending: boolean;
  notice_pending: string | null;
}

export interface AcceptedBody {
  accepted: true;
  session_id: string | null;
  duplicate: boolean;
  /** A command's answer, for platforms that give it in the webhook's own response. */
  command_reply?: string;
  /** How the message was routed (logged by ingress; platforms never see it). */
  decision?: RoutingDecisionName;
}

/** The routing decision a message met: the one log line per routed message names it. */
export type RoutingDecisionName = "append" | "reopen" | "fresh" | "promoted" | "duplicate" | "command";

/** 409 `{"owns": false, "reason"}`: the run is not (or no longer) the session's current run. */
export interface NotOwnedBody {
  owns: false;
  reason: NotOwnedReason;
}
export const notOwned = (reason: NotOwnedReason): { status: 409; body: NotOwnedBody } => ({
  status: 409,
  body: { owns: false, reason },
});

export const notFound = (message: string): { status: 404; body: ErrorBody } => ({
  status: 404,
  body: { error: { code: "not_found", message } },
});

/** 409 with the error shape: the item is not in a state the operation applies to. */
export const conflict = (code: string, message: string): { status: 409; body: ErrorBody } => ({
  status: 409,
  body: { error: { code, message } },
});

export const unavailable = (error: unknown): { status: 503; body: ErrorBody } => ({
  status: 503,
  body: { error: { code: "unavailable", message: `storage unavailable, retry later (${describe(error)})` } },
});

/** What `explainState()` reads for `GET /admin/routes/{key}/explain` (see src/domain/explain.ts). */
export interface ExplainState {
  entrySessionId: string | null;
  row: SessionRow | null;
  alarmAt: number | null;
  currentRun: RunRow | null;
  handoff: Handoff | null;
  /** Messages of the row's session waiting for a run (spec "Overlapping messages"). */
  waiting: number;
}
