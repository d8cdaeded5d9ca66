/** Health, this document, and the platform webhooks. */
import { genericBodySchema } from "../../platforms/generic";
import { eventCallbackSchema, urlVerificationSchema } from "../../platforms/slack/events";
import { interactionHeadSchema } from "../../platforms/discord/interactions";
import { updateSchema } from "../../platforms/telegram/update";
import { payloadSchema } from "../../platforms/whatsapp/payload";
import * as answers from "../responses";
import type { Operation } from "./types";

const SIGNED = "Verified by the platform's own signature scheme (see docs/platforms/).";

export const HEALTH_AND_INGRESS: Operation[] = [
  {
    method: "get",
    path: "/healthz",
    summary: "Health: configuration valid and D1 reachable",
    tag: "health",
    auth: "none",
    ok: answers.healthAnswer,
    also: [503],
  },
  { method: "get", path: "/openapi.json", summary: "This document", tag: "health", auth: "none", ok: "text" },
  // Ingress
  {
    method: "post",
    path: "/webhooks/generic",
    summary: "A message from a custom client",
    description: "Header `X-Signature-256: sha256=<hex HMAC-SHA256 of the raw body with GENERIC_WEBHOOK_SECRET>`.",
    tag: "ingress",
    auth: "none",
    body: genericBodySchema,
    ok: answers.acceptedAnswer,
    also: [413],
  },
  {
    method: "post",
    path: "/webhooks/telegram",
    summary: "A Telegram update",
    description: `${SIGNED} Header \`X-Telegram-Bot-Api-Secret-Token\`.`,
    tag: "ingress",
    auth: "none",
    body: updateSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "post",
    path: "/webhooks/slack",
    summary: "A Slack Events API callback, url_verification or slash command",
    description: `${SIGNED} Slack v0 signing.`,
    tag: "ingress",
    auth: "none",
    body: eventCallbackSchema.or(urlVerificationSchema),
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "post",
    path: "/webhooks/discord",
    summary: "A Discord interaction (PING or command)",
    description: `${SIGNED} Ed25519.`,
    tag: "ingress",
    auth: "none",
    body: interactionHeadSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
  {
    method: "get",
    path: "/webhooks/whatsapp",
    summary: "WhatsApp verification challenge",
    tag: "ingress",
    auth: "none",
    ok: "text",
    also: [403, 404],
  },
  {
    method: "post",
    path: "/webhooks/whatsapp",
    summary: "A WhatsApp Cloud API notification",
    description: `${SIGNED} \`X-Hub-Signature-256\`.`,
    tag: "ingress",
    auth: "none",
    body: payloadSchema,
    ok: answers.retriedAnswer,
    also: [404, 413],
  },
];
