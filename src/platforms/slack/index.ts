/** The slack adapter: not built yet, so the platform stays off (its webhook answers 404). */
import type { PlatformAdapter } from "../types";

export const slack: PlatformAdapter<never> = {
  name: "slack",
  methods: ["POST"],
  settings: () => null,
  handle: async () => {
    throw new Error("slack is not built yet");
  },
  sender: {
    canDeliver: () => false,
    send: async () => ({ ok: false, retryable: false, retryAfterMs: null, status: null, error: "slack is not built yet" }),
  },
};
