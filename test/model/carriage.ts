/**
 * The overlap modes in the model (spec "Overlapping messages", invariant 11): which
 * run carries each stored user message. Three places:
 * - `adoptStored`: a message just stored got a run of its own or waits; D1's
 *   `run_id` says which, and the mode of its key says which it must be;
 * - `applyCarried`: a hand-off seen at the fake agent carries these messages
 *   (`messages`); each must be waiting, already given to this run, or carried by a
 *   run an interrupt revokes now, and the batch must fit the mode;
 * - `checkCarriage`: after every step, every user message D1 holds is carried by
 *   exactly one run of its own conversation, or recorded not dispatched with the
 *   reason its session's end gives, or still waits while the model says it may.
 * `checkWaitingAfterAlarm` says what an alarm must have dispatched.
 */
import { fail } from "./check";
import { LEASE_MS, notDispatchedFor, type Model, type MRun, type MSession } from "./model";
import type { AgentCall, D1Message, D1Run, Snapshot } from "./system";

/** What the overlap modes did so far (printed at the end, to show the modes were exercised). */
export const overlapSeen = { waited: 0, batches: 0, interrupts: 0, notDispatched: 0 };

/** The states of a message that has no hand-off of its own yet but may get one. */
const UNFINISHED = new Set(["staged", "retrying", "accepted", "limbo"]);

/**
 * A message was stored in `session` (applyRouted) and D1 answered `row` for it.
 * Must it have waited? `others`: the messages of the same burst, whose order of
 * arrival is the gateway's.
 */
export function adoptStored(m: Model, runs: MRun[], rows: Map<string, D1Message>): void {
  const session = m.sessions.get(runs[0]!.sessionId)!;
  const settings = m.overlap(session.key);
  const fresh = new Set(runs.map((run) => run.eventId));
  const before = m.runsOf(session).filter((run) => !fresh.has(run.eventId));
  const holding = before.filter(
    (run) =>
      run.state === "staged" ||
      run.state === "retrying" ||
      (run.state === "accepted" && run.heardAt! + LEASE_MS > m.now),
  );
  const unclear = before.some(
    (run) =>
      run.state === "limbo" ||
      run.fromLimbo ||
      run.heldByObject ||
      (run.state === "accepted" && run.heardAt! + LEASE_MS <= m.now),
  );
  const waitedBefore = before.some((run) => run.state === "waiting");
  // A message that starts a fresh session is judged against an earlier row of its key
  // (the entry's, or after a forgotten entry the newest this object still has work
  // for), whose hand-offs may still sit in the outbox: it may wait (the alarm then
  // carries it). So do that row's waiting messages (the gateway's "other messages
  // already wait"), and a hand-off or a wait its end left behind.
  const keyRows = m.byKey[session.key]!;
  const earlier = keyRows.filter((row) => row !== session);
  const replacedBusy = earlier.some((row) =>
    m
      .runsOf(row)
      .some(
        (run) =>
          UNFINISHED.has(run.state) ||
          ["limbo", "waiting", "waitEnded"].includes(run.state) ||
          run.fromLimbo ||
          run.heldByObject ||
          run.revokedByEndAt === m.now,
      ),
  );
  // Storing the message (the reopen's batch, or the fresh session's) made the object drop those runs.
  for (const row of keyRows) for (const run of m.runsOf(row)) run.heldByObject = false;
  let ownRuns = 0;
  for (const run of runs) {
    const row = rows.get(run.eventId);
    if (!row) fail("invariant 1 (messages)", `message ${run.eventId} is not in D1`);
    if (row.not_dispatched !== null) fail("invariant 11", `message ${run.eventId} stored as ${row.not_dispatched}`);
    if (row.run_id !== null) {
      ownRuns += 1;
      run.storedRunId = row.run_id;
      run.carriedBy = run.eventId;
    } else {
      run.state = "waiting";
      overlapSeen.waited += 1;
    }
  }
  const where = `${runs.map((run) => run.eventId)} (${settings.mode}, debounce ${settings.debounceMs})`;
  if (settings.debounceMs > 0) {
    if (ownRuns > 0) fail("overlap (debounce)", `${where}: a message got a run inside the debounce window`);
    return;
  }
  if (settings.mode === "concurrent") {
    if (ownRuns !== runs.length) fail("overlap (concurrent)", `${where}: a message waited`);
    return;
  }
  // queue and interrupt: a message waits behind an unfinished run (an interrupt is the alarm's to carry out).
  if (holding.length > 0 || waitedBefore) {
    if (ownRuns > 0) fail(`overlap (${settings.mode})`, `${where}: got a run beside ${holding.map((r) => r.eventId)}`);
  } else if (!unclear && !replacedBusy && ownRuns !== 1) {
    fail(`overlap (${settings.mode})`, `${where}: ${ownRuns} of them got a run, nothing was unfinished`);
  } else if (ownRuns > 1) {
    fail(`overlap (${settings.mode})`, `${where}: ${ownRuns} runs at once`);
  }
}

