// The gateway's three loopback peers: a fake agent (AGENT_URL), a hook receiver
// (HOOK_URLS) and a reply receiver (GENERIC_REPLY_URL). Each records what it saw,
// so the verification can compare it with what the gateway acknowledged and stored.
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Event ids named in a text (messages and replies carry them, so each can be traced). */
export function eventIdsIn(text, runTag) {
  return String(text ?? "").match(new RegExp(`c${runTag}-k\\d+-m\\d+`, "g")) ?? [];
}

function readBody(request) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks)));
    request.on("error", reject);
  });
}

function answer(response, status, body) {
  response.writeHead(status, { "content-type": "application/json" });
  response.end(JSON.stringify(body));
}

function listen(handler, port) {
  const server = createServer((request, response) => {
    handler(request, response).catch((error) => {
      if (!response.headersSent) answer(response, 500, { error: String(error) });
    });
  });
  // Keep-alive sockets would keep close() waiting at the end.
  server.keepAliveTimeout = 1000;
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => resolve(server));
  });
}

function closeServer(server) {
  return new Promise((resolve) => {
    server.closeAllConnections?.();
    server.close(() => resolve());
  });
}

const hmacHex = (secret, bytes) => createHmac("sha256", secret).update(bytes).digest("hex");

function sameHex(a, b) {
  const left = Buffer.from(String(a));
  const right = Buffer.from(String(b));
  return left.length === right.length && timingSafeEqual(left, right);
}

/**
 * The fake agent: 200 `{"reply"}` naming the event ids it answers, or (a share)
 * 202 and the reply later through `POST /v1/runs/{id}/reply`, retried while the
 * gateway is down, or (a share) 503 so the gateway retries the hand-off. For the
 * keys in `slowKeys` it takes `slowMs` longer (either way), so that their next
 * messages arrive while the run is open and wait for the next run.
 */
export class FakeAgent {
  constructor({ port, token, gatewayOrigin, runTag, next, asyncShare, failShare, slowKeys = new Set(), slowMs = 0 }) {
    Object.assign(this, { port, token, gatewayOrigin, runTag, next, asyncShare, failShare, slowKeys, slowMs });
    this.handoffs = 0;
    this.answers = { 200: 0, 202: 0, 503: 0 };
    this.seen = new Map(); // event id -> hand-offs that carried it
    this.runs = new Map(); // run id -> hand-offs of that run
    this.carriedBy = new Map(); // event id -> the distinct run ids whose hand-offs carried it (503s too)
    this.runMessages = new Map(); // run id -> the event ids its first hand-off carried
    this.story = new Map(); // event id -> what the agent answered for it, in order (for a failure's details)
    this.laterReplies = { recorded: 0, refused: {}, attempts: 0, pending: 0 };
    this.badAuth = 0;
    this.stopped = false;
  }

  async start() {
    this.server = await listen((request, response) => this.handle(request, response), this.port);
  }

  replyText(eventIds) {
    return `re ${eventIds.join(" ")}`;
  }

  async handle(request, response) {
    const raw = await readBody(request);
    if (request.headers.authorization !== `Bearer ${this.token}`) {
      this.badAuth += 1;
      return answer(response, 401, { error: "bad token" });
    }
    const body = JSON.parse(raw.toString("utf8"));
    this.handoffs += 1;
    const carried = (body.messages?.length ? body.messages : [body.message]).map((m) => m.event_id);
    for (const id of carried) this.carriedBy.set(id, new Set([...(this.carriedBy.get(id) ?? []), body.run_id]));
    if (!this.runMessages.has(body.run_id)) this.runMessages.set(body.run_id, carried);
    const slow = this.slowKeys.has(body.session?.key) ? this.slowMs : 0;
    const roll = this.next();
    const tell = (what) => {
      for (const id of carried) this.story.set(id, [...(this.story.get(id) ?? []), `${body.run_id}: ${what}`]);
    };
    if (roll < this.failShare) {
      this.answers[503] += 1;
      tell("503");
      return answer(response, 503, { error: "the fake agent is having a bad moment" });
    }
    // Seen once answered 200 or 202: a 503 hands nothing over.
    for (const id of carried) this.seen.set(id, (this.seen.get(id) ?? 0) + 1);
    this.runs.set(body.run_id, (this.runs.get(body.run_id) ?? 0) + 1);
    const text = this.replyText(carried);
    if (roll < this.failShare + this.asyncShare) {
      this.answers[202] += 1;
      tell("202");
      answer(response, 202, { accepted: true });
      this.replyLater(body.run_id, body.run_token, text, slow + 100 + Math.floor(this.next() * 1400), tell);
      return;
    }
    this.answers[200] += 1;
    tell("200 with the reply");
    if (slow > 0) await sleep(slow);
    return answer(response, 200, { reply: text });
  }

