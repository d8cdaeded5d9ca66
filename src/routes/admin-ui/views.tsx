/**
 * The admin page's views, server-rendered with Hono's JSX. Plain HTML forms and
 * links only: every page works without JavaScript, and the page sends none.
 */
import { raw } from "hono/html";
import type { Child } from "hono/jsx";
import type { DeliveryRow, EventRow, MessageRow, RunRow, SessionRow } from "../../db/schema";
import { END_REASONS } from "../../domain/end-reasons";
import { formatZoned } from "../../domain/explain";
import type { SessionsFilter } from "./forms";

const STYLE = `
:root { --ink: #1d2330; --muted: #5f6b7a; --line: #e2e6ec; --bg: #f6f7f9; --card: #fff; --accent: #2f5bd3;
  --ok: #1f7a4d; --warn: #9a5b00; --bad: #b3261e; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", sans-serif; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); }
header { background: var(--ink); color: #fff; padding: 0 24px; display: flex; align-items: center; gap: 24px; height: 52px; }
header .brand { font-weight: 650; letter-spacing: .02em; }
header nav { display: flex; gap: 4px; flex: 1; }
header nav a { color: #c9d3e6; text-decoration: none; padding: 6px 12px; border-radius: 6px; }
header nav a.here, header nav a:hover { background: #2e3650; color: #fff; }
header form { margin: 0; }
header form button { background: transparent; color: #c9d3e6; border: 1px solid #48516b; }
main { max-width: 1180px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 16px; } h2 { font-size: 17px; margin: 28px 0 10px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 16px 18px; margin-bottom: 16px; }
table { width: 100%; border-collapse: collapse; background: var(--card); border: 1px solid var(--line); border-radius: 10px; overflow: hidden; }
th, td { text-align: left; padding: 8px 12px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); background: #fafbfc; }
tr:last-child td { border-bottom: 0; }
td.text { max-width: 420px; white-space: pre-wrap; word-break: break-word; }
code, .mono { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
a { color: var(--accent); }
.muted { color: var(--muted); } .small { font-size: 13px; }
time { white-space: nowrap; } .local { display: block; color: var(--muted); font-size: 12px; white-space: nowrap; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px; font-weight: 600; background: #eef1f6; color: var(--muted); }
.badge.live, .badge.sent, .badge.finished, .badge.append { background: #e3f4ea; color: var(--ok); }
.badge.failed, .badge.fresh { background: #fde8e6; color: var(--bad); }
.badge.pending, .badge.running, .badge.dispatching, .badge.reopen, .badge.recoverable { background: #fff1d6; color: var(--warn); }
form.filters { display: flex; flex-wrap: wrap; gap: 12px; align-items: end; }
label { display: flex; flex-direction: column; gap: 4px; font-size: 12px; color: var(--muted); font-weight: 600; }
input, select { font: inherit; padding: 6px 10px; border: 1px solid #c8ced8; border-radius: 6px; background: #fff; min-width: 150px; }
input[name=key] { min-width: 320px; }
button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
button.secondary { background: #fff; color: var(--accent); }
.pager { display: flex; gap: 16px; margin-top: 12px; }
.notice { padding: 10px 14px; border-radius: 8px; margin-bottom: 16px; background: #e8effd; border: 1px solid #c5d5f7; }
.notice.error { background: #fde8e6; border-color: #f3c2bd; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 6px 18px; margin: 0; }
dl.facts dt { color: var(--muted); font-size: 13px; } dl.facts dd { margin: 0; }
.would { font-size: 16px; margin: 0 0 12px; }
.sign-in { max-width: 380px; margin: 12vh auto; }
.sign-in form { display: flex; flex-direction: column; gap: 14px; }
.sign-in input { min-width: 0; width: 100%; }
.metrics td:last-child { text-align: right; font-variant-numeric: tabular-nums; }
`;

/** `2031-01-15 12:00:00 UTC`. */
const utc = (t: number) => `${new Date(t).toISOString().slice(0, 19).replace("T", " ")} UTC`;

/** An instant, readable in UTC and, below it, in the policy's zone (when that is not UTC). */
export function When(props: { at: number | null | undefined; zone: string }) {
  if (props.at === null || props.at === undefined) return <span class="muted">—</span>;
  const local = formatZoned(props.at, props.zone);
  return (
    <>
      <time datetime={new Date(props.at).toISOString()}>{utc(props.at)}</time>
      {props.zone !== "UTC" && (
        <span class="local">
          {local.slice(0, 19).replace("T", " ")} {local.slice(19)} {props.zone}
        </span>
      )}
    </>
  );
}

