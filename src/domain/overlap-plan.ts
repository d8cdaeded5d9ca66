/**
 * The overlap planner (spec "Overlapping messages", invariant 11): a pure function
 * of the effective settings, what the routing object holds for its live session
 * (its unfinished runs with the messages they carry, the messages waiting) and one
 * thing that happened, answering what to do now: revoke runs, dispatch new runs
 * carrying which messages, record messages as never dispatched, and when to look
 * again. The routing object applies the plan in its storage and in D1; it never
 * decides any of this itself, so one table of tests covers every path.
 *
 * - queue: at most one unfinished run; what arrives meanwhile waits, and one new
 *   run carries it (oldest first, at most max_batch) once that run is over.
 * - interrupt: what arrives while a run is unfinished revokes it; the new run
 *   carries the revoked run's messages and the new one.
 * - concurrent: runs never wait for each other.
 * - debounce_ms (any mode): a run starts only once debounce_ms passed since the
 *   newest waiting message; the messages of that window join one run.
 * - /new, /reset, /stop and the session's end revoke the unfinished runs and leave
 *   the waiting messages not dispatched, with the reason: nothing waits into the
 *   next session.
 */
import type { OverlapSettings } from "./overlap";

export const NOT_DISPATCHED_REASONS = ["stopped", "new_command", "session_ended"] as const;
export type NotDispatchedReason = (typeof NOT_DISPATCHED_REASONS)[number];

/** A stored user message, by its event id, with the time the gateway received it. */
export interface WaitingMessage {
  eventId: string;
  receivedAt: number;
}

/** A run of the session that is unfinished (dispatched, not finished, revoked, failed or lapsed). */
export interface UnfinishedRun {
  runId: string;
  /** The messages it carries, oldest first. */
  messages: WaitingMessage[];
}

/** What the routing object keeps for its live session (in its own storage, so it survives a restart). */
export interface OverlapState {
  unfinished: UnfinishedRun[];
  /** Stored user messages no run carries yet, oldest first. */
  waiting: WaitingMessage[];
}

export const EMPTY_OVERLAP_STATE: OverlapState = { unfinished: [], waiting: [] };

export type RunOutcome = "finished" | "failed" | "lease_lapsed";

export type OverlapEvent =
  /** A user message was stored in the live session (and acknowledged). */
  | { kind: "stored"; message: WaitingMessage }
  /** A run is over: its reply recorded (or `{"reply": null}`), failed for good, or its lease lapsed. */
  | { kind: "run_over"; runId: string; outcome: RunOutcome }
  /** The routing object's alarm ran (the debounce deadline may have come). */
  | { kind: "alarm" }
  /** A command ended the session. */
  | { kind: "command"; command: "new" | "reset" | "stop" }
  /** The session ended any other way (policy, operator, agent, SQL). */
  | { kind: "ended" };

export type RevokeReason = "superseded" | "stopped" | "session_ended";

export interface OverlapPlan {
  /** Unfinished runs to revoke now, and the reason their heartbeat will give. */
  revoke: { runIds: string[]; reason: RevokeReason } | null;
  /** Revoked runs whose messages wait again, to be carried by the next run (an interrupt). */
  release: string[];
  /** New runs to dispatch now, each the event ids it carries, oldest first (at most max_batch each). */
  dispatch: string[][];
  /** Messages to record as never dispatched, and why. */
  notDispatched: { eventIds: string[]; reason: NotDispatchedReason } | null;
  /** What still waits after the plan, oldest first. */
  waiting: WaitingMessage[];
  /** When the alarm must plan again (the debounce deadline); null when only a run's end can change things. */
  wakeAt: number | null;
}

/** Oldest first; a stable sort keeps the arrival order of messages received at the same instant. */
const oldestFirst = (messages: WaitingMessage[]) => [...messages].sort((a, b) => a.receivedAt - b.receivedAt);

/** When the waiting messages may be dispatched: debounce_ms after the newest of them. */
export function debounceDeadline(settings: OverlapSettings, waiting: readonly WaitingMessage[]): number | null {
  if (waiting.length === 0) return null;
  return Math.max(...waiting.map((m) => m.receivedAt)) + settings.debounce_ms;
}

/**
 * Dispatches what may go now, given which runs are still unfinished after this
 * event: queue and interrupt never start a run beside an unfinished one;
 * concurrent starts as many runs as the waiting messages fill.
 */
