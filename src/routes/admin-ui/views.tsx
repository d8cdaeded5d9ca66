/**
 * The admin page's views, server-rendered with Hono's JSX, one file per page in
 * views/. Plain HTML forms and links only: every page works without JavaScript,
 * and the page sends none.
 */
export * from "./views/layout";
export * from "./views/sessions";
export * from "./views/session";
export * from "./views/tables";
export * from "./views/failed";
export * from "./views/metrics";
