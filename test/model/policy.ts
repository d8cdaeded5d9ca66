/**
 * The reset policy as the spec words it, written again from the spec for the
 * model (it deliberately imports nothing from src/): platform beats chat type beats
 * the default; idle expires when now > last + idle; daily expires when the most
 * recent boundary lies after the last activity and at or before now; both:
 * whichever comes first. Time zones are fixed-offset ones (no DST), so the
 * arithmetic stays obviously right; DST is covered by test/domain/reset-policy.test.ts.
 */
export const ZONE_OFFSET_MINUTES = { UTC: 0, "Asia/Kolkata": 330, "Asia/Kathmandu": 345 } as const;
export type Zone = keyof typeof ZONE_OFFSET_MINUTES;
export type Mode = "none" | "idle" | "daily" | "both";
export type ChatType = "dm" | "group" | "channel";
export type PolicyReason = "idle" | "daily";

export interface PolicyFields {
  mode?: Mode;
  idle_minutes?: number;
  at_hour?: number;
  at_minute?: number;
  timezone?: Zone;
}

/** The JSON of `SESSION_RESET`. */
export interface ResetJson extends PolicyFields {
  by_platform?: Record<string, PolicyFields>;
  by_chat_type?: Partial<Record<ChatType, PolicyFields>>;
}

export interface Policy {
  mode: Mode;
  idleMinutes: number;
  atHour: number;
  atMinute: number;
  timezone: Zone;
}

export const DAY_MS = 86_400_000;
const DEFAULT: Policy = { mode: "both", idleMinutes: 1440, atHour: 4, atMinute: 0, timezone: "UTC" };

function layer(base: Policy, over: PolicyFields | undefined): Policy {
  if (!over) return base;
  return {
    mode: over.mode ?? base.mode,
    idleMinutes: over.idle_minutes ?? base.idleMinutes,
    atHour: over.at_hour ?? base.atHour,
    atMinute: over.at_minute ?? base.atMinute,
    timezone: over.timezone ?? base.timezone,
  };
}

export function policyFor(config: ResetJson, platform: string, chatType: ChatType): Policy {
  return layer(layer(layer(DEFAULT, config), config.by_chat_type?.[chatType]), config.by_platform?.[platform]);
}

const usesIdle = (p: Policy) => p.mode === "idle" || p.mode === "both";
const usesDaily = (p: Policy) => p.mode === "daily" || p.mode === "both";

/** The most recent at_hour:at_minute in the policy's zone at or before `t`. */
export function lastBoundary(p: Policy, t: number): number {
  const offset = ZONE_OFFSET_MINUTES[p.timezone] * 60_000;
  const localMidnight = Math.floor((t + offset) / DAY_MS) * DAY_MS;
  const boundary = localMidnight + (p.atHour * 60 + p.atMinute) * 60_000 - offset;
  return boundary > t ? boundary - DAY_MS : boundary;
}

/** The first instant at which idle expiry holds: now > last + idle. */
function idleAt(p: Policy, last: number): number {
  return Math.floor(last + p.idleMinutes * 60_000) + 1;
}

/** The first instant at which a boundary lies after `last`. */
function dailyAt(p: Policy, last: number): number {
  return lastBoundary(p, last) + DAY_MS;
}

/** The earliest instant at which a session last active at `last` is expired; null for mode none. */
export function deadlineOf(p: Policy, last: number): number | null {
  const at = [usesIdle(p) ? idleAt(p, last) : null, usesDaily(p) ? dailyAt(p, last) : null].filter(
    (t): t is number => t !== null,
  );
  return at.length === 0 ? null : Math.min(...at);
}

/** The reasons a session last active at `last` may be ended for at `now` (both on a tie); empty when live. */
export function expiryReasons(p: Policy, last: number, now: number): PolicyReason[] {
  const idle = usesIdle(p) ? idleAt(p, last) : Number.POSITIVE_INFINITY;
  const daily = usesDaily(p) ? dailyAt(p, last) : Number.POSITIVE_INFINITY;
  const first = Math.min(idle, daily);
  if (first > now) return [];
  const reasons: PolicyReason[] = [];
  if (idle === first) reasons.push("idle");
  if (daily === first) reasons.push("daily");
  return reasons;
}
