#!/bin/sh
# npm start: apply the local D1 migrations, then run the gateway with wrangler dev
# on the embedded D1 and Durable Objects. Arguments after `--` go to wrangler dev;
# a `--persist-to DIR` among them is given to the migrations too, so both use
# the same local state. Without a .dev.vars (a fresh clone), the gateway starts on
# the development values of .dev.vars.example, and says so.
set -e
# Nothing here needs the internet: no telemetry, no Request.cf download.
export WRANGLER_SEND_METRICS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
persist=""
previous=""
env_file=""
for arg in "$@"; do
  case "$arg" in
    --persist-to=*) persist="$arg" ;;
    --env-file | --env-file=*) env_file="given" ;;
  esac
  if [ "$previous" = "--persist-to" ]; then persist="--persist-to=$arg"; fi
  previous="$arg"
done
npx wrangler d1 migrations apply DB --local $persist
if [ ! -f .dev.vars ] && [ -z "$env_file" ] && [ -f .dev.vars.example ]; then
  echo "sessiongate: no .dev.vars found; starting on the development values of .dev.vars.example"
  echo "sessiongate: copy it to .dev.vars to change them (a change of .dev.vars needs a restart)"
  exec npx wrangler dev --env-file .dev.vars.example "$@"
fi
exec npx wrangler dev "$@"
