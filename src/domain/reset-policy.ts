/**
 * The reset policy (spec "Reset policy"): parsing of `SESSION_RESET`, the
 * per-platform and per-chat-type overrides, and the three questions every path
 * asks: is a session expired at t, why, and when is its deadline.
 *
 * All three derive from one function, `liveSince(policy, now)`: a session is live
 * at `now` exactly when its last activity is at or after that instant. That same
 * threshold guards the one-batch append in D1, so the database itself refuses a
 * message for a session that expired a moment ago.
 */
import * as z from "zod";
import { PLATFORMS, type ChatType } from "./session-key";
import type { PolicyReason } from "./end-reasons";
import { addDays, isValidTimeZone, localDate, zonedInstant } from "./zoned-time";

export const RESET_MODES = ["none", "idle", "daily", "both"] as const;
export type ResetMode = (typeof RESET_MODES)[number];

const policyFields = {
  mode: z.enum(RESET_MODES),
  idle_minutes: z.number().positive().finite(),
  at_hour: z.number().int().min(0).max(23),
  at_minute: z.number().int().min(0).max(59),
  timezone: z.string().refine(isValidTimeZone, { message: "not an IANA time zone" }),
};
const partialPolicy = z.strictObject(policyFields).partial();

/** The JSON shape of `SESSION_RESET`; every field optional. */
export const resetConfigSchema = partialPolicy.extend({
  // Only known platforms: a misspelt one would otherwise be a silent no-op.
  by_platform: z.partialRecord(z.enum(PLATFORMS), partialPolicy).optional(),
  by_chat_type: z.partialRecord(z.enum(["dm", "group", "channel"]), partialPolicy).optional(),
});
export type ResetConfig = z.infer<typeof resetConfigSchema>;
type PartialPolicy = z.infer<typeof partialPolicy>;

/** A fully resolved policy for one conversation. */
export interface ResetPolicy {
  mode: ResetMode;
  idleMinutes: number;
  atHour: number;
  atMinute: number;
  timeZone: string;
}

/** The spec's default: both, 1440 idle minutes, 04:00 UTC. */
export const DEFAULT_POLICY: ResetPolicy = {
  mode: "both",
  idleMinutes: 1440,
  atHour: 4,
  atMinute: 0,
  timeZone: "UTC",
};

function apply(base: ResetPolicy, override: PartialPolicy | undefined): ResetPolicy {
  if (!override) return base;
  return {
    mode: override.mode ?? base.mode,
    idleMinutes: override.idle_minutes ?? base.idleMinutes,
    atHour: override.at_hour ?? base.atHour,
    atMinute: override.at_minute ?? base.atMinute,
    timeZone: override.timezone ?? base.timeZone,
  };
}

/** The policy for a conversation: platform beats chat type beats the default. */
export function resolvePolicy(config: ResetConfig, platform: string, chatType: ChatType | string): ResetPolicy {
  const base = apply(DEFAULT_POLICY, config);
  const byChatType = apply(base, config.by_chat_type?.[chatType as ChatType]);
  return apply(byChatType, config.by_platform?.[platform as (typeof PLATFORMS)[number]]);
}

const usesIdle = (policy: ResetPolicy) => policy.mode === "idle" || policy.mode === "both";
const usesDaily = (policy: ResetPolicy) => policy.mode === "daily" || policy.mode === "both";

function boundaryOn(policy: ResetPolicy, date: ReturnType<typeof localDate>): number {
  return zonedInstant(date, policy.atHour, policy.atMinute, policy.timeZone);
}

function computeLastBoundary(policy: ResetPolicy, t: number): number {
  const today = localDate(t, policy.timeZone);
  const boundary = boundaryOn(policy, today);
  return boundary <= t ? boundary : boundaryOn(policy, addDays(today, -1));
}

function computeNextBoundary(policy: ResetPolicy, t: number): number {
  const today = localDate(t, policy.timeZone);
  const boundary = boundaryOn(policy, today);
  return boundary > t ? boundary : boundaryOn(policy, addDays(today, 1));
}

/**
 * The boundaries around `t`: [start, end) with start the most recent boundary at or
 * before `t` and end the next one. Every message asks, and the answer changes once
 * a day, so the last window per zone and wall time is kept (time zone arithmetic
 * through Intl costs tens of microseconds).
 */
const windows = new Map<string, { start: number; end: number }>();

function dailyWindow(policy: ResetPolicy, t: number): { start: number; end: number } {
  const key = `${policy.timeZone} ${policy.atHour}:${policy.atMinute}`;
  const cached = windows.get(key);
  if (cached && cached.start <= t && t < cached.end) return cached;
  const start = computeLastBoundary(policy, t);
  const window = { start, end: computeNextBoundary(policy, start) };
  if (windows.size >= 256) windows.clear();
  windows.set(key, window);
  return window;
}

/** The most recent daily boundary at or before `t`. */
export function lastBoundary(policy: ResetPolicy, t: number): number {
  return dailyWindow(policy, t).start;
}

/** The first daily boundary strictly after `t`. */
export function nextBoundary(policy: ResetPolicy, t: number): number {
  return dailyWindow(policy, t).end;
}

/**
 * The earliest last activity that is still live at `now`; -Infinity when the
 * policy never expires. idle: expired when now > last + idle, so live when
 * last >= now - idle. daily: expired when a boundary lies in (last, now], so live
 * when last >= the most recent boundary.
 */
export function liveSince(policy: ResetPolicy, now: number): number {
  let since = Number.NEGATIVE_INFINITY;
  if (usesIdle(policy)) since = Math.max(since, now - policy.idleMinutes * 60_000);
  if (usesDaily(policy)) since = Math.max(since, lastBoundary(policy, now));
  return since;
}

/** Is a session whose last activity was `lastActive` expired at `now`? */
export function isExpired(policy: ResetPolicy, lastActive: number, now: number): boolean {
  return lastActive < liveSince(policy, now);
}

function idleDeadline(policy: ResetPolicy, lastActive: number): number {
  // Expired when now > last + idle: the first whole millisecond past it.
  return Math.floor(lastActive + policy.idleMinutes * 60_000) + 1;
}

/** The earliest instant at which the session would be expired; null for mode none. */
export function deadline(policy: ResetPolicy, lastActive: number): number | null {
  const candidates: number[] = [];
  if (usesIdle(policy)) candidates.push(idleDeadline(policy, lastActive));
  if (usesDaily(policy)) candidates.push(nextBoundary(policy, lastActive));
  return candidates.length === 0 ? null : Math.min(...candidates);
}

/** Why the session is expired at `now` (whichever deadline came first), or null when it is live. */
export function expiryReason(policy: ResetPolicy, lastActive: number, now: number): PolicyReason | null {
  const idleAt = usesIdle(policy) ? idleDeadline(policy, lastActive) : Number.POSITIVE_INFINITY;
  const dailyAt = usesDaily(policy) ? nextBoundary(policy, lastActive) : Number.POSITIVE_INFINITY;
  if (Math.min(idleAt, dailyAt) > now) return null;
  return idleAt <= dailyAt ? "idle" : "daily";
}
