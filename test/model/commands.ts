/**
 * The steps of the model-based test, as fast-check commands: each runs against the
 * real worker, moves the model as the spec says, and then `verify` compares.
 */
import { env } from "cloudflare:workers";
import fc from "fast-check";
import { vi } from "vitest";
import { setNow } from "../helpers";
import { adoptStored, applyCarried, checkWaitingAfterAlarm } from "./carriage";
import { fail, verify } from "./check";
import {
  DEDUPE_MS,
  END_REASONS,
  GIVE_UP_MS,
  isRecoverable,
  noticeFor,
  type AgentMode,
  type Model,
  type MRun,
  type MSession,
} from "./model";
import {
  admin,
  agentApi,
  fireAlarm,
  postWebhook,
  sessionRow,
  sqlEnd,
  storedMessages,
  type Answer,
  type FakeServices,
} from "./system";

/** What the commands share besides the model: the fake services and a step counter. */
export interface Real {
  services: FakeServices;
  seen: { replies: number; hooks: number };
  steps: { count: number };
  log: string[];
}

type Cmd = fc.AsyncCommand<Model, Real>;

let eventCounter = 0;
/** MODEL_TRACE=1 prints every step as it starts (to find a step that hangs). */
const TRACE = !!(env as unknown as Record<string, string | undefined>).MODEL_TRACE;

function expectStatus(what: string, answer: Answer, status: number): void {
  if (answer.status !== status)
    fail(what, `answered ${answer.status} ${JSON.stringify(answer.body)}, expected ${status}`);
}

/**
 * Runs one step and verifies after it. `touched`: the keys whose routing entry and
 * alarm may have changed (null: none, the step only moved the model's clock or the
 * fake agent's mood, so the system itself is unchanged).
 */
async function step(
  m: Model,
  r: Real,
  label: string,
  body: () => Promise<void>,
  touched: number[] | null = m.keys.map((_, key) => key),
): Promise<void> {
  if (!label.startsWith("settle")) r.steps.count += 1;
  r.log.push(`${label} @${m.now}`);
  const t0 = TRACE ? vi.getRealSystemTime() : 0;
  await body();
  const t1 = TRACE ? vi.getRealSystemTime() : 0;
  if (touched !== null) await verify(m, r.services, r.seen, touched);
  if (TRACE) console.log(`model step: ${label} @${m.now} (${t1 - t0} ms, verify ${vi.getRealSystemTime() - t1} ms)`);
}

/** Where a message for `key` may go now, per spec invariants 2, 3, 5 and 6. */
function routingChoices(m: Model, key: number): { append: MSession | null; fresh: string[] | null } {
  const row = m.newest(key);
  if (!row) return { append: null, fresh: [] };
  if (row.endReason === null) {
    const expired = m.expiry(row);
    if (expired.length === 0) return { append: row, fresh: null };
    const held = m.held(row);
    if (held === true) return { append: row, fresh: null };
    return { append: held === "unknown" ? row : null, fresh: expired };
  }
  if (isRecoverable(row.endReason)) {
    const expired = m.expiry(row);
    return expired.length === 0 ? { append: row, fresh: null } : { append: null, fresh: expired };
  }
  return { append: null, fresh: [] };
}

/** The gateway read the newest row: an end made by SQL is now owed its events. */
function noticed(session: MSession | null): void {
  if (session) session.unnoticed = false;
}

/**
 * Applies one accepted message: appended (or reopened) into the row the model
 * allowed, or a fresh session started after the row's end.
 */
