/** A random, URL-safe identifier with a readable prefix (`ses_…`, `run_…`). */
export function newId(prefix: string): string {
  return `${prefix}_${crypto.randomUUID().replaceAll("-", "")}`;
}
