/** The discord adapter: not built yet, so the platform stays off (its webhook answers 404). */
import type { PlatformAdapter } from "../types";

export const discord: PlatformAdapter<never> = {
  name: "discord",
  methods: ["POST"],
  settings: () => null,
  handle: async () => {
    throw new Error("discord is not built yet");
  },
  sender: {
    canDeliver: () => false,
    send: async () => ({ ok: false, retryable: false, retryAfterMs: null, status: null, error: "discord is not built yet" }),
  },
};