async function applyRouted(m: Model, key: number, eventId: string, text: string, sessionId: string): Promise<void> {
  const row = m.newest(key);
  const choices = routingChoices(m, key);
  if (row && sessionId === row.id) {
    if (!choices.append)
      fail("invariant 2/3", `message ${eventId} reused ${row.id} (${row.endReason ?? "live"}), which had to end`);
    if (row.endReason !== null) m.reopen(row);
    m.store(row, eventId, text);
  } else {
    if (!choices.fresh)
      fail("invariant 2", `message ${eventId} started ${sessionId} while ${row!.id} was to be reused`);
    if (m.sessions.has(sessionId)) fail("invariant 5", `message ${eventId} went to older session ${sessionId}`);
    if (row && choices.fresh.length > 0) {
      const d1 = await sessionRow(row.id);
      if (!d1?.end_reason || !choices.fresh.includes(d1.end_reason))
        fail("invariant 3", `${row.id} should have ended for ${choices.fresh}, D1 says ${d1?.end_reason}`);
      m.end(row, d1.end_reason);
    }
    const fresh = await sessionRow(sessionId);
    if (!fresh) fail("invariant 1", `answered session ${sessionId} is not in D1`);
    if (row && fresh.started_at <= row.startedAt) fail("newest row", `${sessionId} started before ${row.id}`);
    const previous = row ? { id: row.id, reason: row.endReason!, hadActivity: row.messages.length > 0 } : null;
    const session = m.addSession(key, sessionId, fresh.started_at, {
      // Last activity mirrors the newest message (spec D1 contract), even if started_at
      // was nudged past the previous row's to keep it increasing.
      lastActiveAt: m.now,
      previous,
      noticeOwed: previous ? noticeFor(previous.reason, previous.hadActivity) : null,
    });
    m.store(session, eventId, text);
  }
  noticed(row);
  m.entry[key] = true;
}

function messageBody(m: Model, key: number, eventId: string, text: string): Record<string, unknown> {
  const spec = m.keys[key]!;
  return {
    event_id: eventId,
    chat_id: spec.chatId,
    chat_type: spec.chatType,
    user_id: spec.userId,
    ...(spec.threadId ? { thread_id: spec.threadId } : {}),
    text,
  };
}

function nextEventId(m: Model): string {
  eventCounter += 1;
  return `${m.prefix}-e${eventCounter}`;
}

// ------------------------------------------------------------------ messages

class Send implements Cmd {
  constructor(
    readonly key: number,
    readonly text: string,
  ) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const eventId = nextEventId(m);
        const text = `${this.text} ${eventId}`;
        const body = messageBody(m, this.key, eventId, text);
        const answer = await postWebhook(body);
        expectStatus("invariant 1 (message)", answer, 200);
        if (answer.body.duplicate !== false) fail("invariant 9", `a new event answered duplicate`);
        await applyRouted(m, this.key, eventId, text, answer.body.session_id);
        adoptStored(m, [m.runs.get(eventId)!], await storedMessages([eventId]));
        m.sent.push({ eventId, key: this.key, body, at: m.now, sessionId: answer.body.session_id });
      },
      [this.key],
    );
  }
  toString = () => `Send(${this.key}, ${JSON.stringify(this.text)})`;
}

/** Several messages to one key at once, optionally with a platform retry of the first racing it. */
class Burst implements Cmd {
  constructor(
    readonly key: number,
    readonly size: number,
    readonly racingRetry: boolean,
  ) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const bodies = Array.from({ length: this.size }, () => {
          const eventId = nextEventId(m);
          return messageBody(m, this.key, eventId, `burst ${eventId}`);
        });
        const requests = this.racingRetry ? [...bodies, bodies[0]!] : bodies;
        const answers = await Promise.all(requests.map((body) => postWebhook(body)));
        for (const answer of answers) expectStatus("invariant 1 (burst)", answer, 200);
        const ids = new Set(answers.map((a) => a.body.session_id));
        if (ids.size !== 1) fail("one live session per key", `a burst landed in ${[...ids]}`);
        if (this.racingRetry) {
          const fresh = [answers[0]!, answers.at(-1)!].filter((a) => a.body.duplicate === false).length;
          if (fresh !== 1) fail("invariant 9", `a racing retry was stored ${fresh} times`);
        }
        const sessionId = answers[0]!.body.session_id as string;
        for (const body of bodies) {
          await applyRouted(m, this.key, body.event_id as string, body.text as string, sessionId);
          m.sent.push({ eventId: body.event_id as string, key: this.key, body, at: m.now, sessionId });
          // The order of arrival is the gateway's: which one is the session's first run is unknown.
          m.runs.get(body.event_id as string)!.isNew = null;
        }
        const stored = bodies.map((body) => body.event_id as string);
        adoptStored(
          m,
          stored.map((id) => m.runs.get(id)!),
          await storedMessages(stored),
        );
      },
      [this.key],
    );
  }
  toString = () => `Burst(${this.key}, ${this.size}${this.racingRetry ? ", racing retry" : ""})`;
}