/**
 * A hand-off of a run not seen before: the messages it carries. Returns nothing;
 * moves the model (merged messages, runs an interrupt revoked) and fails on what the
 * spec forbids.
 */
export function applyCarried(m: Model, call: AgentCall, carrier: MRun): void {
  const session = m.sessions.get(carrier.sessionId)!;
  const settings = m.overlap(session.key);
  const where = `run ${call.runId} of ${call.eventId} carrying ${call.carried}`;
  if (call.carried.at(-1) !== call.eventId) fail("hand-off", `${where}: message is not the newest it carries`);
  if (new Set(call.carried).size !== call.carried.length) fail("invariant 11", `${where}: a message twice`);
  if (carrier.storedRunId !== null && carrier.storedRunId !== call.runId)
    fail("invariant 11", `${where}: D1 gave ${carrier.eventId} run ${carrier.storedRunId}`);
  const fromWaiting: MRun[] = [];
  const revoked = new Set<MRun>();
  let fromRevoked = 0;
  for (const id of call.carried) {
    const run = m.runs.get(id);
    if (!run || run.key !== session.key) fail("invariant 11", `${where}: ${id} is not a message of this conversation`);
    // A message travels with the run that carried it: a rotation moves that run, still
    // current, to the continuation, where an interrupt carries its messages on.
    const movedWithCarrier = run.carriedBy !== null && m.runs.get(run.carriedBy)?.sessionId === session.id;
    if (run.sessionId !== session.id && !movedWithCarrier)
      fail("invariant 11", `${where}: ${id} belongs to session ${run.sessionId}, not ${session.id}`);
    if (run.state === "waiting" || (run.storedRunId === call.runId && run.carriedBy !== call.eventId)) {
      fromWaiting.push(run);
      continue;
    }
    if (run === carrier && (run.state === "staged" || run.state === "limbo")) continue;
    // Carried already: only an interrupt may carry it again, revoking the run that had it.
    const previous = run.carriedBy ? m.runs.get(run.carriedBy)! : null;
    const stagedElsewhere = run.state === "staged" && run.storedRunId !== call.runId;
    if ((previous && UNFINISHED.has(previous.state)) || stagedElsewhere) {
      if (settings.mode !== "interrupt")
        fail("invariant 11", `${where}: ${id} was carried by an unfinished run, mode ${settings.mode}`);
      if (previous && UNFINISHED.has(previous.state)) revoked.add(previous);
      fromRevoked += 1;
      continue;
    }
    fail("invariant 11", `${where}: ${id} is already ${run.state}, carried by ${run.carriedBy}`);
  }
  if (call.carried.length > 1) overlapSeen.batches += 1;
  if (fromRevoked > 0) overlapSeen.interrupts += 1;
  for (const run of revoked) {
    run.state = "revoked";
    run.revokedReason = "superseded";
    run.interrupted = true;
  }
  for (const id of call.carried) {
    const run = m.runs.get(id)!;
    run.carriedBy = call.eventId;
    if (run !== carrier && run.state !== "revoked") run.state = "merged";
  }
  carrier.carries = [...call.carried];
  carrier.storedRunId = call.runId;
  // What max_batch left behind at this dispatch: older than the run, so (interrupt) it waits for it.
  const carriedNow = new Set(call.carried);
  session.leftovers = new Set(
    m
      .waitingIn(session)
      .map((run) => run.eventId)
      .filter((id) => !carriedNow.has(id)),
  );
  if (settings.mode === "concurrent" && settings.debounceMs === 0 && call.carried.length !== 1)
    fail("overlap (concurrent)", `${where}: one run per message`);
  const batch = fromRevoked === 0 ? call.carried.length : fromWaiting.length;
  // interrupt: a run staged for max_batch's leftovers and revoked by an interrupt before
  // it went out is never seen here; its messages look waiting, and the new run carries
  // them (at most max_batch) and at least one newer message.
  const unseenRevoked = settings.mode === "interrupt" && fromRevoked === 0 ? 1 : 0;
  const limit = fromRevoked === 0 ? settings.maxBatch + unseenRevoked : Math.max(settings.maxBatch - fromRevoked, 1);
  if (batch > limit) fail("overlap (max_batch)", `${where}: ${batch} messages, at most ${limit}`);
  const newestCarried = Math.max(0, ...fromWaiting.map((run) => run.stagedAt));
  const older = m.waitingIn(session).filter((run) => run.stagedAt < newestCarried);
  if (older.length > 0) fail("overlap (oldest first)", `${where}: ${older.map((r) => r.eventId)} still wait`);
  if (settings.mode !== "concurrent") {
    const others = m.unfinishedIn(session).holding.filter((run) => run !== carrier);
    if (others.length > 0)
      fail(`invariant 11 (${settings.mode})`, `${where}: beside unfinished ${others.map((r) => r.eventId)}`);
  }
}

