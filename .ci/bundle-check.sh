#!/usr/bin/env bash
# The deployed bundle stays small: wrangler's own dry run (minified, as deployed),
# under a budget, and without zod's locale files (a `import { z } from "zod"` or a
# locale import anywhere pulls in all of them: write `import * as z from "zod"`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET_BYTES=${BUNDLE_BUDGET_BYTES:-409600}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
WRANGLER_SEND_METRICS=false npx wrangler deploy --dry-run --outdir "$out" >"$out/log" 2>&1 || {
  cat "$out/log"
  exit 1
}
size=$(wc -c <"$out/index.js")
gz=$(gzip -9c "$out/index.js" | wc -c)
locales=$(grep -o 'zod/v4/locales/[a-zA-Z-]*\.js' "$out/index.js.map" | sort -u | grep -v '/en\.js$' || true)
echo "bundle: $size bytes, gzip $gz bytes (budget $BUDGET_BYTES)"
if [ -n "$locales" ]; then
  echo "bundle carries zod locale files (import zod as \`import * as z from \"zod\"\`):" $locales
  exit 1
fi
if [ "$size" -gt "$BUDGET_BYTES" ]; then
  echo "bundle over budget"
  exit 1
fi