/** A platform retry of an event already answered (spec invariant 9). */
class Retry implements Cmd {
  constructor(readonly pick: number) {}
  private target(m: Model) {
    const recent = m.sent.filter((s) => m.now - s.at < DEDUPE_MS);
    return recent.length === 0 ? null : recent[this.pick % recent.length]!;
  }
  check = (m: Readonly<Model>) => this.target(m as Model) !== null;
  async run(m: Model, r: Real) {
    const sent = this.target(m)!;
    await step(
      m,
      r,
      `${this} of ${sent.eventId}`,
      async () => {
        const answer = await postWebhook(sent.body);
        expectStatus("invariant 9 (retry)", answer, 200);
        if (answer.body.duplicate !== true || answer.body.session_id !== sent.sessionId)
          fail(
            "invariant 9",
            `retry of ${sent.eventId} answered ${JSON.stringify(answer.body)}, first ${sent.sessionId}`,
          );
      },
      [sent.key],
    );
  }
  toString = () => `Retry(${this.pick})`;
}

class Command implements Cmd {
  constructor(
    readonly key: number,
    readonly text: "/new" | "/reset" | "/stop" | "/new please" | "/STOP",
  ) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const eventId = nextEventId(m);
        const body = messageBody(m, this.key, eventId, this.text);
        const row = m.newest(this.key);
        const stop = this.text.toLowerCase() === "/stop";
        // How the current row may end (commands end at once, even a held session).
        let options: (string | null)[] = [null];
        if (row && row.endReason === null) {
          const own = stop ? "suspended" : "new_command";
          const expired = m.expiry(row);
          const held = m.held(row);
          options = expired.length === 0 || held === true ? [own] : held === false ? expired : [...expired, own];
        } else if (row && isRecoverable(row.endReason)) {
          const expired = m.expiry(row);
          options = expired.length > 0 ? expired : [null];
        }
        const answer = await postWebhook(body);
        expectStatus("command", answer, 200);
        if (answer.body.duplicate !== false) fail("invariant 9", `a new command answered duplicate`);
        if (row && options[0] !== null) {
          const d1 = await sessionRow(row.id);
          if (!options.includes(d1?.end_reason ?? null))
            fail("commands", `${this.text} left ${row.id} as ${d1?.end_reason}, allowed ${options}`);
          m.end(row, d1!.end_reason!);
        } else if (row && isRecoverable(row.endReason) && !stop) {
          row.watched = true;
        }
        noticed(row);
        if (stop) {
          if (answer.body.session_id !== (row?.id ?? null))
            fail("commands", `/stop answered ${answer.body.session_id}, expected ${row?.id ?? null}`);
        } else {
          const id = answer.body.session_id as string;
          if (m.sessions.has(id)) fail("commands", `${this.text} did not start a fresh session`);
          const fresh = await sessionRow(id);
          if (!fresh || fresh.end_reason !== null) fail("commands", `${this.text}: fresh session ${id} not live in D1`);
          const previous = row ? { id: row.id, reason: row.endReason!, hadActivity: row.messages.length > 0 } : null;
          m.addSession(this.key, id, fresh.started_at, {
            previous,
            noticeOwed: previous ? noticeFor(previous.reason, previous.hadActivity) : null,
          });
          m.entry[this.key] = true;
        }
        if (answer.body.session_id) m.pendingAnswers[this.key]!.push(eventId);
        m.sent.push({ eventId, key: this.key, body, at: m.now, sessionId: answer.body.session_id });
      },
      [this.key],
    );
  }
  toString = () => `Command(${this.key}, ${this.text})`;
}

// ------------------------------------------------------------------ time and alarms

class Advance implements Cmd {
  constructor(readonly ms: number) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        m.now += this.ms;
        setNow(m.now);
      },
      null,
    );
  }
  toString = () => `Advance(${this.ms})`;
}

/** Jumps to just before, at, or just after the deadline of a key's newest row. */
class ToDeadline implements Cmd {
  constructor(
    readonly key: number,
    readonly offset: -1 | 0 | 1,
  ) {}
  private target(m: Model): number | null {
    const row = m.newest(this.key);
    if (!row || (row.endReason !== null && !isRecoverable(row.endReason))) return null;
    const at = m.deadline(row);
    return at !== null && at + this.offset > m.now ? at + this.offset : null;
  }
  check = (m: Readonly<Model>) => this.target(m as Model) !== null;
  async run(m: Model, r: Real) {
    const at = this.target(m)!;
    await step(
      m,
      r,
      `${this} to ${at}`,
      async () => {
        m.now = at;
        setNow(at);
      },
      null,
    );
  }
  toString = () => `ToDeadline(${this.key}, ${this.offset})`;
}

