/**
 * D1 cost of a routed message, from D1's own result meta (deterministic, so it is
 * asserted here; speed is measured by `npm run bench`, never here). A change that
 * adds a query or a row to the path that answers the webhook fails this test.
 */
import { afterEach, beforeEach, expect, it } from "vitest";
import { metrics, resetMetrics } from "../../src/metrics";
import { T0, genericKey, restoreClock, runAlarm, send, setNow, unique, useConfig } from "../helpers";

beforeEach(() => setNow(T0));
afterEach(() => {
  restoreClock();
  useConfig(null);
});

it("a steady-state message costs one D1 round trip, 2 rows read and 3 rows written on the ingress path", async () => {
  const chat = unique("chat");
  await send({ chat_id: chat, text: "first" }); // creates the session
  await runAlarm(genericKey(chat));
  resetMetrics();
  const count = 10;
  for (let i = 0; i < count; i++) await send({ chat_id: chat, text: `steady ${i}` });
  expect(metrics.messages_routed).toBe(count);
  expect(metrics.d1_batches_ingress).toBe(count);
  expect(metrics.d1_queries_ingress).toBe(3 * count);
  expect(metrics.d1_rows_read_ingress).toBe(2 * count);
  expect(metrics.d1_rows_written_ingress).toBe(3 * count);
});

it("reports the whole cost of a message with its echo reply", async () => {
  const chat = unique("chat");
  await send({ chat_id: chat, text: "first" });
  await runAlarm(genericKey(chat));
  resetMetrics();
  await send({ chat_id: chat, text: "steady" });
  await runAlarm(genericKey(chat));
  console.log("whole cost of one steady message with echo reply", {
    queries: metrics.d1_queries,
    rows_read: metrics.d1_rows_read,
    rows_written: metrics.d1_rows_written,
  });
  expect(metrics.d1_rows_written).toBeGreaterThan(metrics.d1_rows_written_ingress);
});