/**
 * After an alarm of `key` (`fired`: one was set): what waits in its live session
 * must have been dispatched, unless a debounce window is still open or, in `queue`,
 * a run is unfinished.
 */
export function checkWaitingAfterAlarm(m: Model, key: number, fired: boolean): void {
  const session = m.newest(key);
  if (!session || session.endReason !== null) return;
  const waiting = m.waitingIn(session);
  if (waiting.length === 0) return;
  const settings = m.overlap(key);
  const quietAt = Math.max(...waiting.map((run) => run.stagedAt)) + settings.debounceMs;
  if (m.now < quietAt) return;
  const { holding, lapsed } = m.unfinishedIn(session);
  if (m.runsOf(session).some((run) => run.state === "limbo" || run.fromLimbo)) return;
  if (settings.mode === "queue" && holding.length > 0) return;
  // interrupt: only a message newer than the run interrupts it; what max_batch left
  // behind when it was dispatched waits for it, as in queue.
  if (
    settings.mode === "interrupt" &&
    holding.length > 0 &&
    waiting.every((run) => session.leftovers?.has(run.eventId))
  )
    return;
  // A run past its lease is over once the gateway reads it: the alarm may have ended the session instead.
  if (lapsed.length > 0 && settings.mode !== "concurrent") return;
  fail(
    `invariant 11 (${settings.mode}, left waiting)`,
    `${session.id}: ${waiting.map((r) => r.eventId)} still wait after the alarm (${fired ? "fired" : "none set"})` +
      `; unfinished: ${holding.map((r) => `${r.eventId}:${r.state}`)}`,
  );
}

/** The session ids a message stored in `storedIn` may be carried in: it and its continuations. */
function lineOf(m: Model, storedIn: string): Set<string> {
  const line = new Set([storedIn]);
  for (const session of m.sessions.values()) if (session.parentId && line.has(session.parentId)) line.add(session.id);
  return line;
}

function carriedIds(run: D1Run): string[] {
  if (run.messages === null) return [run.event_id];
  return (JSON.parse(run.messages) as { eventId?: string; event_id?: string }[]).map((m) => m.eventId ?? m.event_id!);
}

/** Why a waiting message of this session may have been recorded not dispatched (its ends so far). */
function droppedReasons(session: MSession): string[] {
  return session.ends.map((end) => notDispatchedFor(end.reason));
}

