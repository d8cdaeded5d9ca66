// After the load: what D1 holds (through the operator API), set against what was
// acknowledged and what the agent, the hook receiver and the reply receiver saw.
import { eventIdsIn } from "./receivers.mjs";

// End reasons whose end yields a `session.finalized` event (the others are a
// rotation or recoverable, and finalize only once promoted to a policy reason).
const FINALIZING = new Set(["idle", "daily", "suspended", "new_command", "cron_complete", "admin"]);

export class AdminApi {
  constructor(origin, token) {
    this.origin = origin;
    this.token = token;
  }

  async call(method, path, body) {
    const response = await fetch(`${this.origin}${path}`, {
      method,
      headers: { authorization: `Bearer ${this.token}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
      signal: AbortSignal.timeout(30_000),
    });
    const text = await response.text();
    if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 300)}`);
    return JSON.parse(text);
  }

  /** Every session of every key, each with its messages and events, as D1 holds them now. */
  async snapshot(keys) {
    const sessions = [];
    for (const key of keys) {
      const { sessions: rows } = await this.call(
        "GET",
        `/admin/sessions?key=${encodeURIComponent(key.key)}&limit=1000`,
      );
      for (const row of rows) {
        const detail = await this.call("GET", `/admin/sessions/${encodeURIComponent(row.id)}`);
        sessions.push({
          key,
          row: detail.session,
          messages: detail.messages,
          events: detail.events,
          runs: detail.runs ?? [],
        });
      }
    }
    return sessions;
  }
}

const increment = (map, id) => map.set(id, (map.get(id) ?? 0) + 1);

/**
 * The figures and the problems. `messages` are the load's (with their acks),
 * `sessions` the admin snapshot, `agent`/`hooks`/`replies` the receivers.
 */
export function verify({ runTag, messages, sessions, agent, hooks, replies, expectBatches = false }) {
  const stored = new Map(); // event id -> user messages holding it, across every session
  const storedIn = new Map(); // event id -> session ids holding it
  const replied = new Map(); // event id -> stored assistant messages answering it
  for (const session of sessions) {
    for (const message of session.messages) {
      const ids = eventIdsIn(message.text, runTag);
      if (message.role === "user") {
        for (const id of ids) {
          increment(stored, id);
          storedIn.set(id, [...(storedIn.get(id) ?? []), session.row.id]);
        }
      } else if (message.role === "assistant") {
        for (const id of ids) increment(replied, id);
      }
    }
  }

  const acked = messages.filter((m) => m.ack);
  const list = (ids) => ({ count: ids.length, ids: ids.slice(0, 12) });
  const lost = acked.filter((m) => !stored.has(m.eventId)).map((m) => m.eventId);
  const duplicated = [...stored].filter(([, n]) => n > 1).map(([id]) => id);
  // A first ack (duplicate: false) names the session the message went into.
  const misfiled = acked
    .filter((m) => !m.ack.duplicate && stored.get(m.eventId) === 1 && storedIn.get(m.eventId)[0] !== m.ack.session_id)
    .map((m) => m.eventId);
  const storedUnacked = messages.filter((m) => !m.ack && stored.has(m.eventId)).map((m) => m.eventId);
  const notHandedOver = acked.filter((m) => !agent.seen.has(m.eventId)).map((m) => m.eventId);
  const handedOverAgain = acked.filter((m) => (agent.seen.get(m.eventId) ?? 0) > 1).length;
  const unanswered = acked.filter((m) => !replied.has(m.eventId)).map((m) => m.eventId);
  const answeredTwice = acked.filter((m) => (replied.get(m.eventId) ?? 0) > 1).map((m) => m.eventId);
  const notDelivered = acked.filter((m) => !replies.answered.has(m.eventId)).map((m) => m.eventId);
  const deliveredTwice = acked.filter((m) => (replies.answered.get(m.eventId) ?? 0) > 1).map((m) => m.eventId);

  const batches = checkBatches({ runTag, sessions, agent });

  const byReason = {};
  const live = [];
  const finalizedMissing = [];
  const finalizedTwice = [];
  const finalizedWrongly = [];
  const transcriptMismatch = [];
  const finalizedAtHook = hooks.finalizedBySession();
  let finalizing = 0;
  let finalizedOnce = 0;
  for (const { row, messages: stored, events } of sessions) {
    const reason = row.end_reason ?? "live";
    byReason[reason] = (byReason[reason] ?? 0) + 1;
    if (row.end_reason === null) {
      live.push(`${row.id} (${row.session_key}, started ${row.started_at}, last active ${row.last_active_at})`);
    }
    const atHook = finalizedAtHook.get(row.id) ?? [];
    const inD1 = events.filter((e) => e.type === "session.finalized").map((e) => e.id);
    if (!FINALIZING.has(row.end_reason)) {
      if (atHook.length > 0 || inD1.length > 0) finalizedWrongly.push(row.id);
      continue;
    }
    finalizing += 1;
    const ids = new Set([...atHook, ...inD1]);
    if (ids.size > 1) finalizedTwice.push(`${row.id} (${[...ids].join(", ")})`);
    else if (atHook.length === 0) finalizedMissing.push(`${row.id} (${row.session_key}, ${row.end_reason})`);
    else {
      finalizedOnce += 1;
      // The transcript carries the session's messages, as D1 holds them.
      const transcript = hooks.events.get(atHook[0]).transcript ?? [];
      const want = stored.map((m) => `${m.role}:${m.text}`).join("\n");
      const got = transcript.map((m) => `${m.role}:${m.text}`).join("\n");
      if (want !== got) transcriptMismatch.push(row.id);
    }
  }
  const redelivered = [...hooks.events.values()].filter((e) => e.deliveries > 1).length;

  const figures = {
    messages: messages.length,
    sends: messages.reduce((n, m) => n + m.attempts, 0),
    acknowledged: acked.length,
    acknowledged_as_duplicate: acked.filter((m) => m.ack.duplicate).length,
    never_acknowledged: list(messages.filter((m) => !m.ack).map((m) => m.eventId)),
    stored_once: acked.filter((m) => stored.get(m.eventId) === 1).length,
    stored_without_ack: list(storedUnacked),
    duplicates: list(duplicated),
    lost: list(lost),
    misfiled: list(misfiled),
    handed_over: acked.length - notHandedOver.length,
    not_handed_over: list(notHandedOver),
    handed_over_again: handedOverAgain,
    replies_stored_once: acked.filter((m) => replied.get(m.eventId) === 1).length,
    unanswered: list(unanswered),
    answered_twice: list(answeredTwice),
    answered: acked.length - notDelivered.length,
    reply_not_delivered: list(notDelivered),
    reply_delivered_twice: list(deliveredTwice),
    sessions: sessions.length,
    sessions_by_end_reason: byReason,
    live_sessions_left: list(live),
    finalizing_sessions: finalizing,
    finalized_once: finalizedOnce,
    finalized_missing: list(finalizedMissing),
    finalized_twice: list(finalizedTwice),
    finalized_without_finalizing_end: list(finalizedWrongly),
    transcript_mismatch: list(transcriptMismatch),
    runs_carrying: batches.runsCarrying,
    runs_batched: batches.runsBatched,
    largest_batch: batches.largestBatch,
    not_dispatched: batches.notDispatched,
    still_waiting: list(batches.stillWaiting),
    in_two_runs: list(batches.inTwoRuns),
    run_mismatch: list(batches.runMismatch),
    run_unknown: list(batches.runUnknown),
    run_not_answered_once: list(batches.notAnsweredOnce),
    reply_batch_mismatch: list(batches.replyMismatch),
    events_received: hooks.events.size,
    events_redelivered_same_id: redelivered,
    hook_bad_signatures: hooks.badSignatures,
    agent_bad_tokens: agent.badAuth,
  };

  // For every failing message: where it was stored, how its session ended, what the agent did.
  const rowById = new Map(sessions.map((session) => [session.row.id, session.row]));
  const failing = [
    ...new Set([
      ...lost,
      ...notHandedOver,
      ...unanswered,
      ...notDelivered,
      ...duplicated,
      ...batches.stillWaiting,
      ...batches.inTwoRuns,
      ...batches.runMismatch,
    ]),
  ];
  const details = failing.slice(0, 20).map((id) => {
    const message = messages.find((m) => m.eventId === id);
    return {
      event_id: id,
      key: message?.key.key,
      ack: message?.ack,
      attempts: message?.attempts,
      stored_in: (storedIn.get(id) ?? []).map((sid) => {
        const row = rowById.get(sid);
        return `${sid} (ended ${row?.end_reason ?? "never"} at ${row?.ended_at ?? "-"}, last active ${row?.last_active_at})`;
      }),
      agent: agent.story.get(id) ?? ["never received"],
      runs: batches.runsOf.get(id) ?? [],
      reply_stored: replied.get(id) ?? 0,
      reply_received: replies.answered.get(id) ?? 0,
    };
  });

  const problems = [];
  const check = (name, value, what) => {
    if (value > 0) problems.push(`${what}: ${value}`);
  };
  check("never_acknowledged", figures.never_acknowledged.count, "messages never acknowledged");
  check("lost", lost.length, "acknowledged messages LOST (not stored in D1)");
  check("duplicates", duplicated.length, "messages stored more than once");
  check("misfiled", misfiled.length, "messages stored in another session than their ack named");
  check("not_handed_over", notHandedOver.length, "acknowledged messages never handed to the agent");
  check("unanswered", unanswered.length, "acknowledged messages without a stored reply");
  check("answered_twice", answeredTwice.length, "messages with two stored replies");
  check("reply_not_delivered", notDelivered.length, "replies that never reached the reply receiver");
  check("reply_delivered_twice", deliveredTwice.length, "messages answered by two different reply deliveries");
  check("live", live.length, "sessions still live at the end");
  check("finalized_missing", finalizedMissing.length, "finalizing sessions without a session.finalized event");
  check("finalized_twice", finalizedTwice.length, "sessions finalized twice (two different event ids)");
  check("finalized_wrongly", finalizedWrongly.length, "session.finalized for a session whose end does not finalize");
  check("transcript", transcriptMismatch.length, "finalized transcripts that differ from D1");
  // Invariant 11: every stored user message carried by exactly one run, or not dispatched with a reason.
  check("waiting", batches.stillWaiting.length, "user messages neither carried by a run nor marked not dispatched");
  check("two_runs", batches.inTwoRuns.length, "messages carried by two different runs");
  check("run_mismatch", batches.runMismatch.length, "messages whose run in D1 is not the run the agent got them in");
  check("run_unknown", batches.runUnknown.length, "messages whose run_id is not among their session's runs");
  check("not_answered_once", batches.notAnsweredOnce.length, "runs carrying messages without exactly one reply");
  check("reply_mismatch", batches.replyMismatch.length, "replies naming other messages than their run carried");
  // So the check cannot silently stop exercising the queue: the burst keys must batch.
  if (expectBatches && batches.runsBatched === 0) {
    problems.push("no run carried more than one message: the load no longer exercises queue batching");
  }
  check("signatures", hooks.badSignatures, "hook deliveries with a bad signature");
  check("tokens", agent.badAuth, "hand-offs with a bad AGENT_TOKEN");
  return { figures, problems, details };
}

/**
 * Invariant 11 over D1 and the agent's records: each stored user message has
 * exactly one of `run_id` and `not_dispatched`; its run is one of its session's
 * runs and the run the agent received it in; no message reached the agent in two
 * different runs; and each run that carried messages has exactly one stored reply
 * (the fake agent's, which names every message it was given).
 */
export function checkBatches({ runTag, sessions, agent }) {
  const carried = new Map(); // run id -> user event ids whose D1 row names that run
  const runsOf = new Map(); // event id -> run ids naming it (D1 and agent), for the failure details
  const replies = new Map(); // run id -> stored assistant texts of that run
  const notDispatched = {};
  const stillWaiting = [];
  const runUnknown = [];
  const runMismatch = [];
  for (const session of sessions) {
    const known = new Set(session.runs.map((run) => run.run_id));
    for (const message of session.messages) {
      if (message.role === "assistant" && message.run_id) {
        replies.set(message.run_id, [...(replies.get(message.run_id) ?? []), message.text]);
      }
      if (message.role !== "user") continue;
      for (const id of eventIdsIn(message.text, runTag)) {
        if (message.not_dispatched) {
          notDispatched[message.not_dispatched] = (notDispatched[message.not_dispatched] ?? 0) + 1;
          // One of the two, never both.
          if (message.run_id) runMismatch.push(`${id} (run ${message.run_id} and not dispatched)`);
          continue;
        }
        if (!message.run_id) {
          stillWaiting.push(id);
          continue;
        }
        if (!known.has(message.run_id)) runUnknown.push(`${id} (run ${message.run_id})`);
        carried.set(message.run_id, [...(carried.get(message.run_id) ?? []), id]);
        const atAgent = [...(agent.carriedBy.get(id) ?? [])];
        runsOf.set(id, [`D1 ${message.run_id}`, ...atAgent.map((run) => `agent ${run}`)]);
        if (atAgent.length > 0 && !atAgent.includes(message.run_id)) {
          runMismatch.push(`${id} (D1 ${message.run_id}, agent ${atAgent.join(" ")})`);
        }
      }
    }
  }
  const inTwoRuns = [...agent.carriedBy].filter(([, runs]) => runs.size > 1).map(([id]) => id);
  const notAnsweredOnce = [];
  const replyMismatch = [];
  for (const [runId, ids] of carried) {
    const texts = replies.get(runId) ?? [];
    if (texts.length !== 1) {
      notAnsweredOnce.push(`${runId} (${texts.length} replies for ${ids.join(" ")})`);
      continue;
    }
    const named = eventIdsIn(texts[0], runTag).sort().join(" ");
    if (named !== [...ids].sort().join(" ")) replyMismatch.push(`${runId} (carries ${ids.join(" ")}; reply ${named})`);
  }
  const sizes = [...carried.values()].map((ids) => ids.length);
  return {
    runsCarrying: carried.size,
    runsBatched: sizes.filter((n) => n > 1).length,
    largestBatch: Math.max(0, ...sizes),
    notDispatched,
    stillWaiting,
    inTwoRuns,
    runMismatch,
    runUnknown,
    notAnsweredOnce,
    replyMismatch,
    runsOf,
  };
}
