/** The telegram adapter: not built yet, so the platform stays off (its webhook answers 404). */
import type { PlatformAdapter } from "../types";

export const telegram: PlatformAdapter<never> = {
  name: "telegram",
  methods: ["POST"],
  settings: () => null,
  handle: async () => {
    throw new Error("telegram is not built yet");
  },
  sender: {
    canDeliver: () => false,
    send: async () => ({ ok: false, retryable: false, retryAfterMs: null, status: null, error: "telegram is not built yet" }),
  },
};