/** Applies the outcome of each hand-off the alarm made (observed at the fake agent). */
function applyHandOffs(m: Model, r: Real, from: number): void {
  for (const call of r.services.agentCalls.slice(from)) {
    if (TRACE) console.log(`model call: ${JSON.stringify(call)}`);
    const run = m.runs.get(call.eventId);
    if (!run) fail("agent hand-off", `a run for unknown event ${call.eventId}`);
    const session = m.sessions.get(run.sessionId)!;
    const open = run.state === "staged" || run.state === "retrying" || run.state === "limbo" || run.state === "waiting";
    if (!open) fail("invariant 9 (one turn)", `run of ${run.eventId} handed over again while ${run.state}`);
    if (session.endReason !== null)
      fail("revocation", `run of ${run.eventId} handed over although ${session.id} ended ${session.endReason}`);
    if (run.runId === null) {
      run.runId = call.runId;
      run.token = call.token;
      if (call.sessionId !== run.storedIn && call.sessionId !== run.sessionId)
        fail("agent hand-off", `run of ${run.eventId} names session ${call.sessionId}`);
      if (run.isNew !== null && call.isNew !== run.isNew)
        fail("agent hand-off", `run of ${run.eventId}: is_new ${call.isNew}, expected ${run.isNew}`);
      if (run.isNew === true && JSON.stringify(call.reset) !== JSON.stringify(run.reset))
        fail(
          "agent hand-off",
          `run of ${run.eventId}: reset ${JSON.stringify(call.reset)}, expected ${JSON.stringify(run.reset)}`,
        );
      // A run dispatched from the waiting list is staged by the alarm that hands it over:
      // its day of retries runs from then, not from when its newest message was stored.
      const dispatchedFromWaiting = run.state === "waiting";
      applyCarried(m, call, run);
      if (dispatchedFromWaiting) run.stagedAt = m.now;
      session.currentRun = run;
    } else if (call.runId !== run.runId || call.token !== run.token) {
      fail("agent hand-off", `a retry of ${run.eventId} changed its run id or token`);
    } else if (JSON.stringify(call.carried) !== JSON.stringify(run.carries)) {
      fail("invariant 11", `a retry of ${run.eventId} carries ${call.carried}, first ${run.carries}`);
    }
    if (call.mode === "reply") m.recordReply(run, `re:${run.eventId}`);
    else if (call.mode === "null") run.state = "finished";
    else if (call.mode === "accept") {
      run.state = "accepted";
      run.heardAt = m.now;
    } else if (call.mode === "refuse") run.state = "failed";
    else run.state = m.now - run.stagedAt > GIVE_UP_MS ? "failed" : "retrying";
  }
}

/** The key's alarm fires now (as the runtime does at, or after, the time it was set for). */
export async function alarmStep(m: Model, r: Real, key: number, label: string): Promise<void> {
  await step(
    m,
    r,
    label,
    async () => {
      const spec = m.keys[key]!;
      const due = m.dueAtAlarm(key).map((session) => ({
        session,
        reasons: m.policyEndsAllowed(session).length > 0 ? m.policyEndsAllowed(session) : ["orphan_reap"],
      }));
      const newest = m.newest(key);
      const deadline = newest ? m.deadline(newest) : null;
      const mustNotice = !!newest?.unnoticed && m.entry[key] && deadline !== null && m.now >= deadline;
      const calls = r.services.agentCalls.length;
      const fired = await fireAlarm(spec.key);
      if (!fired && due.length > 0) fail("invariant 6", `${spec.key}: no alarm set, ${due[0]!.session.id} is due`);
      applyHandOffs(m, r, calls);
      if (mustNotice) noticed(newest);
      // verify() adopts what the policy was allowed to do; what it had to do is checked after.
      await verify(m, r.services, r.seen, [key]);
      checkWaitingAfterAlarm(m, key, fired);
      for (const { session, reasons } of due) {
        if (session.endReason === null || (isRecoverable(session.endReason) && !reasons.includes("orphan_reap")))
          fail(
            "invariant 6 (alarm expiry)",
            `${session.id} is still ${session.endReason ?? "live"} after the alarm; due: ${reasons}`,
          );
      }
      if (m.pendingReplies[key]!.length > 0)
        fail(
          "reply delivery",
          `${spec.key}: replies recorded but not delivered: ${JSON.stringify(m.pendingReplies[key])}`,
        );
      if (fired && m.pendingAnswers[key]!.length > 0)
        fail("command answer", `${spec.key}: commands not answered: ${m.pendingAnswers[key]}`);
    },
    null,
  );
}

