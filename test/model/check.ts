/**
 * After every step: D1 (sessions, messages, lifecycle events), the routing entries
 * (GET /admin/routes/{key}), the alarms and the captured replies and hook events
 * are compared with the model, and the spec's invariants are checked on what D1
 * holds. A difference throws, naming the invariant.
 */
import { checkCarriage } from "./carriage";
import { finalizes, isRecoverable, type Model, type MSession } from "./model";
import { admin, alarmOf, snapshot, type D1Event, type FakeServices, type Snapshot } from "./system";

export class Violation extends Error {
  constructor(invariant: string, detail: string) {
    super(`${invariant}: ${detail}`);
    this.name = "Violation";
  }
}

export function fail(invariant: string, detail: string): never {
  throw new Violation(invariant, detail);
}

const sortKey = (m: { role: string; text: string; at: number }) =>
  `${String(m.at).padStart(16, "0")} ${m.role} ${m.text}`;

/**
 * Adopts what D1 shows where the model allows a choice: a live or recoverable row
 * the policy may end now (not held by its turn, invariant 6), or a live row whose
 * run's lease lapsed (orphan_reap). Any other difference in end_reason is a
 * violation of first-wins boundaries (invariant 4) or of the expiry rules.
 */
function reconcileEnds(m: Model, snap: Snapshot): void {
  const rows = new Map(snap.sessions.map((row) => [row.id, row]));
  for (const session of m.sessions.values()) {
    const row = rows.get(session.id);
    if (!row) fail("D1 contract", `session ${session.id} is missing from D1`);
    if (row.end_reason === session.endReason) continue;
    const allowed = m.policyEndsAllowed(session);
    if (row.end_reason !== null && allowed.includes(row.end_reason)) {
      m.end(session, row.end_reason);
      continue;
    }
    if (row.end_reason === "orphan_reap" && session.endReason === null && m.leaseLapsed(session)) {
      m.end(session, "orphan_reap");
      continue;
    }
    fail(
      "invariant 4/6 (boundaries, expiry)",
      `session ${session.id} is ${row.end_reason ?? "live"} in D1, the model says ${session.endReason ?? "live"}` +
        ` (policy may end it for: ${allowed.join(",") || "nothing"}; held: ${m.held(session)}; last active ${session.lastActiveAt}, now ${m.now})`,
    );
  }
}

function checkSessions(m: Model, snap: Snapshot): void {
  const known = new Set(m.sessions.keys());
  for (const row of snap.sessions) {
    if (!known.has(row.id)) fail("invariant 1/5", `D1 holds a session the model never saw: ${JSON.stringify(row)}`);
  }
  const messages = new Map<string, typeof snap.messages>();
  for (const message of snap.messages) {
    const list = messages.get(message.session_id) ?? [];
    list.push(message);
    messages.set(message.session_id, list);
  }
  for (const session of m.sessions.values()) {
    const row = snap.sessions.find((r) => r.id === session.id)!;
    const where = `session ${session.id}`;
    if (row.session_key !== m.keys[session.key]!.key) fail("session key", `${where} has key ${row.session_key}`);
    if (row.last_active_at !== session.lastActiveAt)
      fail("last activity", `${where}: last_active_at ${row.last_active_at}, model ${session.lastActiveAt}`);
    if (row.parent_session_id !== session.parentId)
      fail("rotation", `${where}: parent ${row.parent_session_id}, model ${session.parentId}`);
    if (!session.unnoticed && (row.ended_at === null) !== (row.end_reason === null))
      fail("D1 contract", `${where}: ended_at ${row.ended_at} with end_reason ${row.end_reason}`);
    const stored = messages.get(session.id) ?? [];
    const actual = stored.map((s) => sortKey({ role: s.role, text: s.text, at: s.created_at })).sort();
    const expected = session.messages.map(sortKey).sort();
    if (JSON.stringify(actual) !== JSON.stringify(expected))
      fail("invariant 1 (messages)", `${where}: D1 ${JSON.stringify(actual)}, model ${JSON.stringify(expected)}`);
    for (let i = 1; i < stored.length; i++) {
      if (stored[i]!.created_at < stored[i - 1]!.created_at)
        fail("transcript order", `${where}: seq out of time order`);
    }
  }
  checkCarriage(m, snap);
  m.keys.forEach((spec, key) => {
    const rows = snap.sessions.filter((row) => row.session_key === spec.key);
    const live = rows.filter((row) => row.end_reason === null);
    if (live.length > 1) fail("one live session per key", `${spec.key} has ${live.length} live rows`);
    if (live.length === 1 && rows.at(-1)!.id !== live[0]!.id)
      fail("invariant 5", `${spec.key}: the live row is not the newest`);
    for (let i = 1; i < rows.length; i++) {
      if (rows[i]!.started_at <= rows[i - 1]!.started_at) fail("newest row", `${spec.key}: started_at not increasing`);
    }
    const order = m.byKey[key]!.map((s) => s.id);
    if (JSON.stringify(order) !== JSON.stringify(rows.map((r) => r.id)))
      fail("invariant 5", `${spec.key}: D1 order ${rows.map((r) => r.id)} vs model ${order}`);
  });
}

