/**
 * The routing object's outbox: due work written to the object's own table before
 * the D1 call that makes it owed leaves the object, then drained. This unit owns
 * the table and every transition of an item:
 *
 *   stage ─▶ drain ─▶ handler ─┬─▶ complete            (done, or no longer owed)
 *                              ├─▶ retry               (attempt counted, backoff)
 *                              ├─▶ checkpoint          (progress kept: a new payload or due time)
 *                              └─▶ dead letter         (givesUp: the handler records it, then completes)
 *
 * Handlers are registered by kind in a typed map; a handler that throws leaves its
 * item with the attempt counted (retry), and never fails the other items.
 */
import { now as clockNow } from "../clock";
import { backoffDelay } from "../http/backoff";
import { describe } from "../http/outbound";
import { log } from "../log";
import { INLINE_GRACE_MS } from "./alarm";
import { OutboxTable, type AnyOutboxItem, type OutboxItem, type OutboxKind, type OutboxPayloads } from "./outbox-table";

/** How long one drain keeps picking up newly due outbox items while others are in flight. */
export const DRAIN_WINDOW_MS = 60_000;
/** Hand-offs are retried for a day; after that the run is marked failed. */
export const RUN_GIVE_UP_MS = 24 * 60 * 60_000;
/** Platform deliveries are retried this many times before they are marked failed. */
export const DELIVERY_MAX_ATTEMPTS = 10;

/**
 * Whether a failed attempt of this item is its last (the handler then dead-letters
 * it: records the failure for the operator, and completes it). Hand-offs give up by
 * age, deliveries by attempts; events and checks keep their own schedule.
 */
export function givesUp(item: Pick<AnyOutboxItem, "kind" | "attempts" | "createdAt">, now: number): boolean {
  if (item.kind === "run") return now - item.createdAt > RUN_GIVE_UP_MS;
  if (item.kind === "delivery") return item.attempts + 1 >= DELIVERY_MAX_ATTEMPTS;
  return false;
}

/** One handler per kind of item. */
export type OutboxHandlers = { [K in OutboxKind]: (item: OutboxItem<K>, now: number) => Promise<void> };

function handle<K extends OutboxKind>(handlers: OutboxHandlers, item: OutboxItem<K>, now: number): Promise<void> {
  const handler: (item: OutboxItem<K>, now: number) => Promise<void> = handlers[item.kind];
  return handler(item, now);
}

export interface OutboxDeps {
  sql: SqlStorage;
  /** `inline`: drain in the background of the request that staged; `alarm`: only in the alarm. */
  mode: () => "inline" | "alarm";
  /** Brings the alarm forward to `at` (AlarmPlan.armBy). */
  armBy: (at: number, now: number) => void;
  /** Keeps the object alive for a background drain (ctx.waitUntil). */
  waitUntil: (work: Promise<unknown>) => void;
  /** Runs when a drain ends (the object re-arms its alarm to the exact next due time). */
  afterDrain: () => Promise<void>;
}

export class Outbox {
  readonly table: OutboxTable;
  private handlers: OutboxHandlers | null = null;
  /** The drain running now, if any (in the background of a request, or in the alarm). */
  private activeDrain: Promise<void> | null = null;
  /** Wakes the running drain so newly staged work starts without waiting. */
  private wakeDrain: (() => void) | null = null;
  /** A wake came while the drain was between looks: it looks again before waiting. */
  private wakeMissed = false;

  constructor(private readonly deps: OutboxDeps) {
    this.table = new OutboxTable(deps.sql);
  }

  /** Registers the handlers (once, when the object wires its flows). */
  register(handlers: OutboxHandlers): void {
    this.handlers = handlers;
  }

  /** Whether a drain is running now. */
  get draining(): boolean {
    return this.activeDrain !== null;
  }

  get<K extends OutboxKind>(id: string, kind: K): OutboxItem<K> | null {
    const item = this.table.get(id);
    return item && isKind(item, kind) ? item : null;
  }

  has(id: string): boolean {
    return this.table.get(id) !== null;
  }

  /** The items of one kind, oldest due first. */
  all<K extends OutboxKind>(kind: K): OutboxItem<K>[] {
    return this.table.all().filter((item): item is OutboxItem<K> & AnyOutboxItem => isKind(item, kind));
  }

  /**
   * Whether a hand-off of the session is staged (other than `exceptId`: a message's
   * own, staged just before its batch). D1 names no current run until a hand-off goes
   * out, so an entry rebuilt from D1 asks this too, lest a session it rebuilds be given
   * a second first run (a hand-off orphaned by a kill counts until confirming drops it).
   */
  hasRunOf(sessionId: string, exceptId: string | null = null): boolean {
    return this.table.hasRunOf(sessionId, exceptId);
  }

  nextDueAt(): number | null {
    return this.table.nextDueAt();
  }

  /**
   * Writes one item and makes sure the alarm comes by its due time. Both writes are
   * issued together, so on the ingress path they share one commit before the D1 call
   * leaves the object, and nothing is left to write after it. `replace`: an item with
   * this id is overwritten (staging again brings it forward).
   */
  stage<K extends OutboxKind>(id: string, kind: K, payload: OutboxPayloads[K], dueAt: number, replace = false): void {
    const now = clockNow();
    const item: OutboxItem<K> = { id, kind, payload, dueAt, attempts: 0, lastError: null, createdAt: now };
    if (replace) this.table.put(item);
    else this.table.add(item);
    // Staged again while it runs (a session's events item, a new event written meanwhile):
    // the run in flight completing it must not delete this staging.
    if (this.inFlight.has(id)) this.restaged.add(id);
    if (this.deps.mode() === "inline") {
      this.deps.armBy(dueAt + INLINE_GRACE_MS, now);
      this.kick();
    } else {
      this.deps.armBy(dueAt, now);
      this.wake();
    }
  }