class Alarm implements Cmd {
  constructor(readonly key: number) {}
  check = () => true;
  run = (m: Model, r: Real) => alarmStep(m, r, this.key, this.toString());
  toString = () => `Alarm(${this.key})`;
}

// ------------------------------------------------------------------ out of band and operator

/** An operator ends the live row by SQL, with any reason, with or without ended_at. */
class SqlEnd implements Cmd {
  constructor(
    readonly key: number,
    readonly reason: string,
    readonly withEndedAt: boolean,
  ) {}
  check = (m: Readonly<Model>) => (m as Model).newest(this.key)?.endReason === null;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const row = m.newest(this.key)!;
        const changed = await sqlEnd(row.id, this.reason, this.withEndedAt ? m.now : null);
        if (changed !== 1) fail("model", `SQL end of ${row.id} changed ${changed} rows`);
        m.end(row, this.reason, true);
      },
      [this.key],
    );
  }
  toString = () => `SqlEnd(${this.key}, ${this.reason}${this.withEndedAt ? "" : ", no ended_at"})`;
}

class Forget implements Cmd {
  constructor(readonly key: number) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const answer = await admin(`/admin/routes/${encodeURIComponent(m.keys[this.key]!.key)}`, { method: "DELETE" });
        expectStatus("DELETE routes", answer, 200);
        m.entry[this.key] = false;
      },
      [this.key],
    );
  }
  toString = () => `Forget(${this.key})`;
}

class AdminEnd implements Cmd {
  constructor(
    readonly key: number,
    readonly reason: string,
  ) {}
  check = (m: Readonly<Model>) => (m as Model).newest(this.key) !== null;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        const row = m.newest(this.key)!;
        const answer = await admin(`/admin/sessions/${row.id}/end`, {
          method: "POST",
          body: JSON.stringify({ reason: this.reason }),
        });
        expectStatus("operator end", answer, 200);
        const live = row.endReason === null;
        if (answer.body.changed !== live)
          fail("invariant 4", `operator end of ${row.id} changed=${answer.body.changed}`);
        if (live) m.end(row, this.reason);
      },
      [this.key],
    );
  }
  toString = () => `AdminEnd(${this.key}, ${this.reason})`;
}

// ------------------------------------------------------------------ the agent

class AgentMode_ implements Cmd {
  constructor(readonly mode: AgentMode) {}
  check = () => true;
  async run(m: Model, r: Real) {
    await step(
      m,
      r,
      this.toString(),
      async () => {
        m.agentMode = this.mode;
        r.services.mode = this.mode;
      },
      null,
    );
  }
  toString = () => `AgentMode(${this.mode})`;
}

function handedRuns(m: Model): MRun[] {
  return [...m.runs.values()].filter((run) => run.token !== null);
}

abstract class RunCommand implements Cmd {
  constructor(readonly pick: number) {}
  protected run_(m: Model): MRun {
    const runs = handedRuns(m);
    return runs[this.pick % runs.length]!;
  }
  check = (m: Readonly<Model>) => handedRuns(m as Model).length > 0;
  abstract run(m: Model, r: Real): Promise<void>;
}

/** Is the run its session's current run (spec invariant 8), whatever its reply? */
const isCurrent = (session: MSession, run: MRun) => session.currentRun === run && run.state !== "revoked";