function multiset(values: string[]): string {
  return JSON.stringify([...values].sort());
}

/** Spec "Lifecycle events" and invariant 7, on the rows D1 holds. */
function checkEvents(m: Model, snap: Snapshot): void {
  const bySession = new Map<string, D1Event[]>();
  for (const event of snap.events) {
    const list = bySession.get(event.session_id) ?? [];
    list.push(event);
    bySession.set(event.session_id, list);
  }
  for (const session of m.sessions.values()) {
    const events = bySession.get(session.id) ?? [];
    const of = (type: string) => events.filter((e) => e.type === `session.${type}`);
    const where = `session ${session.id}`;
    if (of("started").length !== 1) fail("session.started", `${where} has ${of("started").length} started events`);
    const resets = of("reset");
    const wantsReset = session.previous !== null && session.parentId === null;
    if (resets.length !== (wantsReset ? 1 : 0)) fail("session.reset", `${where} has ${resets.length} reset events`);
    if (wantsReset) {
      const payload = JSON.parse(resets[0]!.payload);
      if (resets[0]!.reason !== session.previous!.reason || payload.previous_session_id !== session.previous!.id)
        fail("session.reset", `${where}: ${resets[0]!.payload} vs model ${JSON.stringify(session.previous)}`);
      if (payload.had_activity !== session.previous!.hadActivity)
        fail("session.reset", `${where}: had_activity ${payload.had_activity}`);
    }
    // Every end yields one ended event; one made by SQL only once the gateway looked.
    const ended = of("ended").map((e) => e.reason ?? "");
    const all = session.ends.map((e) => e.reason);
    // An end made by SQL is owed its own event only if the row still shows it once the
    // gateway looked: one it promoted or reopened at that look is reported as it stands.
    // An event's id is its session, reason and time: the same end made twice in one
    // millisecond (an end, a message reopening the row, the same end again) is one event.
    const required = session.ends.filter(
      (e, i) =>
        (!e.bySql || (!e.optional && (i < session.ends.length - 1 || !session.unnoticed))) &&
        !session.ends.some(
          (earlier, j) => j < i && !e.bySql && !earlier.bySql && earlier.reason === e.reason && earlier.at === e.at,
        ),
    );
    const pool = [...ended];
    for (const end of required) {
      const at = pool.indexOf(end.reason);
      if (at < 0)
        fail("session.ended", `${where}: no ended event for its ${end.reason} end (D1 has ${multiset(ended)})`);
      pool.splice(at, 1);
    }
    const spare = [...all];
    for (const reason of ended) {
      const at = spare.indexOf(reason);
      if (at < 0) fail("session.ended", `${where}: an ended event for ${reason}, model ends ${multiset(all)}`);
      spare.splice(at, 1);
    }
    const finalized = of("finalized");
    if (finalized.length > 1) fail("invariant 7", `${where} finalized ${finalized.length} times`);
    const final = session.endReason;
    if (finalized.length === 1 && (final === null || !finalizes(final) || finalized[0]!.reason !== final))
      fail("invariant 7", `${where} finalized as ${finalized[0]!.reason} but is ${final ?? "live"}`);
    if (finalized.length === 0 && final !== null && finalizes(final) && !session.unnoticed)
      fail("invariant 7", `${where} ended ${final} and never finalized`);
  }
}

