/**
 * The routing object's one alarm, planned here and set only here. It serves
 * several sources (the next due outbox item, the live session's deadline, the
 * backoff after failing to read that session, waiting messages, the next typing
 * call), and is set to the earliest.
 */
import { backoffDelay } from "../http/backoff";
import { describe } from "../http/outbound";
import { log } from "../log";

/**
 * With OUTBOX_DRAIN=inline (the default), staged work is drained at once, in the
 * background of the request that staged it; the alarm comes this much later as the
 * safety net (should the object be evicted before it finished), so a busy key costs
 * an alarm per burst, not per message.
 */
export const INLINE_GRACE_MS = 10_000;

/** What the alarm is for, at one instant. */
export interface AlarmSources {
  now: number;
  /** The earliest due time in the outbox (null: it is empty). */
  nextDueAt: number | null;
  /** A drain is running: it takes what is due, so the alarm is only its safety net. */
  draining: boolean;
  /** The live session's deadline (null: none; undefined: unknown, D1 could not be read). */
  liveDeadline: number | null | undefined;
  /** The key has a routing entry (so an unknown deadline is worth a look). */
  hasEntry: boolean;
  /** When waiting messages are due for their run (an interrupt to carry out); null: none. */
  waitingDueAt?: number | null;
  /** When the next typing call is due (a run unfinished that owns its session); null: none. */
  typingDueAt?: number | null;
  /** Consecutive failures to read the live session, for the backoff of the next look. */
  settleFailures: number;
}

/**
 * When the alarm should fire next (null: not at all). Each source is here because
 * of what would break without it.
 */
export function nextAlarmAt(s: AlarmSources): number | null {
  const due: number[] = [];
  // Due work (hand-offs, replies, events): without it a staged item waits for the sweep.
  // While a drain runs it picks items up itself; the alarm then comes only as the
  // safety net, should the object be evicted mid-drain.
  if (s.nextDueAt !== null) due.push(s.draining ? Math.max(s.nextDueAt, s.now + INLINE_GRACE_MS) : s.nextDueAt);
  // The live deadline (spec: the alarm no later than it): without it an idle session never ends.
  if (s.liveDeadline !== undefined && s.liveDeadline !== null) due.push(s.liveDeadline);
  // An unknown deadline (D1 could not be read): look again soon, backing off, or the
  // session would never end if D1 was down when the alarm fired.
  else if (s.liveDeadline === undefined && s.hasEntry) due.push(s.now + backoffDelay(s.settleFailures + 1));
  // Waiting messages due (an interrupt, a window's or a lease's end, nothing holding them):
  // without it they wait for the next message. While the alarm's passes fail (D1 down)
  // it backs off with them, or a due time in the past would fire it again at once.
  if (s.waitingDueAt !== undefined && s.waitingDueAt !== null)
    due.push(
      s.settleFailures === 0 ? s.waitingDueAt : Math.max(s.waitingDueAt, s.now + backoffDelay(s.settleFailures)),
    );
  // Typing (spec "Typing"): without it Telegram's indicator fades after 5 s while the agent still works.
  if (s.typingDueAt !== undefined && s.typingDueAt !== null) due.push(s.typingDueAt);
  if (due.length === 0) return null;
  // An alarm set for "now" from inside alarm() is dropped by the local runtime.
  return Math.max(Math.min(...due), s.now + 1);
}

/** The alarm as set, and the only code that sets or deletes it. */
export class AlarmPlan {
  /** The alarm as last set (undefined until read after a wake). */
  private alarmAt: number | null | undefined = undefined;
  /** Consecutive failures to read the live session in the alarm, for its own backoff. */
  private settleFailures = 0;

  constructor(
    private readonly storage: DurableObjectStorage,
    /** Reads the sources other than the failures count (the outbox and the entry own them). */
    private readonly sources: (now: number) => Omit<AlarmSources, "now" | "settleFailures">,
  ) {}

  /** Reads the alarm as stored (on wake; storage only, so safe in blockConcurrencyWhile). */
  async load(): Promise<void> {
    this.alarmAt = await this.storage.getAlarm();
  }

  /** The alarm as stored now (operator reads). */
  stored(): Promise<number | null> {
    return this.storage.getAlarm();
  }

  /** The alarm fired: it is no longer set. */
  fired(): void {
    this.alarmAt = null;
  }

  /** The live session could not be read: back off further. */
  settleFailed(): void {
    this.settleFailures += 1;
  }

  /** The live session was read. */
  settled(): void {
    this.settleFailures = 0;
  }

  /**
   * Brings the alarm forward to `at` if it is not already due by then; never pushes
   * it back. Not awaited, so on the ingress path it shares the commit of the outbox
   * write that asked for it, before the D1 call leaves the object.
   */
  armBy(at: number, now: number): void {
    // An alarm set for "now" from inside alarm() is dropped by the local runtime.
    const target = Math.max(at, now + 1);
    if (this.alarmAt !== null && this.alarmAt !== undefined && this.alarmAt <= target) return;
    this.alarmAt = target;
    this.storage.setAlarm(target).catch((error) => log.error("could not set the alarm", { error: describe(error) }));
  }

  /**
   * Sets the alarm to the earliest source (nextAlarmAt). An alarm already set earlier
   * is left alone (it fires, finds little to do, and re-arms), so a busy key does not
   * rewrite its alarm on every message.
   */
  async rearm(now: number): Promise<void> {
    if (this.alarmAt === undefined) this.alarmAt = await this.storage.getAlarm();
    const at = nextAlarmAt({ now, settleFailures: this.settleFailures, ...this.sources(now) });
    if (at === null) {
      if (this.alarmAt !== null) await this.storage.deleteAlarm();
      this.alarmAt = null;
      return;
    }
    if (this.alarmAt === null || this.alarmAt === undefined || this.alarmAt > at) {
      await this.storage.setAlarm(at);
      this.alarmAt = at;
    }
  }
}