  /** Removes a staged item whose D1 write failed or found it not owed (a duplicate). */
  unstage(id: string): void {
    this.table.delete(id);
  }

  /** The item is done (or no longer owed): it leaves the outbox, unless it was staged again meanwhile. */
  complete(id: string): void {
    if (this.restaged.delete(id)) return;
    this.table.delete(id);
  }

  /** Items a drain is running now, and those of them staged again since they started. */
  private readonly inFlight = new Set<string>();
  private readonly restaged = new Set<string>();

  /** Keeps an item's progress: a new payload, or a new due time (its attempts unchanged). */
  checkpoint<K extends OutboxKind>(item: OutboxItem<K>, patch: { payload?: OutboxPayloads[K]; dueAt?: number }): void {
    const next = { ...item, ...patch };
    // Staged again while it ran: that staging's due time stands if it is sooner.
    const staged = this.restaged.has(item.id) ? this.table.get(item.id) : null;
    if (staged && staged.dueAt < next.dueAt) next.dueAt = staged.dueAt;
    this.table.put(next);
  }

  /** A failed attempt: counted, with its error, and due again after its backoff. */
  retry(item: AnyOutboxItem, error: string, retryAfterMs: number | null, now: number): void {
    const attempts = item.attempts + 1;
    const current = this.table.get(item.id);
    if (!current) return;
    this.table.put({ ...current, attempts, lastError: error, dueAt: now + backoffDelay(attempts, retryAfterMs) });
  }

  /** Starts draining in the background, or wakes the drain already running. */
  kick(): void {
    if (this.activeDrain) this.wake();
    else this.deps.waitUntil(this.run());
  }

  /**
   * Wakes the running drain. Between two looks for due work (a handler's first steps
   * run inside the loop) nothing waits to be woken yet: the drain is told to look
   * again before it waits.
   */
  private wake(): void {
    if (this.wakeDrain) this.wakeDrain();
    else this.wakeMissed = true;
  }

  /**
   * One drain at a time: a caller while one runs wakes it and waits for it. When it
   * ends, `afterDrain` runs (the alarm is set to the exact next due time).
   */
  run(): Promise<void> {
    if (this.activeDrain) {
      this.wake();
      return this.activeDrain;
    }
    this.activeDrain = (async () => {
      try {
        // Yield once first, so that activeDrain is set before any handler runs: a
        // handler staging work before its first await then wakes this drain (wake)
        // rather than starting a second one beside it (which would run its item again).
        await Promise.resolve();
        await this.drain();
      } finally {
        this.activeDrain = null;
        await this.deps
          .afterDrain()
          .catch((error) => log.error("could not re-arm after draining", { error: describe(error) }));
      }
    })();
    return this.activeDrain;
  }

  /** Resolves once no drain is running. */
  async drained(): Promise<void> {
    while (this.activeDrain) await this.activeDrain.catch(() => undefined);
  }

  /**
   * Runs due items concurrently; a failing item records its attempt and never fails
   * the others. While items are in flight (a slow agent), items that become due (a
   * new message staged by `route`, which wakes this loop) start at once instead of
   * waiting for the next alarm. New items stop being picked up after DRAIN_WINDOW_MS
   * so that one alarm never runs for ever.
   */
  private async drain(): Promise<void> {
    const handlers = this.handlers;
    if (!handlers) throw new Error("outbox handlers not registered");
    const started = clockNow();
    const running = new Map<string, { kind: OutboxKind; done: Promise<void> }>();
    try {
      for (;;) {
        this.wakeMissed = false;
        const now = clockNow();
        if (now - started < DRAIN_WINDOW_MS) {
          for (const item of this.table.due(now)) {
            if (running.has(item.id)) continue;
            // Lifecycle events go out one session at a time, in the order they were
            // staged (an old session's end before its replacement's start).
            if (item.kind === "events" && [...running.values()].some((r) => r.kind === "events")) continue;
            this.inFlight.add(item.id);
            const done = handle(handlers, item, now)
              .catch((error) => {
                log.error("outbox item failed", { kind: item.kind, item_id: item.id, error: describe(error) });
                this.retry(item, describe(error), null, now);
              })
              .finally(() => {
                running.delete(item.id);
                this.inFlight.delete(item.id);
                this.restaged.delete(item.id);
              });
            running.set(item.id, { kind: item.kind, done });
          }
        }
        if (running.size === 0) return;
        if (this.wakeMissed) continue;
        const woken = new Promise<void>((resolve) => (this.wakeDrain = resolve));
        await Promise.race([woken, ...[...running.values()].map((r) => r.done)]);
        this.wakeDrain = null;
      }
    } finally {
      // Should the drain fail (storage could not reschedule an item), it ends only
      // when its items in flight have: the next drain must not start them again.
      await Promise.allSettled([...running.values()].map((r) => r.done));
    }
  }
}

function isKind<K extends OutboxKind>(item: AnyOutboxItem, kind: K): item is OutboxItem<K> & AnyOutboxItem {
  return item.kind === kind;
}
