// The printed table: each gateway figure beside the floor's and their ratio.
import { round } from "./load.mjs";

/** [label, getter, digits] for each row printed per scenario. */
export const FIGURES = [
  ["messages/s", (s) => s.load.messages_per_second, 0],
  ["ack p50 ms", (s) => s.load.latency_ms.p50, 1],
  ["ack p95 ms", (s) => s.load.latency_ms.p95, 1],
  ["ack p99 ms", (s) => s.load.latency_ms.p99, 1],
  ["ingress D1 batches/msg", (s) => s.per_message.d1_batches_ingress, 2],
  ["ingress D1 queries/msg", (s) => s.per_message.d1_queries_ingress, 2],
  ["ingress rows read/msg", (s) => s.per_message.d1_rows_read_ingress, 2],
  ["ingress rows written/msg", (s) => s.per_message.d1_rows_written_ingress, 2],
  ["total D1 queries/msg", (s) => s.per_message.d1_queries, 2],
  ["total rows read/msg", (s) => s.per_message.d1_rows_read, 2],
  ["total rows written/msg", (s) => s.per_message.d1_rows_written, 2],
  ["object rows written/msg", (s) => s.per_message.do_rows_written, 2],
  ["drain after last ack ms", (s) => s.drain.settled_after_ms, 0],
  ["peak workerd RSS MiB", (s) => (s.rss ? s.rss.sum_kb / 1024 : null), 0],
  ["not acknowledged (non-200)", (s) => s.load.requests - (s.load.statuses[200] ?? 0), 0],
];

const fmt = (value, digits) =>
  value === null || value === undefined
    ? "-"
    : Number(value).toLocaleString("en-US", {
        minimumFractionDigits: digits,
        maximumFractionDigits: digits,
      });

function ratio(a, b) {
  if (a === null || a === undefined || b === null || b === undefined) return "-";
  if (b === 0) return a === 0 ? "1.00x" : "-";
  return `${(a / b).toFixed(2)}x`;
}

/** Text table of scenario x figure: gateway, floor, gateway / floor. */
export function table(results, scenarios) {
  const gateway = results.targets.gateway?.scenarios ?? {};
  const floor = results.targets.floor?.scenarios ?? {};
  const rows = [["scenario", "figure", "gateway", "floor", "gateway/floor"]];
  for (const scenario of scenarios) {
    const g = gateway[scenario];
    const f = floor[scenario];
    if (!g && !f) continue;
    const size = (g ?? f).load.requests;
    FIGURES.forEach(([label, get, digits], i) => {
      const gv = g ? get(g) : null;
      const fv = f ? get(f) : null;
      rows.push([i === 0 ? `${scenario} (${size})` : "", label, fmt(gv, digits), fmt(fv, digits), ratio(gv, fv)]);
    });
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  const line = (r) => r.map((cell, c) => (c < 2 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join("  ");
  const rule = widths.map((w) => "-".repeat(w)).join("  ");
  return [line(rows[0]), rule, ...rows.slice(1).map(line)].join("\n");
}

/** The budget of issue 5, checked where the run has the figures (informational). */
export function budget(results) {
  const g = results.targets.gateway?.scenarios ?? {};
  const f = results.targets.floor?.scenarios ?? {};
  const checks = [];
  const add = (name, ok, detail) => checks.push({ name, ok, detail });
  if (g.steady && f.steady) {
    const t = g.steady.load.messages_per_second / f.steady.load.messages_per_second;
    add("steady throughput >= 0.7x floor", t >= 0.7, `${t.toFixed(2)}x`);
    const p = g.steady.load.latency_ms.p50 / f.steady.load.latency_ms.p50;
    add("steady p50 ack <= 1.5x floor", p <= 1.5, `${p.toFixed(2)}x`);
  }
  if (g.steady) {
    const pm = g.steady.per_message;
    add("steady D1 round trips on ingress <= 1/msg", pm.d1_batches_ingress <= 1, `${pm.d1_batches_ingress}`);
    add("steady ingress rows read <= 3/msg", pm.d1_rows_read_ingress <= 3, `${pm.d1_rows_read_ingress}`);
    add("steady ingress rows written <= 5/msg", pm.d1_rows_written_ingress <= 5, `${pm.d1_rows_written_ingress}`);
  }
  if (g.steady && g.grown) {
    // The ingress path is deterministic; the background path may batch differently with timing.
    const keys = ["d1_rows_read_ingress", "d1_rows_written_ingress", "d1_rows_read", "d1_rows_written"];
    const close = (a, b) => Math.abs(a - b) <= 0.01 * Math.max(Math.abs(a), Math.abs(b));
    const same = keys.every((k) =>
      k.endsWith("_ingress")
        ? g.steady.per_message[k] === g.grown.per_message[k]
        : close(g.steady.per_message[k], g.grown.per_message[k]),
    );
    add(
      "grown rows/msg == steady (ingress exactly, totals within 1%)",
      same,
      keys.map((k) => `${k} ${g.steady.per_message[k]} -> ${g.grown.per_message[k]}`).join(", "),
    );
    const t = g.grown.load.messages_per_second / g.steady.load.messages_per_second;
    add("grown throughput within 10% of steady", t >= 0.9, `${t.toFixed(2)}x`);
  }
  if (g.burst) add("burst: all stored once, in order", g.burst.verify?.ok === true, g.burst.verify?.summary ?? "-");
  return checks;
}

export function perMessage(delta, messages) {
  const per = (value) => (value === undefined || messages === 0 ? null : round(value / messages, 3));
  return {
    d1_batches_ingress: per(delta.d1_batches_ingress),
    d1_queries_ingress: per(delta.d1_queries_ingress),
    d1_rows_read_ingress: per(delta.d1_rows_read_ingress),
    d1_rows_written_ingress: per(delta.d1_rows_written_ingress),
    d1_queries: per(delta.d1_queries),
    d1_rows_read: per(delta.d1_rows_read),
    d1_rows_written: per(delta.d1_rows_written),
    do_rows_read: per(delta.do_rows_read),
    do_rows_written: per(delta.do_rows_written),
  };
}
