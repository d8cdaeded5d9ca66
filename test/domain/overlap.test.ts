/** `OVERLAP`: parsing with errors naming the key, and the layering platform > chat type > default. */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ConfigError, parseConfigFresh, type ConfigEnv } from "../../src/config";
import {
  DEFAULT_OVERLAP,
  OVERLAP_MODES,
  resolveOverlap,
  type OverlapConfig,
  type OverlapSettings,
} from "../../src/domain/overlap";
import { PLATFORMS } from "../../src/domain/session-key";

function configError(env: ConfigEnv): ConfigError {
  try {
    parseConfigFresh(env);
  } catch (error) {
    if (error instanceof ConfigError) return error;
    throw error;
  }
  throw new Error("expected a ConfigError");
}

describe("OVERLAP parsing", () => {
  it("defaults to queue, no debounce, 20 a run", () => {
    expect(DEFAULT_OVERLAP).toEqual({ mode: "queue", debounce_ms: 0, max_batch: 20 });
    expect(parseConfigFresh({}).overlap).toEqual({});
    expect(parseConfigFresh({ OVERLAP: "  " }).overlap).toEqual({});
    expect(resolveOverlap({}, "telegram", "dm")).toEqual({ ...DEFAULT_OVERLAP, source: "default" });
  });

  it.each([
    { json: '{"mode":"interrupt"}', expected: { mode: "interrupt" } },
    { json: '{"mode":"concurrent","debounce_ms":0}', expected: { mode: "concurrent", debounce_ms: 0 } },
    { json: '{"debounce_ms":1500,"max_batch":1}', expected: { debounce_ms: 1500, max_batch: 1 } },
    { json: '{"debounce_ms":600000,"max_batch":1000}', expected: { debounce_ms: 600000, max_batch: 1000 } },
    {
      json: '{"by_platform":{"telegram":{"debounce_ms":800}},"by_chat_type":{"group":{"mode":"interrupt"}}}',
      expected: { by_platform: { telegram: { debounce_ms: 800 } }, by_chat_type: { group: { mode: "interrupt" } } },
    },
  ])("accepts $json", ({ json, expected }) => {
    expect(parseConfigFresh({ OVERLAP: json }).overlap).toEqual(expected);
  });

  it.each([
    { label: "invalid JSON", json: "{mode: queue}", key: "OVERLAP", mentions: "JSON" },
    { label: "not an object", json: "[]", key: "OVERLAP", mentions: null },
    { label: "an unknown field", json: '{"mode":"queue","debounce":5}', key: "OVERLAP", mentions: "debounce" },
    { label: "a bad mode", json: '{"mode":"parallel"}', key: "OVERLAP.mode", mentions: null },
    { label: "a negative debounce_ms", json: '{"debounce_ms":-1}', key: "OVERLAP.debounce_ms", mentions: null },
    { label: "a fractional debounce_ms", json: '{"debounce_ms":1.5}', key: "OVERLAP.debounce_ms", mentions: null },
    { label: "a debounce_ms over 10 min", json: '{"debounce_ms":600001}', key: "OVERLAP.debounce_ms", mentions: null },
    { label: "debounce_ms as a string", json: '{"debounce_ms":"5"}', key: "OVERLAP.debounce_ms", mentions: null },
    { label: "max_batch 0", json: '{"max_batch":0}', key: "OVERLAP.max_batch", mentions: null },
    { label: "max_batch over 1000", json: '{"max_batch":1001}', key: "OVERLAP.max_batch", mentions: null },
    { label: "a fractional max_batch", json: '{"max_batch":2.5}', key: "OVERLAP.max_batch", mentions: null },
    {
      label: "a misspelt platform",
      json: '{"by_platform":{"telegarm":{"mode":"queue"}}}',
      key: "OVERLAP.by_platform",
      mentions: "telegarm",
    },
    {
      label: "an unknown field in a by_platform entry",
      json: '{"by_platform":{"slack":{"max":2}}}',
      key: "OVERLAP.by_platform.slack",
      mentions: "max",
    },
    {
      label: "a bad by_chat_type mode",
      json: '{"by_chat_type":{"group":{"mode":"all"}}}',
      key: "OVERLAP.by_chat_type.group.mode",
      mentions: null,
    },
    {
      label: "an unknown chat type",
      json: '{"by_chat_type":{"thread":{"mode":"queue"}}}',
      key: "OVERLAP.by_chat_type",
      mentions: "thread",
    },
  ])("rejects $label, naming $key", ({ json, key, mentions }) => {
    const error = configError({ OVERLAP: json });
    expect(error.key).toBe(key);
    expect(error.message.startsWith(`${key}: `)).toBe(true);
    if (mentions) expect(error.message).toContain(mentions);
  });

  it("names every key at fault, OVERLAP's and the others'", () => {
    const error = configError({ OVERLAP: '{"mode":"x","max_batch":0}', SESSION_RESET: '{"mode":"weekly"}' });
    expect(error.keys).toEqual(expect.arrayContaining(["OVERLAP.mode", "OVERLAP.max_batch", "SESSION_RESET.mode"]));
  });
});

