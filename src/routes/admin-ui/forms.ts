/** The admin page's form and query schemas (also described in /openapi.json). */
import * as z from "zod";
import { END_REASONS } from "../../domain/end-reasons";

/** An empty form or query value means "not given", as when it is absent. */
const optional = <T extends z.ZodType>(schema: T) => z.preprocess((v) => (v === "" ? undefined : v), schema.optional());

export const signInForm = z.object({ token: z.string().min(1).max(1024) });

/** Every POST of a signed-in page carries the CSRF token of its session cookie. */
export const csrfForm = z.object({ csrf: z.string().min(1).max(256) });

export const sessionsFilter = z.object({
  key: optional(z.string().max(1024).describe("a key, or the start of one")),
  state: optional(z.enum(["open", "ended"])),
  reason: optional(z.enum(END_REASONS)),
  platform: optional(z.string().max(64)),
  before: optional(
    z
      .string()
      .regex(/^\d{1,16}\..{1,256}$/)
      .describe("paging: `{started_at}.{id}` of the last session of the previous page"),
  ),
});
export type SessionsFilter = z.infer<typeof sessionsFilter>;

/** What the page can retry; each kind goes through one function in src/admin/retry.ts. */
export const pageRetryKinds = ["run", "delivery", "event"] as const;
export type PageRetryKind = (typeof pageRetryKinds)[number];
