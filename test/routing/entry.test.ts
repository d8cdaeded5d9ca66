/**
 * The routing entry and the live deadline: one owner (EntryState), stored in the
 * object's own table so it survives eviction; the deadline in memory only.
 */
import { runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import type { SessionRow } from "../../src/db/schema";
import type { NewSession } from "../../src/db/sessions";
import { DEFAULT_POLICY, deadline } from "../../src/domain/reset-policy";
import { EntryState, entryFromNew, entryFromRow, type Entry } from "../../src/routing/entry";
import { MINUTE, T0, router, unique } from "../helpers";

function entryOf(sessionId: string): Entry {
  return {
    sessionKey: "generic:dm:entry",
    platform: "generic",
    chatType: "dm",
    sessionId,
    parentId: null,
    reset: null,
    firstRunPending: true,
    noticeOwed: false,
  };
}

/** Runs `test` with the entry table of a fresh routing object. */
function withSql(test: (sql: SqlStorage) => void | Promise<void>): Promise<void> {
  return runInDurableObject(router(unique("entry-key")), (_instance, state) => test(state.storage.sql));
}

describe("EntryState", () => {
  it("has no entry and an unknown deadline on a new key", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      expect(state.entry).toBeNull();
      expect(state.liveDeadline).toBeUndefined();
    }));

  it("keeps an adopted entry across a wake; the deadline is unknown again after it", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      state.adopt(entryOf("ses_a"));
      state.setDeadline(T0);
      const woken = new EntryState(sql);
      expect(woken.entry).toEqual(entryOf("ses_a"));
      expect(woken.liveDeadline).toBeUndefined();
    }));

  it("update changes flags and stores them; it is a no-op without an entry", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      state.update({ firstRunPending: false });
      expect(state.entry).toBeNull();
      state.adopt(entryOf("ses_b"));
      state.update({ firstRunPending: false, noticeOwed: true });
      expect(new EntryState(sql).entry).toMatchObject({ sessionId: "ses_b", firstRunPending: false, noticeOwed: true });
    }));

  it("markActive moves the deadline to the policy's deadline from now", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      const policy = { ...DEFAULT_POLICY, mode: "idle" as const, idleMinutes: 30 };
      state.markActive(policy, T0);
      expect(state.liveDeadline).toBe(deadline(policy, T0));
      expect(state.liveDeadline).toBe(T0 + 30 * MINUTE + 1);
    }));

  it("learns a next look only for the entry's own session", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      state.adopt(entryOf("ses_live"));
      state.setDeadline(T0);
      state.learnt("ses_other", T0 + 5);
      expect(state.liveDeadline).toBe(T0);
      state.learnt("ses_live", T0 + 9);
      expect(state.liveDeadline).toBe(T0 + 9);
      expect(state.isLive("ses_live")).toBe(true);
      expect(state.isLive("ses_other")).toBe(false);
    }));

  it("forget drops the stored entry and the deadline", () =>
    withSql((sql) => {
      const state = new EntryState(sql);
      state.adopt(entryOf("ses_c"));
      state.setDeadline(T0);
      state.forget();
      expect(state.entry).toBeNull();
      expect(state.liveDeadline).toBeNull();
      expect(new EntryState(sql).entry).toBeNull();
    }));
});

describe("entry builders", () => {
  it("entryFromNew carries the replaced session as reset context and owes its first run", () => {
    const session: NewSession = {
      id: "ses_new",
      sessionKey: "generic:dm:x",
      platform: "generic",
      chatType: "dm",
      startedAt: T0,
      parentSessionId: null,
      replaced: null,
      noticePending: "idle",
      sweepAt: null,
    };
    expect(entryFromNew(session, session, { sessionId: "ses_old", reason: "idle", hadActivity: true })).toEqual({
      sessionKey: "generic:dm:x",
      platform: "generic",
      chatType: "dm",
      sessionId: "ses_new",
      parentId: null,
      reset: { reason: "idle", had_activity: true, previous_session_id: "ses_old" },
      firstRunPending: true,
      noticeOwed: true,
    });
    expect(entryFromNew({ ...session, noticePending: null }, session, null, false)).toMatchObject({
      reset: null,
      firstRunPending: false,
      noticeOwed: false,
    });
  });

  it("entryFromRow reads the reset context and whether a run has happened from the row", () => {
    const row = {
      id: "ses_row",
      platform: "generic",
      chatType: "group",
      parentSessionId: "ses_parent",
      previousSessionId: "ses_prev",
      resetReason: "daily",
      resetHadActivity: 0,
      currentRunId: "run_1",
      noticePending: null,
    } as unknown as SessionRow;
    expect(entryFromRow(row, { sessionKey: "generic:group:g:u" }, false)).toEqual({
      sessionKey: "generic:group:g:u",
      platform: "generic",
      chatType: "group",
      sessionId: "ses_row",
      parentId: "ses_parent",
      reset: { reason: "daily", had_activity: false, previous_session_id: "ses_prev" },
      firstRunPending: false,
      noticeOwed: false,
    });
    // No run in D1: the first run is still owed, unless its hand-off waits in the outbox.
    const noRun = { ...row, currentRunId: null } as SessionRow;
    expect(entryFromRow(noRun, { sessionKey: "k" }, false).firstRunPending).toBe(true);
    expect(entryFromRow(noRun, { sessionKey: "k" }, true).firstRunPending).toBe(false);
  });
});