describe("resolveOverlap layering", () => {
  it.each([
    ["telegram", "group", { mode: "concurrent", debounce_ms: 100, max_batch: 5 }, "by_platform"],
    ["generic", "group", { mode: "interrupt", debounce_ms: 100, max_batch: 5 }, "by_chat_type"],
    ["generic", "dm", { mode: "queue", debounce_ms: 100, max_batch: 20 }, "default"],
    ["telegram", "dm", { mode: "concurrent", debounce_ms: 100, max_batch: 20 }, "by_platform"],
  ] as const)("%s %s", (platform, chatType, expected, source) => {
    const config: OverlapConfig = {
      debounce_ms: 100,
      by_chat_type: { group: { mode: "interrupt", max_batch: 5 } },
      by_platform: { telegram: { mode: "concurrent" } },
    };
    expect(resolveOverlap(config, platform, chatType)).toEqual({ ...expected, source });
  });

  const partial = fc.record(
    {
      mode: fc.constantFrom(...OVERLAP_MODES),
      debounce_ms: fc.integer({ min: 0, max: 600_000 }),
      max_batch: fc.integer({ min: 1, max: 1000 }),
    },
    { requiredKeys: [] },
  );
  const platform = fc.constantFrom(...PLATFORMS);
  const chatType = fc.constantFrom("dm" as const, "group" as const, "channel" as const);
  const config = fc.record(
    {
      mode: fc.constantFrom(...OVERLAP_MODES),
      debounce_ms: fc.integer({ min: 0, max: 600_000 }),
      max_batch: fc.integer({ min: 1, max: 1000 }),
      by_platform: fc.dictionary(platform, partial, { maxKeys: 3 }),
      by_chat_type: fc.dictionary(chatType, partial, { maxKeys: 3 }),
    },
    { requiredKeys: [] },
  ) as fc.Arbitrary<OverlapConfig>;

  const FIELDS = ["mode", "debounce_ms", "max_batch"] as const;

  it("each field comes from the platform, else the chat type, else the top level, else the default", () => {
    fc.assert(
      fc.property(config, platform, chatType, (cfg, p, c) => {
        const resolved = resolveOverlap(cfg, p, c);
        const layers = [cfg.by_platform?.[p], cfg.by_chat_type?.[c], cfg, DEFAULT_OVERLAP];
        for (const field of FIELDS) {
          const winner = layers.find((layer) => layer?.[field] !== undefined) as OverlapSettings;
          expect(resolved[field]).toBe(winner[field]);
        }
        const source = cfg.by_platform?.[p] ? "by_platform" : cfg.by_chat_type?.[c] ? "by_chat_type" : "default";
        expect(resolved.source).toBe(source);
      }),
      { numRuns: 500 },
    );
  });

  it("whatever the config says, what it parses to resolves to a valid setting", () => {
    fc.assert(
      fc.property(config, platform, chatType, (cfg, p, c) => {
        const parsed = parseConfigFresh({ OVERLAP: JSON.stringify(cfg) }).overlap;
        expect(parsed).toEqual(cfg);
        const resolved = resolveOverlap(parsed, p, c);
        expect(OVERLAP_MODES).toContain(resolved.mode);
        expect(Number.isInteger(resolved.debounce_ms) && resolved.debounce_ms >= 0).toBe(true);
        expect(Number.isInteger(resolved.max_batch) && resolved.max_batch >= 1).toBe(true);
      }),
      { numRuns: 200 },
    );
  });

  it("an override for another platform or chat type changes nothing", () => {
    fc.assert(
      fc.property(config, partial, platform, chatType, (cfg, extra, p, c) => {
        const before = resolveOverlap(cfg, p, c);
        const otherPlatform = PLATFORMS.find((q) => q !== p)!;
        const otherChat = (["dm", "group", "channel"] as const).find((q) => q !== c)!;
        const widened: OverlapConfig = {
          ...cfg,
          by_platform: { ...cfg.by_platform, [otherPlatform]: extra },
          by_chat_type: { ...cfg.by_chat_type, [otherChat]: extra },
        };
        expect(resolveOverlap(widened, p, c)).toEqual(before);
      }),
      { numRuns: 300 },
    );
  });
});