class AgentEnd extends RunCommand {
  constructor(
    pick: number,
    readonly newest: boolean,
    readonly reason: string | null,
  ) {
    super(pick);
  }
  async run(m: Model, r: Real) {
    const run = this.run_(m);
    await step(
      m,
      r,
      `${this} by run of ${run.eventId}`,
      async () => {
        const own = m.sessions.get(run.sessionId)!;
        const target = this.newest ? m.newest(own.key)! : own;
        const answer = await agentApi(
          `/v1/sessions/${target.id}/end`,
          run.token!,
          this.reason ? { reason: this.reason } : {},
        );
        if (target.endReason !== null) {
          const ok = answer.status === 200 && answer.body.changed === false;
          if (!ok && !(target !== own && answer.status === 409))
            fail("agent end", `end of ended ${target.id}: ${answer.status} ${JSON.stringify(answer.body)}`);
          return;
        }
        if (isCurrent(target, run)) {
          expectStatus("invariant 8 (agent end by current run)", answer, 200);
          if (answer.body.changed !== true) fail("agent end", `current run's end changed nothing`);
          m.end(target, this.reason ?? "agent_close");
        } else {
          expectStatus("invariant 8 (agent end by stale run)", answer, 409);
          if (answer.body.owns !== false) fail("invariant 8", `409 without owns: false`);
        }
      },
      [run.key],
    );
  }
  toString = () => `AgentEnd(${this.pick}, ${this.newest ? "newest" : "own"}, ${this.reason ?? "default"})`;
}

class Rotate extends RunCommand {
  constructor(
    pick: number,
    readonly newest: boolean,
  ) {
    super(pick);
  }
  async run(m: Model, r: Real) {
    const run = this.run_(m);
    await step(
      m,
      r,
      `${this} by run of ${run.eventId}`,
      async () => {
        const own = m.sessions.get(run.sessionId)!;
        const target = this.newest ? m.newest(own.key)! : own;
        const answer = await agentApi(`/v1/sessions/${target.id}/rotate`, run.token!, { reason: "compression" });
        if (target.endReason !== null || !isCurrent(target, run)) {
          expectStatus("invariant 8 (rotate by stale run)", answer, 409);
          return;
        }
        expectStatus("invariant 8 (rotate by current run)", answer, 200);
        const id = answer.body.session_id as string;
        const row = await sessionRow(id);
        if (!row || m.sessions.has(id)) fail("rotation", `continuation ${id} not fresh in D1`);
        // The continuation takes the conversation on: last activity, notice, current and unfinished runs.
        target.endReason = "compression";
        target.ends.push({ reason: "compression", bySql: false, at: m.now });
        const continuation = m.addSession(target.key, id, row.started_at, {
          parentId: target.id,
          lastActiveAt: target.lastActiveAt,
          noticeOwed: target.noticeOwed,
          currentRun: target.currentRun,
          staged: target.staged,
        });
        target.noticeOwed = null;
        for (const moved of m.runsOf(target)) {
          if (moved === target.currentRun || !["finished", "failed", "revoked"].includes(moved.state))
            moved.sessionId = continuation.id;
        }
        m.entry[target.key] = true;
      },
      [run.key],
    );
  }
  toString = () => `Rotate(${this.pick}, ${this.newest ? "newest" : "own"})`;
}

/** The reason a heartbeat must give, or "owns", or a list when the spec allows either. */
function ownership(m: Model, run: MRun): string[] {
  const session = m.sessions.get(run.sessionId)!;
  if (run.state === "revoked") return [run.revokedReason ?? "session_ended"];
  // A run a newer one took the place of, in a session that then ended: either reason is true.
  if (session.endReason !== null && session.currentRun !== run && run.revokedReason === null)
    return [revocation(session.endReason), "superseded"];
  if (session.endReason !== null) return [run.revokedReason ?? revocation(session.endReason)];
  if (session.currentRun !== run) return ["superseded"];
  if (run.state === "finished") return ["finished"];
  if (run.state === "failed") return ["owns", "finished", "session_ended"];
  const expired = m.expiry(session).length > 0;
  if (run.state === "accepted" && expired && run.heardAt! + 10 * 60_000 <= m.now) return ["owns", "session_ended"];
  if (run.state === "retrying" && expired) return ["owns", "session_ended"];
  return ["owns"];
}
const revocation = (reason: string) =>
  reason === "new_command" ? "superseded" : reason === "suspended" ? "stopped" : "session_ended";

class Heartbeat extends RunCommand {
  async run(m: Model, r: Real) {
    const run = this.run_(m);
    await step(
      m,
      r,
      `${this} of ${run.eventId}`,
      async () => {
        const allowed = ownership(m, run);
        const answer = await agentApi(`/v1/runs/${run.runId}/heartbeat`, run.token!, {});
        const got = answer.status === 200 && answer.body.owns === true ? "owns" : answer.body?.reason;
        if (!allowed.includes(got) || (got !== "owns" && answer.status !== 409))
          fail(
            "invariant 8 (heartbeat)",
            `run of ${run.eventId}: ${answer.status} ${JSON.stringify(answer.body)}, allowed ${allowed}`,
          );
        if (got === "owns" && run.state === "accepted") run.heardAt = m.now;
      },
      [run.key],
    );
  }
  toString = () => `Heartbeat(${this.pick})`;
}

