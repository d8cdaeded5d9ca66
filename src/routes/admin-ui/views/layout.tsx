/** The admin page's frame (style, navigation, notices), its small shared pieces, and the sign-in and message pages. */
import { raw } from "hono/html";
import type { Child } from "hono/jsx";
import type { SessionRow } from "../../../db/schema";
import { formatZoned } from "../../../domain/explain";

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
export const utc = (t: number) => `${new Date(t).toISOString().slice(0, 19).replace("T", " ")} UTC`;

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

export const Badge = (props: { kind: string; children?: Child }) => (
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

export const sessionLink = (id: string) => <a href={`/admin/ui/sessions/${encodeURIComponent(id)}`}>{id}</a>;

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