  /** Posts the reply of a 202 run, retrying (also across gateway kills) until 200 or 409. */
  async replyLater(runId, runToken, text, delayMs, tell) {
    this.laterReplies.pending += 1;
    try {
      await sleep(delayMs);
      while (!this.stopped) {
        this.laterReplies.attempts += 1;
        try {
          const response = await fetch(`${this.gatewayOrigin}/v1/runs/${encodeURIComponent(runId)}/reply`, {
            method: "POST",
            headers: { authorization: `Bearer ${runToken}`, "content-type": "application/json" },
            body: JSON.stringify({ text }),
            signal: AbortSignal.timeout(10_000),
          });
          const answerText = await response.text();
          if (response.status === 200) {
            this.laterReplies.recorded += 1;
            tell("its later reply was recorded");
            return;
          }
          if (response.status === 409) {
            // `finished`: a hand-off repeated after a restart was already answered; fine.
            const reason = JSON.parse(answerText).reason ?? "409";
            this.laterReplies.refused[reason] = (this.laterReplies.refused[reason] ?? 0) + 1;
            tell(`its later reply was refused 409 ${reason}`);
            return;
          }
        } catch {
          // the gateway is down (killed): try again
        }
        await sleep(500);
      }
    } finally {
      this.laterReplies.pending -= 1;
    }
  }

  async stop() {
    this.stopped = true;
    if (this.server) await closeServer(this.server);
  }
}

/** Lifecycle events at HOOK_URLS: checks the signature, records each event id and its deliveries. */
export class HookReceiver {
  constructor({ port, secret, next, failShare }) {
    Object.assign(this, { port, secret, next, failShare });
    this.events = new Map(); // event id -> { type, session_id, reason, deliveries, body }
    this.refused = 0;
    this.badSignatures = 0;
  }

  async start() {
    this.server = await listen((request, response) => this.handle(request, response), this.port);
  }

  async handle(request, response) {
    const raw = await readBody(request);
    const header = String(request.headers["x-sessiongate-signature"] ?? "");
    if (!sameHex(header, `sha256=${hmacHex(this.secret, raw)}`)) {
      this.badSignatures += 1;
      return answer(response, 401, { error: "bad signature" });
    }
    if (this.next() < this.failShare) {
      this.refused += 1;
      return answer(response, 500, { error: "the hook receiver is having a bad moment" });
    }
    const body = JSON.parse(raw.toString("utf8"));
    if (request.headers["x-sessiongate-event"] !== body.id) this.badSignatures += 1;
    const known = this.events.get(body.id);
    if (known) known.deliveries += 1;
    else this.events.set(body.id, { ...body, deliveries: 1 });
    return answer(response, 200, { ok: true });
  }

  /** session id -> distinct ids of the `session.finalized` events received for it. */
  finalizedBySession() {
    const out = new Map();
    for (const event of this.events.values()) {
      if (event.type !== "session.finalized") continue;
      if (!out.has(event.session_id)) out.set(event.session_id, []);
      out.get(event.session_id).push(event.id);
    }
    return out;
  }

  async stop() {
    if (this.server) await closeServer(this.server);
  }
}

/** Replies at GENERIC_REPLY_URL: records each delivery id and the event ids its text answers. */
export class ReplyReceiver {
  constructor({ port, runTag, next, failShare }) {
    Object.assign(this, { port, runTag, next, failShare });
    this.deliveries = new Map(); // delivery id (event_id of the body) -> { body, count }
    this.answered = new Map(); // user event id -> distinct deliveries that answered it
    this.refused = 0;
  }

  async start() {
    this.server = await listen((request, response) => this.handle(request, response), this.port);
  }

  async handle(request, response) {
    const raw = await readBody(request);
    if (this.next() < this.failShare) {
      this.refused += 1;
      return answer(response, 500, { error: "the reply receiver is having a bad moment" });
    }
    const body = JSON.parse(raw.toString("utf8"));
    const known = this.deliveries.get(body.event_id);
    if (known) {
      known.count += 1;
    } else {
      this.deliveries.set(body.event_id, { body, count: 1 });
      if (body.kind === "reply") {
        for (const id of eventIdsIn(body.text, this.runTag)) this.answered.set(id, (this.answered.get(id) ?? 0) + 1);
      }
    }
    return answer(response, 200, { ok: true });
  }

  async stop() {
    if (this.server) await closeServer(this.server);
  }
}
