// The load: signed `POST /webhooks/generic` messages over many keys, each resent
// (the same bytes, so the same event_id) until the gateway acknowledges it, as a
// chat platform retries a webhook that was not answered 2xx.
import { createHmac } from "node:crypto";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The keys: even ones dm (short idle policy), odd ones group (policy none, ended
 * by the operator). Every `burstEvery`-th key (both kinds, as the parity alternates)
 * is a *burst* key: its messages go out back to back and the fake agent answers
 * its hand-offs slowly, so they arrive while its run is open and wait to be batched.
 */
export function buildKeys(runTag, count, burstEvery = 0) {
  return Array.from({ length: count }, (_, k) => {
    const chatType = k % 2 === 0 ? "dm" : "group";
    const chatId = `c${runTag}-chat${k}`;
    const userId = `u${k}`;
    // Ids hold only [a-z0-9-], so percent-encoding leaves them as they are.
    const key = chatType === "dm" ? `generic:dm:${chatId}` : `generic:group:${chatId}:${userId}`;
    const burst = burstEvery > 0 && k % burstEvery === burstEvery - 1;
    // Which burst key this is (0, 1, …): spreads the bursts over the rounds.
    const burstSlot = burst ? Math.floor(k / burstEvery) : null;
    return { index: k, chatType, chatId, userId, key, burst, burstSlot };
  });
}

/**
 * `perKey` messages to every key, interleaved (message j of every key, then j + 1),
 * but a burst key's messages all at once, in a round spread over the run (so the
 * kills also land while batches wait).
 */
export function buildMessages(runTag, keys, perKey, secret) {
  const messages = [];
  for (let round = 0; round < perKey; round++) {
    for (const key of keys) {
      if (key.burst && key.burstSlot % perKey !== round) continue;
      for (const j of key.burst ? Array.from({ length: perKey }, (_, i) => i) : [round]) {
        messages.push(message(runTag, key, j, secret));
      }
    }
  }
  return messages;
}

/** One signed message: message `j` of `key`, its event id naming both. */
function message(runTag, key, j, secret) {
  const eventId = `c${runTag}-k${key.index}-m${j}`;
  const body = JSON.stringify({
    event_id: eventId,
    chat_id: key.chatId,
    chat_type: key.chatType,
    user_id: key.userId,
    text: `chaos message ${eventId}`,
  });
  return {
    eventId,
    key,
    body,
    signature: `sha256=${createHmac("sha256", secret).update(body).digest("hex")}`,
    attempts: 0,
    statuses: {},
    ack: null, // { session_id, duplicate, at }
  };
}

/**
 * Sends every message until acknowledged: at most `concurrency` in flight, new
 * ones started at `rate` per second. Resolves when all are acknowledged or `until`
 * says stop. `inFlight()` tells the killer whether requests are on the wire.
 */
export class Load {
  constructor({ origin, messages, rate, concurrency, until }) {
    Object.assign(this, { origin, messages, rate, concurrency, until });
    this.inFlight = 0;
    this.sends = 0;
    this.acknowledged = 0;
    this.unanswered = 0; // connection refused, reset or timed out: no answer at all
    this.refused = {}; // status -> count of non-2xx answers
    this.stopped = false;
  }

  async run() {
    let next = 0;
    let slot = Date.now();
    const worker = async () => {
      while (!this.stopped && next < this.messages.length) {
        const message = this.messages[next++];
        const wait = slot - Date.now();
        slot = Math.max(slot, Date.now()) + 1000 / this.rate;
        if (wait > 0) await sleep(wait);
        await this.deliver(message);
      }
    };
    await Promise.all(Array.from({ length: this.concurrency }, worker));
  }

  /** One message, resent with a short backoff until a 200 `accepted: true` comes back. */
  async deliver(message) {
    let backoff = 200;
    while (!this.stopped && !this.until()) {
      message.attempts += 1;
      this.sends += 1;
      this.inFlight += 1;
      try {
        const response = await fetch(`${this.origin}/webhooks/generic`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-signature-256": message.signature },
          body: message.body,
          signal: AbortSignal.timeout(20_000),
        });
        const text = await response.text();
        message.statuses[response.status] = (message.statuses[response.status] ?? 0) + 1;
        if (response.status === 200) {
          const body = JSON.parse(text);
          if (body.accepted === true) {
            message.ack = { session_id: body.session_id, duplicate: body.duplicate, at: Date.now() };
            this.acknowledged += 1;
            return;
          }
        }
        this.refused[response.status] = (this.refused[response.status] ?? 0) + 1;
      } catch {
        message.statuses.none = (message.statuses.none ?? 0) + 1;
        this.unanswered += 1;
      } finally {
        this.inFlight -= 1;
      }
      await sleep(backoff);
      backoff = Math.min(1000, backoff * 2);
    }
  }

  stop() {
    this.stopped = true;
  }
}