const Badge = (props: { kind: string; children?: Child }) => (
  <span class={`badge ${props.kind}`}>{props.children ?? props.kind}</span>
);

export const sessionState = (row: Pick<SessionRow, "endReason">) => (row.endReason === null ? "live" : row.endReason);

export type Page = "sessions" | "failed" | "metrics";

export function Layout(props: { title: string; page?: Page; csrf?: string; notice?: Notice | null; children?: Child }) {
  const link = (page: Page, label: string) => (
    <a href={`/admin/ui/${page}`} class={props.page === page ? "here" : ""}>
      {label}
    </a>
  );
  return (
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>{props.title} · sessiongate</title>
        {/* raw: the style sheet is ours, and escaping would break its quotes */}
        <style>{raw(STYLE)}</style>
      </head>
      <body>
        <header>
          <span class="brand">sessiongate</span>
          {props.csrf && (
            <>
              <nav>
                {link("sessions", "Sessions")}
                {link("failed", "Failed")}
                {link("metrics", "Metrics")}
              </nav>
              <form method="post" action="/admin/ui/sign-out">
                <input type="hidden" name="csrf" value={props.csrf} />
                <button type="submit">Sign out</button>
              </form>
            </>
          )}
        </header>
        <main>
          {props.notice && <div class={`notice ${props.notice.error ? "error" : ""}`}>{props.notice.text}</div>}
          {props.children}
        </main>
      </body>
    </html>
  );
}

export interface Notice {
  text: string;
  error: boolean;
}

export function SignInPage(props: { nonce: string; error?: string }) {
  return (
    <Layout title="Sign in">
      <div class="card sign-in">
        <h1>Sign in</h1>
        {props.error && <div class="notice error">{props.error}</div>}
        <form method="post" action="/admin/ui/sign-in">
          <input type="hidden" name="csrf" value={props.nonce} />
          <label>
            Admin token
            <input type="password" name="token" autocomplete="current-password" required autofocus />
          </label>
          <button type="submit">Sign in</button>
        </form>
        <p class="muted small">The token is the gateway's ADMIN_TOKEN. A sign-in lasts 8 hours.</p>
      </div>
    </Layout>
  );
}

const sessionLink = (id: string) => <a href={`/admin/ui/sessions/${encodeURIComponent(id)}`}>{id}</a>;

function filterHref(filter: SessionsFilter, before?: string): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries({ ...filter, before })) {
    if (value !== undefined && value !== "") params.set(name, String(value));
  }
  const query = params.toString();
  return `/admin/ui/sessions${query ? `?${query}` : ""}`;
}

