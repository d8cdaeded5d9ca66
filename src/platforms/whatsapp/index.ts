/** The whatsapp adapter: not built yet, so the platform stays off (its webhook answers 404). */
import type { PlatformAdapter } from "../types";

export const whatsapp: PlatformAdapter<never> = {
  name: "whatsapp",
  methods: ["POST"],
  settings: () => null,
  handle: async () => {
    throw new Error("whatsapp is not built yet");
  },
  sender: {
    canDeliver: () => false,
    send: async () => ({ ok: false, retryable: false, retryAfterMs: null, status: null, error: "whatsapp is not built yet" }),
  },
};
