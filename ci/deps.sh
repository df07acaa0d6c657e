#!/usr/bin/env bash
# The dependency rule (docs/architecture.md §2, STYLE rule 1): only engine/stores speaks to the real
# stores. Fails if
#   - a workspace crate other than seckill-stores depends on a store client (redis, sqlx,
#     rdkafka) — directly, or through anything it links in production (normal dependencies);
#     the binary crate's integration tests may reach the stores themselves (dev-dependencies);
#   - the core crate or the simulation links a store client, an HTTP server, or the crates
#     above the core (seckill-stores, seckill-api, seckill).
set -euo pipefail
cd "$(dirname "$0")/.."

clients='redis|sqlx|rdkafka'
fail=0
# Every crate a package links in production (normal edges only), one name per line.
linked() { cargo tree -q -p "$1" -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u; }

for p in seckill-core seckill-api seckill seckill-testkit seckill-invariants seckill-sim seckill-model; do
  own=$(cargo metadata -q --format-version 1 --no-deps | python3 -c "
import json, sys
m = json.load(sys.stdin)
pkg = next(p for p in m['packages'] if p['name'] == '$p')
print(' '.join(d['name'] for d in pkg['dependencies'] if d['kind'] is None))")
  for d in $own; do
    if [[ $d =~ ^($clients)$ ]]; then
      echo "deps: $p depends on the store client $d (only seckill-stores may)" >&2
      fail=1
    fi
  done
done

for p in seckill-core seckill-sim seckill-model; do
  bad=$(linked "$p" | grep -E "^($clients|axum|hyper|seckill-stores|seckill-api|seckill)$" || true)
  if [ -n "$bad" ]; then
    echo "deps: $p links $(echo "$bad" | tr '\n' ' ')(the core and the simulation link none of these)" >&2
    fail=1
  fi
done

[ "$fail" = 0 ] && echo "deps: only seckill-stores names a store client; the core and the simulation link none"
exit "$fail"
