/**
 * The routing decision as a pure function of the session row the routing object
 * looked at (its entry's row, or the newest row for the key), the policy and the
 * time. The Durable Object carries the decision out with conditional statements,
 * so a row that changes in between makes the statement miss and the object decides
 * again.
 */
import { isRecoverable, type EndReason, type PolicyReason } from "./end-reasons";
import { expiryReason, type ResetPolicy } from "./reset-policy";

/** The fields of a session row the decision needs. */
export interface RowState {
  id: string;
  lastActiveAt: number;
  endReason: string | null;
  messageCount: number;
}

/** The session a fresh one replaces: the `session.reset` event and the notice come from it. */
export interface Replaced {
  sessionId: string;
  reason: EndReason;
  hadActivity: boolean;
}

export type Decision =
  /** Live and within its policy: store the message in it. */
  | { kind: "append"; sessionId: string }
  /** Ended recoverably and within its policy: reopen the same id, then store. */
  | { kind: "reopen"; sessionId: string }
  /** Start a fresh session, first ending `expire` by its policy reason when set. */
  | { kind: "fresh"; expire: { sessionId: string; reason: PolicyReason } | null; replaced: Replaced | null };

export function decide(row: RowState | null, policy: ResetPolicy, now: number): Decision {
  if (!row) return { kind: "fresh", expire: null, replaced: null };
  const hadActivity = row.messageCount > 0;
  const reason = row.endReason as EndReason | null;
  if (reason === null || isRecoverable(reason)) {
    const expired = expiryReason(policy, row.lastActiveAt, now);
    if (expired) {
      return {
        kind: "fresh",
        expire: { sessionId: row.id, reason: expired },
        replaced: { sessionId: row.id, reason: expired, hadActivity },
      };
    }
    return reason === null ? { kind: "append", sessionId: row.id } : { kind: "reopen", sessionId: row.id };
  }
  // A durable boundary: never reused, never resurrected.
  return { kind: "fresh", expire: null, replaced: { sessionId: row.id, reason, hadActivity } };
}
