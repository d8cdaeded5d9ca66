#!/bin/sh
# npm start: apply the local D1 migrations, then run the gateway with wrangler dev
# on the embedded D1 and Durable Objects. Arguments after `--` go to wrangler dev;
# a `--persist-to DIR` among them is given to the migrations too, so both use
# the same local state.
set -e
# Nothing here needs the internet: no telemetry, no Request.cf download.
export WRANGLER_SEND_METRICS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
persist=""
previous=""
for arg in "$@"; do
  case "$arg" in
    --persist-to=*) persist="$arg" ;;
  esac
  if [ "$previous" = "--persist-to" ]; then persist="--persist-to=$arg"; fi
  previous="$arg"
done
npx wrangler d1 migrations apply DB --local $persist
exec npx wrangler dev "$@"
