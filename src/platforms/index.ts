/** Every platform adapter, by name (its webhook path and the `platform` of its reply targets). */
import { discord } from "./discord";
import { generic } from "./generic";
import { slack } from "./slack";
import { telegram } from "./telegram";
import { whatsapp } from "./whatsapp";
import type { PlatformAdapter, PlatformSender } from "./types";

export const ADAPTERS: readonly PlatformAdapter<any>[] = [generic, telegram, slack, discord, whatsapp];

const BY_NAME = new Map(ADAPTERS.map((adapter) => [adapter.name, adapter]));

export function senderFor(platform: string): PlatformSender | null {
  return BY_NAME.get(platform)?.sender ?? null;
}
