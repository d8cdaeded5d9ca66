/** What failed for good, with a retry button each. */
import type { DeliveryRow, EventRow, RunRow } from "../../../db/schema";
import { Layout, type Notice } from "./layout";
import { DeliveriesTable, EventsTable, RunsTable } from "./tables";

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
