/**
 * Wall-clock arithmetic in an IANA time zone with Intl only (no Temporal in
 * workerd). A local time that a DST change skips resolves forward by the size of
 * the gap and a repeated one resolves to its first occurrence, the way Temporal's
 * "compatible" disambiguation does, so a daily boundary happens exactly once a day.
 */
const DAY_MS = 86_400_000;
const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(timeZone: string): Intl.DateTimeFormat {
  let format = formatters.get(timeZone);
  if (!format) {
    format = new Intl.DateTimeFormat("en-US", {
      timeZone,
      hourCycle: "h23",
      year: "numeric",
      month: "numeric",
      day: "numeric",
      hour: "numeric",
      minute: "numeric",
      second: "numeric",
    });
    formatters.set(timeZone, format);
  }
  return format;
}

/** True when the runtime knows `timeZone` as an IANA zone name. */
export function isValidTimeZone(timeZone: string): boolean {
  try {
    formatter(timeZone);
    return true;
  } catch {
    return false;
  }
}

interface WallClock {
  year: number;
  month: number;
  day: number;
  hour: number;
  minute: number;
  second: number;
}

function wallClock(instant: number, timeZone: string): WallClock {
  const fields: Record<string, number> = {};
  for (const part of formatter(timeZone).formatToParts(instant)) {
    if (part.type !== "literal") fields[part.type] = Number(part.value);
  }
  return {
    year: fields.year ?? 0,
    month: fields.month ?? 1,
    day: fields.day ?? 1,
    hour: fields.hour ?? 0,
    minute: fields.minute ?? 0,
    second: fields.second ?? 0,
  };
}

/** The zone's offset from UTC at `instant`, in ms (local minus UTC). */
export function offsetAt(instant: number, timeZone: string): number {
  const local = wallClock(instant, timeZone);
  const asUtc = Date.UTC(local.year, local.month - 1, local.day, local.hour, local.minute, local.second);
  return asUtc - Math.floor(instant / 1000) * 1000;
}

export interface LocalDate {
  year: number;
  month: number;
  day: number;
}

/** The calendar date in `timeZone` at `instant`. */
export function localDate(instant: number, timeZone: string): LocalDate {
  const { year, month, day } = wallClock(instant, timeZone);
  return { year, month, day };
}

/** The date `days` after `date` (negative for before), on the proleptic calendar. */
export function addDays(date: LocalDate, days: number): LocalDate {
  const shifted = new Date(Date.UTC(date.year, date.month - 1, date.day + days));
  return { year: shifted.getUTCFullYear(), month: shifted.getUTCMonth() + 1, day: shifted.getUTCDate() };
}

/** The instant at which `timeZone` shows `date` `hour:minute`, disambiguated as described above. */
export function zonedInstant(date: LocalDate, hour: number, minute: number, timeZone: string): number {
  const asUtc = Date.UTC(date.year, date.month - 1, date.day, hour, minute);
  // Offsets a day either side bracket any single transition near this wall time.
  const offsetBefore = offsetAt(asUtc - DAY_MS, timeZone);
  const offsetAfter = offsetAt(asUtc + DAY_MS, timeZone);
  const withOffsetBefore = asUtc - offsetBefore;
  const withOffsetAfter = asUtc - offsetAfter;
  const beforeHolds = offsetAt(withOffsetBefore, timeZone) === offsetBefore;
  const afterHolds = offsetAt(withOffsetAfter, timeZone) === offsetAfter;
  if (beforeHolds && afterHolds) return Math.min(withOffsetBefore, withOffsetAfter); // repeated hour: first one
  if (beforeHolds) return withOffsetBefore;
  if (afterHolds) return withOffsetAfter;
  // Skipped hour: keep the offset in force before the gap, which lands after it.
  return withOffsetBefore;
}
