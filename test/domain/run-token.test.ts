/**
 * Run tokens name their run (`{run_id}.{secret}`), so the agent API can tell a
 * token presented for another run (403) from one that is simply wrong (401).
 */
import { describe, expect, it } from "vitest";
import { makeRunToken, runIdOfToken } from "../../src/domain/run-token";

describe("run tokens", () => {
  it("carry their run id before the secret, and give it back", () => {
    const token = makeRunToken("run_01HX", "s3cr3t");
    expect(token).toBe("run_01HX.s3cr3t");
    expect(runIdOfToken(token)).toBe("run_01HX");
  });

  it("split at the last dot, so a run id with dots survives", () => {
    expect(runIdOfToken(makeRunToken("cron.job.7", "abc"))).toBe("cron.job.7");
  });

  it.each([
    ["no dot", "justasecret"],
    ["an empty run id", ".secret"],
    ["an empty token", ""],
  ])("name no run when the token has %s", (_what, token) => {
    expect(runIdOfToken(token)).toBeNull();
  });
});
