// The load: webhook requests built and signed before the timed part, then sent by
// autocannon over keep-alive connections to 127.0.0.1, a fixed number in flight.
import { createHmac } from "node:crypto";
import autocannon from "autocannon";

/** One signed `POST /webhooks/generic` per message; each message has its own event_id. */
export function signedRequests(secret, messages) {
  return messages.map((message) => {
    const body = JSON.stringify({ chat_type: "dm", user_id: "bench-user", ...message });
    const signature = `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`;
    return {
      method: "POST",
      path: "/webhooks/generic",
      headers: { "content-type": "application/json", "x-signature-256": signature },
      body,
    };
  });
}

/** `perKey` messages to each of `keys` keys, interleaved (message j of every key, then j + 1). */
export function manyKeys(prefix, keys, perKey) {
  const messages = [];
  for (let j = 0; j < perKey; j++) {
    for (let k = 0; k < keys; k++) {
      messages.push({ event_id: `${prefix}-${k}-${j}`, chat_id: `${prefix}-${k}`, text: `message ${j + 1} to ${k}` });
    }
  }
  return messages;
}

/** `count` messages to one key, tagged `#n` in the order they are sent. */
export function oneKey(prefix, count) {
  return Array.from({ length: count }, (_, i) => ({
    event_id: `${prefix}-${i}`,
    chat_id: prefix,
    text: `burst #${i + 1} of ${count}`,
  }));
}

/** Nearest-rank percentile of a sorted array. */
export function percentile(sorted, q) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

let current = null;

/** Stops a load in progress (Ctrl-C). */
export function abortLoad() {
  current?.stop();
}

/**
 * Sends every request once, `connections` in flight, and measures each ack.
 * Bounded by the request count and by `maxSeconds`.
 */
export function runLoad({ origin, requests, connections, maxSeconds, timeoutSeconds = 60 }) {
  return new Promise((resolve, reject) => {
    let next = 0;
    let overflow = 0;
    let accepted = 0;
    const failures = [];
    const latencies = [];
    const statuses = {};
    const started = process.hrtime.bigint();
    let lastAck = started;
    let timedOut = false;

    const instance = autocannon(
      {
        url: origin,
        connections: Math.max(1, Math.min(connections, requests.length)),
        amount: requests.length,
        timeout: timeoutSeconds,
        requests: [
          {
            // Hands out the prebuilt requests in order, each once; a request that had to be
            // sent again after an error or timeout would repeat the last one (counted).
            setupRequest: (defaults) => {
              const request = requests[next] ?? requests[requests.length - 1];
              if (next >= requests.length) overflow += 1;
              next += 1;
              return { ...defaults, ...request, headers: { ...request.headers } };
            },
            onResponse: (status, body) => {
              if (status === 200 && body.includes('"accepted":true')) accepted += 1;
              else if (failures.length < 10) failures.push(`${status} ${String(body).slice(0, 200)}`);
            },
          },
        ],
      },
      (error, result) => {
        clearTimeout(guard);
        current = null;
        if (error) return reject(error);
        const elapsedMs = Number(lastAck - started) / 1e6;
        latencies.sort((a, b) => a - b);
        const ok = statuses[200] ?? 0;
        const responses = Object.values(statuses).reduce((a, b) => a + b, 0);
        resolve({
          requests: requests.length,
          responses,
          // Requests whose connection was closed before any answer came.
          unanswered: Math.max(0, requests.length - responses),
          ok,
          accepted,
          statuses,
          errors: result.errors,
          timeouts: result.timeouts,
          overflow,
          failures,
          stopped_early: timedOut,
          elapsed_ms: round(elapsedMs),
          messages_per_second: elapsedMs > 0 ? round((ok / elapsedMs) * 1000) : null,
          latency_ms: {
            p50: round(percentile(latencies, 0.5)),
            p95: round(percentile(latencies, 0.95)),
            p99: round(percentile(latencies, 0.99)),
            max: round(latencies[latencies.length - 1] ?? null),
            mean: round(latencies.reduce((a, b) => a + b, 0) / Math.max(1, latencies.length)),
          },
        });
      },
    );
    current = instance;
    instance.on("response", (_client, status, _bytes, responseTime) => {
      statuses[status] = (statuses[status] ?? 0) + 1;
      // Ack latency: only answers that acknowledged the message.
      if (status === 200) latencies.push(responseTime);
      lastAck = process.hrtime.bigint();
    });
    const guard = setTimeout(() => {
      timedOut = true;
      instance.stop();
    }, maxSeconds * 1000);
  });
}

export function round(value, digits = 2) {
  if (value === null || value === undefined || !Number.isFinite(value)) return null;
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}
