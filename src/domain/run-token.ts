/**
 * Run tokens name their run: `{run_id}.{secret}`. The gateway keeps only the
 * SHA-256 of the whole token, and a token presented for another run can be told
 * apart (403) from one that is simply wrong (401) without an index on hashes.
 */
export function runIdOfToken(token: string): string | null {
  const dot = token.lastIndexOf(".");
  return dot > 0 ? token.slice(0, dot) : null;
}

export function makeRunToken(runId: string, secret: string): string {
  return `${runId}.${secret}`;
}
