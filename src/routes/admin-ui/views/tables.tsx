/** The runs, deliveries and events tables, each with a retry button on what failed. */
import type { DeliveryRow, EventRow, RunRow } from "../../../db/schema";
import { Badge, When, sessionLink } from "./layout";

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

export function RunsTable(props: {
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

export function DeliveriesTable(props: {
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

export function EventsTable(props: {
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
