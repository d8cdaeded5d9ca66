/** The senders of every platform, by the `platform` name carried in a reply target. */
import { genericSender } from "./generic";
import type { PlatformSender } from "./types";

const SENDERS: Record<string, PlatformSender> = {
  generic: genericSender,
};

export function senderFor(platform: string): PlatformSender | null {
  return SENDERS[platform] ?? null;
}
