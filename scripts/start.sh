#!/bin/sh
# npm start: apply the local D1 migrations, then run the gateway with wrangler dev
# on the embedded D1 and Durable Objects. Arguments after `--` go to wrangler dev.
set -e
# Nothing here needs the internet: no telemetry, no Request.cf download.
export WRANGLER_SEND_METRICS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
npx wrangler d1 migrations apply DB --local
exec npx wrangler dev "$@"
