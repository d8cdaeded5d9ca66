#!/usr/bin/env bash
# Runs the README's try-it block as pasted, in a fresh copy of the repository (its
# tracked and unignored files: no .dev.vars, no local state; node_modules linked),
# on README_CHECK_PORT instead of 8787, then checks what it answered and stops
# every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PORT=${README_CHECK_PORT:-8841}
INSPECTOR_PORT=${README_CHECK_INSPECTOR_PORT:-8842}
work=$(mktemp -d /tmp/sessiongate-readme.XXXXXX)
group=""
cleanup() {
  if [ -n "$group" ]; then kill -TERM -- "-$group" 2>/dev/null || true; sleep 1; kill -KILL -- "-$group" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$work"
rm -f "$work/.dev.vars"
ln -s "$ROOT/node_modules" "$work/node_modules"

# The first ```sh block after the try-it marker.
block=$(awk '/<!-- try-it/ {armed=1; next} armed && /^```sh$/ {inside=1; next} inside && /^```$/ {exit} inside {print}' README.md)
if [ -z "$block" ]; then
  echo "readme-check: no try-it block found in README.md"
  exit 1
fi
# Only the port changes (and the inspector's, so that it does not clash either).
script=$(printf '%s\n' "$block" |
  sed -e "s/localhost:8787/localhost:$PORT/g" \
    -e "s/^npm start /npm start -- --port $PORT --inspector-port $INSPECTOR_PORT /")

echo "readme-check: running the try-it block on port $PORT in $work"
(cd "$work" && exec setsid bash -euo pipefail -c "$script") >"$work/answers.txt" 2>&1 </dev/null &
group=$!
status=0
timeout 240 tail --pid="$group" -f /dev/null || status=$?
wait "$group" || status=$?
answers=$(cat "$work/answers.txt")
log=$(cat "$work/gateway.log" 2>/dev/null || true)
echo "$answers"
fail() {
  echo "readme-check: $1"
  echo "--- gateway.log"
  echo "$log" | tail -40
  exit 1
}
[ "$status" -eq 0 ] || fail "the block failed (exit $status)"
grep -q '"accepted":true' <<<"$answers" || fail "the signed curl was not accepted"
grep -q '"session_key":"generic:dm:42"' <<<"$answers" || fail "the admin listing does not show the session"
grep -q 'development values of .dev.vars.example' <<<"$log" || fail "npm start did not say it runs on .dev.vars.example"
echo "readme-check: ok"