function dispatchWaiting(
  settings: OverlapSettings,
  unfinished: readonly UnfinishedRun[],
  waiting: WaitingMessage[],
  now: number,
): Pick<OverlapPlan, "dispatch" | "waiting" | "wakeAt"> {
  const due = debounceDeadline(settings, waiting);
  if (due === null) return { dispatch: [], waiting, wakeAt: null };
  const blocked = settings.mode !== "concurrent" && unfinished.length > 0;
  // Blocked by a run: its end plans again, so there is nothing to wake for.
  if (blocked) return { dispatch: [], waiting, wakeAt: null };
  if (now < due) return { dispatch: [], waiting, wakeAt: due };
  const ids = waiting.map((m) => m.eventId);
  if (settings.mode === "concurrent") {
    const dispatch: string[][] = [];
    for (let i = 0; i < ids.length; i += settings.max_batch) dispatch.push(ids.slice(i, i + settings.max_batch));
    return { dispatch, waiting: [], wakeAt: null };
  }
  // One run, the oldest max_batch; the rest wait for that run to be over.
  return { dispatch: [ids.slice(0, settings.max_batch)], waiting: waiting.slice(settings.max_batch), wakeAt: null };
}

const NOTHING: Pick<OverlapPlan, "revoke" | "release" | "notDispatched"> = {
  revoke: null,
  release: [],
  notDispatched: null,
};

/** What to do when `event` happens at `now` to a session in `state` under `settings`. */
export function planOverlap(
  settings: OverlapSettings,
  state: OverlapState,
  event: OverlapEvent,
  now: number,
): OverlapPlan {
  switch (event.kind) {
    case "stored": {
      if (settings.mode === "interrupt" && state.unfinished.length > 0) {
        // The answer in progress is to a stale question: revoke it, and carry its
        // messages again with the new one.
        const revoked = state.unfinished;
        const waiting = oldestFirst([...revoked.flatMap((r) => r.messages), ...state.waiting, event.message]);
        return {
          ...NOTHING,
          revoke: { runIds: revoked.map((r) => r.runId), reason: "superseded" },
          release: revoked.map((r) => r.runId),
          ...dispatchWaiting(settings, [], waiting, now),
        };
      }
      return { ...NOTHING, ...dispatchWaiting(settings, state.unfinished, [...state.waiting, event.message], now) };
    }
    case "run_over": {
      const unfinished = state.unfinished.filter((r) => r.runId !== event.runId);
      return { ...NOTHING, ...dispatchWaiting(settings, unfinished, state.waiting, now) };
    }
    case "alarm":
      return { ...NOTHING, ...dispatchWaiting(settings, state.unfinished, state.waiting, now) };
    case "command":
    case "ended": {
      const reason: NotDispatchedReason =
        event.kind === "ended" ? "session_ended" : event.command === "stop" ? "stopped" : "new_command";
      const revokeReason: RevokeReason =
        event.kind === "ended" ? "session_ended" : event.command === "stop" ? "stopped" : "superseded";
      return {
        revoke:
          state.unfinished.length > 0 ? { runIds: state.unfinished.map((r) => r.runId), reason: revokeReason } : null,
        release: [],
        dispatch: [],
        notDispatched: state.waiting.length > 0 ? { eventIds: state.waiting.map((m) => m.eventId), reason } : null,
        waiting: [],
        wakeAt: null,
      };
    }
  }
}

/**
 * The state after the routing object carried out `plan`: runs revoked or over
 * dropped, the new runs added under the ids it gave them (`newRunIds[i]` for
 * `plan.dispatch[i]`), the waiting list as planned.
 */
export function applyPlan(
  state: OverlapState,
  event: OverlapEvent,
  plan: OverlapPlan,
  newRunIds: readonly string[],
): OverlapState {
  const gone = new Set(plan.revoke?.runIds ?? []);
  if (event.kind === "run_over") gone.add(event.runId);
  const known = new Map(
    [
      ...state.waiting,
      ...state.unfinished.flatMap((r) => r.messages),
      ...(event.kind === "stored" ? [event.message] : []),
    ].map((m) => [m.eventId, m] as const),
  );
  const started = plan.dispatch.map((ids, i) => {
    const runId = newRunIds[i];
    if (runId === undefined) throw new Error("applyPlan needs a run id for every dispatched run");
    return { runId, messages: ids.map((id) => known.get(id)!) };
  });
  return { unfinished: [...state.unfinished.filter((r) => !gone.has(r.runId)), ...started], waiting: plan.waiting };
}