/** A run answers later through the API (after a 202, or while its hand-off is retried). */
class LateReply extends RunCommand {
  async run(m: Model, r: Real) {
    const run = this.run_(m);
    await step(
      m,
      r,
      `${this} of ${run.eventId}`,
      async () => {
        const session = m.sessions.get(run.sessionId)!;
        const text = `late:${run.eventId}`;
        const answer = await agentApi(`/v1/runs/${run.runId}/reply`, run.token!, { text });
        if (run.state === "revoked" || run.state === "finished" || session.endReason !== null) {
          expectStatus("run reply (not owned)", answer, 409);
          return;
        }
        const expired = m.expiry(session).length > 0;
        // Past the deadline the reply lands only while the turn still holds the session
        // (invariant 6: a hand-off in the outbox, or the current run within its lease).
        const held = m.held(session);
        const refused = expired && (held === false || (held === "unknown" && answer.status === 409));
        if (refused) {
          expectStatus("run reply past the deadline", answer, 409);
          run.state = "finished";
          const d1 = await sessionRow(session.id);
          if (!d1?.end_reason || !m.expiry(session).includes(d1.end_reason))
            fail("invariant 3", `a late reply found ${session.id} expired but left it ${d1?.end_reason}`);
          m.end(session, d1.end_reason);
          return;
        }
        expectStatus("run reply", answer, 200);
        m.recordReply(run, text);
      },
      [run.key],
    );
  }
  toString = () => `LateReply(${this.pick})`;
}

// ------------------------------------------------------------------ arbitraries

const key = fc.integer({ min: 0, max: 3 });
const ADVANCES = [
  1,
  999,
  1_000,
  30_000,
  61_000,
  5 * 60_000,
  29 * 60_000,
  61 * 60_000,
  3 * 3_600_000,
  7 * 3_600_000,
  13 * 3_600_000,
  25 * 3_600_000,
];

export const commandArbitraries: fc.Arbitrary<Cmd>[] = [
  fc.tuple(key, fc.constantFrom("hello", "how are you", "/newish", "ok")).map(([k, t]) => new Send(k, t)),
  fc.tuple(key, fc.constantFrom("hello", "more")).map(([k, t]) => new Send(k, t)),
  fc.tuple(key, fc.integer({ min: 2, max: 4 }), fc.boolean()).map(([k, n, d]) => new Burst(k, n, d)),
  fc.nat().map((i) => new Retry(i)),
  fc
    .tuple(key, fc.constantFrom("/new", "/reset", "/stop", "/new please", "/STOP" as const))
    .map(([k, t]) => new Command(k, t)),
  fc.constantFrom(...ADVANCES).map((ms) => new Advance(ms)),
  fc.constantFrom(...ADVANCES).map((ms) => new Advance(ms)),
  fc.tuple(key, fc.constantFrom(-1 as const, 0 as const, 1 as const)).map(([k, o]) => new ToDeadline(k, o)),
  key.map((k) => new Alarm(k)),
  key.map((k) => new Alarm(k)),
  key.map((k) => new Alarm(k)),
  fc.tuple(key, fc.constantFrom(...END_REASONS), fc.boolean()).map(([k, reason, at]) => new SqlEnd(k, reason, at)),
  key.map((k) => new Forget(k)),
  fc
    .tuple(key, fc.constantFrom(...END_REASONS.filter((reason) => reason !== "compression")))
    .map(([k, reason]) => new AdminEnd(k, reason)),
  fc.constantFrom<AgentMode>("reply", "accept", "down", "null", "refuse").map((mode) => new AgentMode_(mode)),
  fc.constantFrom<AgentMode>("reply", "accept", "down").map((mode) => new AgentMode_(mode)),
  fc
    .tuple(fc.nat(), fc.boolean(), fc.constantFrom(null, "agent_close", "orphan_reap", "admin", "idle"))
    .map(([i, n, reason]) => new AgentEnd(i, n, reason)),
  fc.tuple(fc.nat(), fc.boolean()).map(([i, n]) => new Rotate(i, n)),
  fc.nat().map((i) => new Heartbeat(i)),
  fc.nat().map((i) => new LateReply(i)),
];
