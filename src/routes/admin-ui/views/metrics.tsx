/** The metrics counters. */
import { Layout } from "./layout";

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
