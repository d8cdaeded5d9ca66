/** The sessions list with its filters. */
import type { SessionRow } from "../../../db/schema";
import { END_REASONS } from "../../../domain/end-reasons";
import type { SessionsFilter } from "../forms";
import { Badge, Layout, When, sessionLink, sessionState, type Notice } from "./layout";

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