export function SessionsPage(props: {
  csrf: string;
  filter: SessionsFilter;
  rows: SessionRow[];
  next: string | null;
  platforms: string[];
  zoneOf: (row: SessionRow) => string;
  notice: Notice | null;
}) {
  const f = props.filter;
  return (
    <Layout title="Sessions" page="sessions" csrf={props.csrf} notice={props.notice}>
      <h1>Sessions</h1>
      <form class="filters card" method="get" action="/admin/ui/sessions">
        <label>
          Key (or its start)
          <input name="key" value={f.key ?? ""} placeholder="telegram:dm:8494508720" />
        </label>
        <label>
          State
          <select name="state">
            <option value="">any</option>
            <option value="open" selected={f.state === "open"}>
              open
            </option>
            <option value="ended" selected={f.state === "ended"}>
              ended
            </option>
          </select>
        </label>
        <label>
          End reason
          <select name="reason">
            <option value="">any</option>
            {END_REASONS.map((reason) => (
              <option value={reason} selected={f.reason === reason}>
                {reason}
              </option>
            ))}
          </select>
        </label>
        <label>
          Platform
          <select name="platform">
            <option value="">any</option>
            {props.platforms.map((platform) => (
              <option value={platform} selected={f.platform === platform}>
                {platform}
              </option>
            ))}
          </select>
        </label>
        <button type="submit">Filter</button>
        <a href="/admin/ui/sessions">Clear</a>
      </form>
      {props.rows.length === 0 ? (
        <p class="card muted">No session matches.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Key</th>
              <th>Session</th>
              <th>State</th>
              <th>Started</th>
              <th>Last active</th>
              <th>Messages</th>
            </tr>
          </thead>
          <tbody>
            {props.rows.map((row) => (
              <tr>
                <td class="mono">{row.sessionKey}</td>
                <td class="mono">{sessionLink(row.id)}</td>
                <td>
                  <Badge kind={sessionState(row)} />
                </td>
                <td>
                  <When at={row.startedAt} zone={props.zoneOf(row)} />
                </td>
                <td>
                  <When at={row.lastActiveAt} zone={props.zoneOf(row)} />
                </td>
                <td>{row.messageCount}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <div class="pager">
        {f.before !== undefined && <a href={filterHref({ ...f, before: undefined })}>← Newest</a>}
        {props.next && <a href={filterHref({ ...f, before: undefined }, props.next)}>Older →</a>}
      </div>
    </Layout>
  );
}

/** What `explainKey()` answers (src/admin/explain-key.ts), as far as the page shows it. */
export interface ExplainView {
  key: string;
  policy: { mode: string; idle_minutes: number; at_hour: number; at_minute: number; timezone: string; source: string };
  overlap: { mode: string; debounce_ms: number; max_batch: number; source: string };
  last_active_at: number | null;
  deadline: {
    at: number | null;
    reason: string | null;
    idle_at: number | null;
    daily_at: number | null;
    timezone: string;
  };
  alarm_at: number | null;
  would: { action: string; reason: string; summary: string; expire?: { session_id: string; reason: string } };
  open_run: { run_id: string; status: string; lease_until: number | null } | null;
  waiting: number;
  session: { id: string } | null;
}

export function ExplainBlock(props: { explain: ExplainView }) {
  const e = props.explain;
  const zone = e.policy.timezone;
  const hh = (n: number) => String(n).padStart(2, "0");
  return (
    <div class="card explain">
      <p class="would">
        A message now: <Badge kind={e.would.action}>{e.would.action}</Badge> <span>{e.would.summary}</span>
      </p>
      <dl class="facts">
        <dt>Reset policy</dt>
        <dd>
          {e.policy.mode}
          {(e.policy.mode === "idle" || e.policy.mode === "both") && `, idle ${e.policy.idle_minutes} min`}
          {(e.policy.mode === "daily" || e.policy.mode === "both") &&
            `, daily at ${hh(e.policy.at_hour)}:${hh(e.policy.at_minute)} ${zone}`}{" "}
          <span class="muted">(from {e.policy.source})</span>
        </dd>
        <dt>Overlap</dt>
        <dd>
          {e.overlap.mode} <span class="muted">(from {e.overlap.source}; every message is its own run today)</span>
        </dd>
        <dt>Last activity</dt>
        <dd>
          <When at={e.last_active_at} zone={zone} />
        </dd>
        <dt>Deadline</dt>
        <dd>
          {e.deadline.reason && <Badge kind="muted">{e.deadline.reason}</Badge>} <When at={e.deadline.at} zone={zone} />
        </dd>
        <dt>Idle deadline</dt>
        <dd>
          <When at={e.deadline.idle_at} zone={zone} />
        </dd>
        <dt>Daily boundary</dt>
        <dd>
          <When at={e.deadline.daily_at} zone={zone} />
        </dd>
        <dt>Alarm</dt>
        <dd>
          <When at={e.alarm_at} zone={zone} />
        </dd>
        <dt>Open run</dt>
        <dd>
          {e.open_run ? (
            <>
              <code>{e.open_run.run_id}</code> <Badge kind={e.open_run.status} />
            </>
          ) : (
            <span class="muted">none</span>
          )}
        </dd>
        <dt>Waiting messages</dt>
        <dd>{e.waiting}</dd>
      </dl>
    </div>
  );
}

/** A run's state as the spec names it. */
export function runStatus(run: RunRow): string {
  if (run.revokedReason !== null) return "revoked";
  if (run.failedAt !== null) return "failed";
  if (run.finishedAt !== null) return "finished";
  return run.dispatchedAt === null ? "dispatching" : "running";
}

function RetryButton(props: { csrf: string; kind: "run" | "delivery" | "event"; id: string; back: string }) {
  return (
    <form method="post" action={`/admin/ui/retry/${props.kind}/${encodeURIComponent(props.id)}`}>
      <input type="hidden" name="csrf" value={props.csrf} />
      <input type="hidden" name="back" value={props.back} />
      <button type="submit" class="secondary">
        Retry
      </button>
    </form>
  );
}

function RunsTable(props: {
  runs: RunRow[];
  zone: (sessionId: string) => string;
  csrf: string;
  back: string;
  showSession?: boolean;
}) {
  return (
    <table>
      <thead>
        <tr>
          <th>Run</th>
          {props.showSession && <th>Session</th>}
          <th>Status</th>
          <th>Created</th>
          <th>Finished / failed</th>
          <th>Last error</th>
          <th></th>
        </tr>
      </thead>
      <tbody>
        {props.runs.map((run) => (
          <tr>
            <td class="mono">{run.id}</td>
            {props.showSession && <td class="mono">{sessionLink(run.sessionId)}</td>}
            <td>
              <Badge kind={runStatus(run)} />{" "}
              {run.revokedReason && <span class="muted small">{run.revokedReason}</span>}
            </td>
            <td>
              <When at={run.createdAt} zone={props.zone(run.sessionId)} />
            </td>
            <td>
              <When at={run.finishedAt ?? run.failedAt} zone={props.zone(run.sessionId)} />
            </td>
            <td class="small">{run.lastError ?? ""}</td>
            <td>
              {runStatus(run) === "failed" && (
                <RetryButton csrf={props.csrf} kind="run" id={run.id} back={props.back} />
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function DeliveriesTable(props: {
  rows: DeliveryRow[];
  zone: (sessionId: string) => string;
  csrf: string;
  back: string;
  showSession?: boolean;
}) {
  return (
    <table>
      <thead>
        <tr>
          <th>Delivery</th>
          {props.showSession && <th>Session</th>}
          <th>Kind</th>
          <th>Status</th>
          <th>Attempts</th>
          <th>Last answer</th>
          <th>Updated</th>
          <th></th>
        </tr>
      </thead>
      <tbody>
        {props.rows.map((d) => (
          <tr>
            <td class="mono small">
              {d.id}
              {d.eventId && <span class="local">event {d.eventId}</span>}
            </td>
            {props.showSession && <td class="mono">{sessionLink(d.sessionId)}</td>}
            <td>
              {d.platform} {d.kind}
            </td>
            <td>
              <Badge kind={d.status} />
            </td>
            <td>{d.attempts}</td>
            <td class="small">
              {d.lastStatus !== null && `HTTP ${d.lastStatus} `}
              {d.lastError !== null && d.lastError !== `HTTP ${d.lastStatus}` && d.lastError}
            </td>
            <td>
              <When at={d.updatedAt} zone={props.zone(d.sessionId)} />
            </td>
            <td>
              {d.status === "failed" && (
                <RetryButton csrf={props.csrf} kind="delivery" id={d.eventId ?? d.id} back={props.back} />
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function EventsTable(props: {
  rows: EventRow[];
  zone: (sessionId: string) => string;
  csrf: string;
  back: string;
  showSession?: boolean;
}) {
  return (
    <table>
      <thead>
        <tr>
          <th>Event</th>
          {props.showSession && <th>Session</th>}
          <th>Type</th>
          <th>Reason</th>
          <th>Status</th>
          <th>Attempts</th>
          <th>Occurred</th>
          <th></th>
        </tr>
      </thead>
      <tbody>
        {props.rows.map((event) => (
          <tr>
            <td class="mono small">{event.id}</td>
            {props.showSession && <td class="mono">{sessionLink(event.sessionId)}</td>}
            <td>{event.type}</td>
            <td>{event.reason ?? ""}</td>
            <td>
              <Badge kind={event.status} />
              {event.lastError && <span class="local">{event.lastError}</span>}
            </td>
            <td>{event.attempts}</td>
            <td>
              <When at={event.occurredAt} zone={props.zone(event.sessionId)} />
            </td>
            <td>
              {event.status === "failed" && (
                <RetryButton csrf={props.csrf} kind="event" id={event.id} back={props.back} />
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function SessionPage(props: {
  csrf: string;
  row: SessionRow;
  zone: string;
  messages: MessageRow[];
  runs: RunRow[];
  events: EventRow[];
  deliveries: DeliveryRow[];
  explain: ExplainView;
  notice: Notice | null;
}) {
  const { row, zone } = props;
  const back = `/admin/ui/sessions/${encodeURIComponent(row.id)}`;
  const runsById = new Map(props.runs.map((run) => [run.id, run]));
  const isKeysRow = props.explain.session?.id === row.id;
  return (
    <Layout title={row.id} page="sessions" csrf={props.csrf} notice={props.notice}>
      <h1>
        Session <code>{row.id}</code> <Badge kind={sessionState(row)} />
      </h1>
      <div class="card">
        <dl class="facts">
          <dt>Key</dt>
          <dd>
            <a class="mono" href={`/admin/ui/sessions?key=${encodeURIComponent(row.sessionKey)}`}>
              {row.sessionKey}
            </a>
          </dd>
          <dt>Started</dt>
          <dd>
            <When at={row.startedAt} zone={zone} />
          </dd>
          <dt>Last active</dt>
          <dd>
            <When at={row.lastActiveAt} zone={zone} />
          </dd>
          <dt>Ended</dt>
          <dd>
            {row.endReason && <Badge kind="muted">{row.endReason}</Badge>} <When at={row.endedAt} zone={zone} />
          </dd>
          {row.previousSessionId && (
            <>
              <dt>Replaced</dt>
              <dd>
                {sessionLink(row.previousSessionId)} <span class="muted">(ended as {row.resetReason})</span>
              </dd>
            </>
          )}
          {row.parentSessionId && (
            <>
              <dt>Continues</dt>
              <dd>{sessionLink(row.parentSessionId)}</dd>
            </>
          )}
        </dl>
      </div>
      <h2>Explain: what a message for this key would do now</h2>
      {!isKeysRow && (
        <p class="muted small">
          A message for this key reads {props.explain.session ? sessionLink(props.explain.session.id) : "no session"},
          not this one.
        </p>
      )}
      <ExplainBlock explain={props.explain} />
      <h2>Messages</h2>
      {props.messages.length === 0 ? (
        <p class="card muted">No messages.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>At</th>
              <th>Role</th>
              <th>Text</th>
              <th>Run</th>
            </tr>
          </thead>
          <tbody>
            {props.messages.map((m) => {
              const run = m.runId ? runsById.get(m.runId) : undefined;
              return (
                <tr>
                  <td>
                    <When at={m.createdAt} zone={zone} />
                  </td>
                  <td>{m.role}</td>
                  <td class="text">{m.text}</td>
                  <td class="small">
                    {m.runId && <code>{m.runId}</code>} {run && <Badge kind={runStatus(run)} />}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
      <h2>Runs</h2>
      {props.runs.length === 0 ? (
        <p class="card muted">No runs.</p>
      ) : (
        <RunsTable runs={props.runs} zone={() => zone} csrf={props.csrf} back={back} />
      )}
      <h2>Lifecycle events</h2>
      {props.events.length === 0 ? (
        <p class="card muted">No events.</p>
      ) : (
        <EventsTable rows={props.events} zone={() => zone} csrf={props.csrf} back={back} />
      )}
      <h2>Deliveries</h2>
      {props.deliveries.length === 0 ? (
        <p class="card muted">No deliveries.</p>
      ) : (
        <DeliveriesTable rows={props.deliveries} zone={() => zone} csrf={props.csrf} back={back} />
      )}
    </Layout>
  );
}

export function FailedPage(props: {
  csrf: string;
  runs: RunRow[];
  deliveries: DeliveryRow[];
  events: EventRow[];
  zoneOf: (sessionId: string) => string;
  notice: Notice | null;
}) {
  const back = "/admin/ui/failed";
  return (
    <Layout title="Failed" page="failed" csrf={props.csrf} notice={props.notice}>
      <h1>Failed: users or receivers left without an answer</h1>
      <h2>Runs whose hand-off failed for good</h2>
      {props.runs.length === 0 ? (
        <p class="card muted">None.</p>
      ) : (
        <RunsTable runs={props.runs} zone={props.zoneOf} csrf={props.csrf} back={back} showSession />
      )}
      <h2>Reply deliveries dead-lettered</h2>
      {props.deliveries.length === 0 ? (
        <p class="card muted">None.</p>
      ) : (
        <DeliveriesTable rows={props.deliveries} zone={props.zoneOf} csrf={props.csrf} back={back} showSession />
      )}
      <h2>Lifecycle events dead-lettered</h2>
      {props.events.length === 0 ? (
        <p class="card muted">None.</p>
      ) : (
        <EventsTable rows={props.events} zone={props.zoneOf} csrf={props.csrf} back={back} showSession />
      )}
    </Layout>
  );
}

export function MetricsPage(props: { csrf: string; counters: object }) {
  const rows: [string, string][] = [];
  for (const [name, value] of Object.entries(props.counters)) {
    if (value !== null && typeof value === "object") {
      const entries = Object.entries(value as Record<string, unknown>);
      if (entries.length === 0) rows.push([name, "none yet"]);
      for (const [inner, count] of entries) rows.push([`${name}.${inner}`, String(count)]);
    } else rows.push([name, String(value)]);
  }
  return (
    <Layout title="Metrics" page="metrics" csrf={props.csrf}>
      <h1>Metrics</h1>
      <p class="muted small">Counters since this isolate started (each isolate counts its own).</p>
      <table class="metrics">
        <tbody>
          {rows.map(([name, value]) => (
            <tr>
              <td class="mono">{name}</td>
              <td>{value}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </Layout>
  );
}

export function MessagePage(props: { title: string; text: string; csrf?: string }) {
  return (
    <Layout title={props.title} csrf={props.csrf}>
      <div class="card">
        <h1>{props.title}</h1>
        <p>{props.text}</p>
        <p>
          <a href="/admin">Back to the admin page</a>
        </p>
      </div>
    </Layout>
  );
}