/** Invariant 11 on what D1 holds, after every step; adopts what the model left to the gateway. */
export function checkCarriage(m: Model, snap: Snapshot): void {
  const runs = new Map(snap.runs.map((run) => [run.id, run]));
  const carriers = new Map<string, string>();
  for (const run of snap.runs) {
    if (run.revoked_reason !== null) continue;
    for (const id of carriedIds(run)) {
      const other = carriers.get(id);
      if (other) fail("invariant 11 (two runs)", `message ${id} is carried by ${other} and ${run.id}`);
      carriers.set(id, run.id);
    }
  }
  for (const row of snap.messages) {
    if (row.role !== "user") continue;
    const where = `message ${row.event_id} (seq ${row.seq} of ${row.session_id})`;
    if (row.run_id !== null && row.not_dispatched !== null)
      fail("invariant 11", `${where}: run ${row.run_id} and not dispatched (${row.not_dispatched})`);
    const model = row.event_id ? m.runs.get(row.event_id) : undefined;
    if (!model) fail("invariant 11", `${where}: a user message the model never sent`);
    const session = m.sessions.get(model.storedIn)!;
    if (row.not_dispatched !== null) {
      if (model.state === "dropped" && row.not_dispatched === model.notDispatched) {
        if (!model.seenDropped) overlapSeen.notDispatched += 1;
        model.seenDropped = true;
        continue;
      }
      const sqlEnded = model.state === "waitEnded" || model.state === "waiting";
      // A hand-off still in the outbox when its session ended never went out: recorded not dispatched.
      const neverOut = model.state === "limbo" && model.runId === null;
      // The session it waits in now: a rotation moves what waits to the continuation, whose end records it.
      const waitsIn = m.sessions.get(model.sessionId) ?? session;
      const endedBySql = [session, waitsIn].filter((s) => s.ends.some((end) => end.bySql));
      const mayDrop = neverOut || (sqlEnded && endedBySql.length > 0);
      const reasons = neverOut ? droppedReasons(session) : endedBySql.flatMap((s) => droppedReasons(s));
      if (mayDrop && reasons.includes(row.not_dispatched)) {
        // Its outbox item may linger until the drain drops it: later messages may wait for it.
        model.fromLimbo = neverOut;
        model.state = "dropped";
        model.notDispatched = row.not_dispatched;
        continue;
      }
      fail("invariant 11 (not dispatched)", `${where}: ${row.not_dispatched}, the model says ${model.state}`);
    }
    if (model.state === "dropped")
      fail("invariant 11 (not dispatched)", `${where}: should be recorded ${model.notDispatched}, D1 says none`);
    if (row.run_id === null) {
      if (model.state === "waiting" || model.state === "waitEnded") continue;
      // An interrupt released it from the run it revoked; the replacement's hand-off attaches it again.
      if (m.overlap(session.key).mode === "interrupt" && model.carriedBy !== null) continue;
      fail("invariant 11 (carried by no run)", `${where}: the model says ${model.state} (run ${model.storedRunId})`);
    }
    const run = runs.get(row.run_id);
    if (!run) {
      // The run is written when its hand-off leaves the outbox; until then only the message names it.
      const handed = model.carriedBy ? m.runs.get(model.carriedBy)?.runId === row.run_id : false;
      if (handed || model.state === "merged") fail("invariant 11", `${where}: run ${row.run_id} is not in D1`);
      if (model.state === "waiting" || model.state === "waitEnded") {
        model.state = "staged";
        model.storedRunId = row.run_id;
      }
      continue;
    }
    if (!lineOf(m, model.storedIn).has(run.session_id))
      fail("invariant 11 (other session)", `${where}: carried by ${run.id} of session ${run.session_id}`);
    if (run.revoked_reason === null && carriers.get(row.event_id!) !== run.id)
      fail("invariant 11", `${where}: its run ${run.id} does not list it (listed by ${carriers.get(row.event_id!)})`);
    if (model.state === "waiting" || model.state === "waitEnded") {
      // Dispatched from waiting; the hand-off goes out at the next drain of the outbox.
      if (session.endReason !== null && !session.ends.at(-1)!.bySql)
        fail("invariant 11", `${where}: dispatched in ${run.id} after its session ended ${session.endReason}`);
      model.state = "staged";
      model.storedRunId = row.run_id;
      continue;
    }
    if (model.storedRunId !== null && model.storedRunId !== row.run_id) {
      // Carried again: only an interrupt does that (applyCarried checks the revoked run).
      if (m.overlap(session.key).mode !== "interrupt")
        fail("invariant 11", `${where}: moved from run ${model.storedRunId} to ${row.run_id}`);
    }
  }
  // A run an interrupt revoked says so in D1 (its heartbeat and a late reply read it there).
  for (const model of m.runs.values()) {
    if (!model.interrupted || model.runId === null) continue;
    const row = runs.get(model.runId);
    if (row && row.revoked_reason !== "superseded")
      fail("invariant 11 (interrupt)", `run ${model.runId} of ${model.eventId} is not revoked in D1`);
  }
  checkOneUnfinished(m, snap);
}

/** `queue` and `interrupt`: a live session never has two unfinished runs (invariant 11), read from D1. */
function checkOneUnfinished(m: Model, snap: Snapshot): void {
  const live = new Set(snap.sessions.filter((row) => row.end_reason === null).map((row) => row.id));
  const count = new Map<string, string[]>();
  for (const run of snap.runs) {
    if (!live.has(run.session_id)) continue;
    if (run.finished_at !== null || run.revoked_reason !== null || run.failed_at !== null) continue;
    const heard = run.last_heartbeat_at ?? run.dispatched_at ?? run.created_at;
    if (run.accepted_at !== null && heard + LEASE_MS <= m.now) continue;
    count.set(run.session_id, [...(count.get(run.session_id) ?? []), run.id]);
  }
  for (const [sessionId, ids] of count) {
    const session = m.sessions.get(sessionId);
    if (!session || ids.length < 2) continue;
    const mode = m.overlap(session.key).mode;
    if (mode !== "concurrent") fail(`invariant 11 (${mode})`, `session ${sessionId} has unfinished runs ${ids}`);
  }
}
