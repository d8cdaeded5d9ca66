/**
 * Reading a platform's secrets and API base (src/platforms/settings.ts): the
 * configuration errors an operator reads name the key and say what is wrong.
 */
import { describe, expect, it } from "vitest";
import { ConfigError } from "../../src/config";
import { apiBase, requiredSecrets } from "../../src/platforms/settings";
import type { PlatformEnv } from "../../src/platforms/types";

const env = (values: Record<string, string>) => values as unknown as PlatformEnv;
const thrown = (run: () => unknown): ConfigError => {
  try {
    run();
  } catch (error) {
    return error as ConfigError;
  }
  throw new Error("expected a ConfigError");
};

describe("requiredSecrets", () => {
  it("off with none set, every value trimmed when all are, and each missing key named when some are", () => {
    expect(requiredSecrets(env({ A: " ", B: "" }), ["A", "B"])).toBeNull();
    expect(requiredSecrets(env({ A: " a ", B: "b" }), ["A", "B"])).toEqual({ A: "a", B: "b" });
    const error = thrown(() => requiredSecrets(env({ A: "a" }), ["A", "B", "C"]));
    expect(error.keys).toEqual(["B", "C"]);
    expect(error.detail).toBe("is required when the platform's other secrets are set");
  });
});

describe("apiBase", () => {
  it("the default when unset; a set value without its trailing slashes", () => {
    expect(apiBase(env({}), "X_API_BASE", "https://default.test/api")).toBe("https://default.test/api");
    expect(apiBase(env({ X_API_BASE: " http://fake.test/api// " }), "X_API_BASE", "https://d.test")).toBe(
      "http://fake.test/api",
    );
  });

  it.each([
    ["not a URL", "fake.test/api", "is not a URL"],
    ["another scheme", "ftp://fake.test/api", "must be an http(s) URL"],
  ])("refuses %s, naming the key", (_what, value, detail) => {
    const error = thrown(() => apiBase(env({ X_API_BASE: value }), "X_API_BASE", "https://d.test"));
    expect(error).toBeInstanceOf(ConfigError);
    expect([error.key, error.detail]).toEqual(["X_API_BASE", detail]);
  });
});
