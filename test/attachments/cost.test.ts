/**
 * What attachments cost in D1: nothing for a text-only message (test/routing/cost.test.ts
 * holds that figure unchanged), and one statement and one row written per attachment.
 */
import { afterEach, beforeEach, expect, it } from "vitest";
import { metrics, resetMetrics } from "../../src/metrics";
import { T0, genericKey, restoreClock, runAlarm, send, setNow, unique, useConfig } from "../helpers";

beforeEach(() => setNow(T0));
afterEach(() => {
  restoreClock();
  useConfig(null);
});

const file = (n: number) => ({ url: `https://files.client.test/${n}.png`, kind: "image" });

it("a steady message with n attachments costs the text-only figures plus n statements and n rows written", async () => {
  const chat = unique("chat");
  await send({ chat_id: chat, text: "first" });
  await runAlarm(genericKey(chat));
  for (const n of [1, 3]) {
    resetMetrics();
    await send({ chat_id: chat, text: "look", attachments: Array.from({ length: n }, (_, i) => file(i)) } as any);
    expect(metrics.d1_batches_ingress).toBe(1);
    expect(metrics.d1_queries_ingress).toBe(3 + n);
    expect(metrics.d1_rows_read_ingress).toBe(2);
    expect(metrics.d1_rows_written_ingress).toBe(3 + n);
    await runAlarm(genericKey(chat));
  }
});