/** Captured outbound calls: replies owed (with their notice, invariant 10), no second reply (invariant 9). */
function checkDeliveries(m: Model, services: FakeServices, seen: { replies: number; hooks: number }, snap: Snapshot) {
  for (const reply of services.replies.slice(seen.replies)) {
    if (typeof reply.text === "string" && /^(re|late):/.test(reply.text)) {
      const owed = m.pendingReplies.flat().find((r) => r.eventId === reply.event_id && r.text === reply.text);
      if (!owed) fail("invariant 9 (one reply)", `a reply nobody owed: ${JSON.stringify(reply)}`);
      if (reply.session_id !== owed.sessionId) fail("reply", `reply for ${owed.sessionId} names ${reply.session_id}`);
      if ((reply.notice ?? null) !== owed.notice)
        fail("invariant 10 (reset notice)", `reply ${JSON.stringify(reply)} should carry notice ${owed.notice}`);
      for (const list of m.pendingReplies) {
        const at = list.indexOf(owed);
        if (at >= 0) list.splice(at, 1);
      }
    } else {
      const list = m.pendingAnswers.find((l) => l.includes(reply.event_id));
      if (!list) fail("invariant 9 (one reply)", `a command answer nobody owed: ${JSON.stringify(reply)}`);
      list.splice(list.indexOf(reply.event_id), 1);
    }
  }
  seen.replies = services.replies.length;
  const ids = new Map(snap.events.map((e) => [e.id, e]));
  for (const hook of services.hooks.slice(seen.hooks)) {
    const row = ids.get(hook.id);
    if (!row || row.type !== hook.type || row.session_id !== hook.session_id)
      fail("lifecycle events", `a hook event D1 does not hold: ${JSON.stringify(hook).slice(0, 300)}`);
  }
  seen.hooks = services.hooks.length;
  if (services.unexpected.length > 0) fail("outbound", `unexpected requests ${services.unexpected}`);
}

/** GET /admin/routes/{key} and the object's alarm against the model (spec invariant 6, Operator API). */
async function checkRoutes(m: Model, keys: number[]): Promise<void> {
  for (const key of keys) {
    const spec = m.keys[key]!;
    const route = await admin(`/admin/routes/${encodeURIComponent(spec.key)}`);
    if (route.status !== 200) fail("operator API", `GET routes ${spec.key}: ${route.status}`);
    const newest = m.newest(key);
    if (!m.entry[key] || !newest) {
      if (route.body.entry !== null)
        fail("routing entry", `${spec.key} should have no entry: ${JSON.stringify(route.body)}`);
      continue;
    }
    if (route.body.entry?.session_id !== newest.id || route.body.session?.id !== newest.id)
      fail("routing entry", `${spec.key} points at ${route.body.entry?.session_id}, newest is ${newest.id}`);
    const deadline = newest.endReason === null ? m.deadline(newest) : null;
    if (route.body.alarm_at !== deadline)
      fail("alarm_at", `${spec.key}: alarm_at ${route.body.alarm_at}, the live session's deadline is ${deadline}`);
    const watchedDeadline = newest.endReason === null || isRecoverable(newest.endReason) ? m.deadline(newest) : null;
    if (watchedDeadline === null) continue;
    const alarm = await alarmOf(spec.key);
    if (alarm === null) fail("invariant 6", `${spec.key}: no alarm for a session with deadline ${watchedDeadline}`);
    if (m.held(newest) === false && alarm > Math.max(watchedDeadline, m.now + 1))
      fail("invariant 6", `${spec.key}: alarm ${alarm} is after the deadline ${watchedDeadline}`);
  }
}

/**
 * Everything after one step. D1 and the captured calls are compared in full; the
 * routing entries and alarms of the keys the step touched (each costs a call into
 * its routing object).
 */
export async function verify(
  m: Model,
  services: FakeServices,
  seen: { replies: number; hooks: number },
  touched: number[] = m.keys.map((_, key) => key),
): Promise<Snapshot> {
  const snap = await snapshot(m.keys.map((k) => k.key));
  reconcileEnds(m, snap);
  checkSessions(m, snap);
  checkEvents(m, snap);
  checkDeliveries(m, services, seen, snap);
  await checkRoutes(m, touched);
  return snap;
}

export function describeSession(session: MSession): string {
  return `${session.id}(${session.endReason ?? "live"}, last ${session.lastActiveAt})`;
}
