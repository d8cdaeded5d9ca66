/** One session's timeline (messages with their runs, events and deliveries) and its explain block. */
import type { DeliveryRow, EventRow, MessageRow, RunRow, SessionRow } from "../../../db/schema";
import { Badge, Layout, When, sessionLink, sessionState, type Notice } from "./layout";
import { DeliveriesTable, EventsTable, RunsTable, runStatus } from "./tables";

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
