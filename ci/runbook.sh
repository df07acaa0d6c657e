#!/usr/bin/env bash
# The runbook's "During a sale" block (docs/operations.md), run as an operator pastes it: the words
# are taken from the runbook itself, against a `seckill serve` on the ci/services.sh stores (the
# block's `seckill audit` / `seckill reconcile` read the same stores from a shell). Two things are
# not the runbook's: the activity id is a fresh one instead of 42 (the stores outlive a run), and
# user 7 buys a unit right after the create (the block reads and cancels user 7's order). Every
# curl must answer 2xx and every command exit 0. Needs the stores' settings (ci/test.sh runs it
# after sourcing them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

fail() { echo "runbook: $*" >&2; exit 1; }
[ -n "${REDIS_URL:-}" ] && [ -n "${DATABASE_URL:-}" ] && [ -n "${KAFKA_BROKERS:-}" ] \
  || fail "no store settings: source target/services/env (ci/services.sh) first"

block=$(awk '/^## During a sale/ { s = 1; next } s && /^## / { exit }
  s && /^```/ { if (inb) exit; inb = 1; next } s && inb' docs/operations.md)
[ -n "$block" ] || fail "docs/operations.md has no command block under 'During a sale'"
id=$(( $(date +%s) % 100000000 + 1000000 ))

cargo build -q --release --bin seckill
work=$(mktemp -d)
export SECKILL_ADMIN_TOKEN=runbook-admin-token-$id SECKILL_TOKEN_SECRET=runbook-token-secret-0123456789abcdef
export SECKILL_JWT_SECRET=runbook-jwt-secret-0123456789abcdefghij SECKILL_PAYMENT_SECRET=runbook-payment-secret
export SECKILL_JWT_AUDIENCE=seckill
"$root/target/release/seckill" serve > "$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 240); do
  curl -sf localhost:9090/readyz > /dev/null && break
  kill -0 $server 2>/dev/null || { cat "$work/serve.log"; fail "seckill serve exited"; }
  sleep 0.5
done
curl -sf localhost:9090/readyz > /dev/null || { tail -20 "$work/serve.log"; fail "seckill serve is not ready after 120 s"; }

# The block, one line at a time, in one shell; `curl` checks the status of every answer.
script=$work/block.sh
{
  echo "set -euo pipefail"
  echo "cd '$work'"
  echo "seckill() { '$root/target/release/seckill' \"\$@\"; }"
  cat <<'EOF'
curl() {
  local out code
  out=$(command curl -sS -w '\n%{http_code}' "$@") || return 1
  code=${out##*$'\n'}
  printf '%s\n' "${out%$'\n'*}"
  [[ $code == 2* ]] || { echo "runbook: HTTP $code from curl $*" >&2; return 1; }
}
EOF
  while IFS= read -r line; do
    printf 'echo %q\n' "\$ $line"
    printf '%s\n' "$line"
    if [[ "$line" == "seckill admin create "* ]]; then
      # Not the runbook's: user 7 buys a unit, and the worker applies it.
      cat <<EOF
J=\$(seckill jwt --user 7)
T=\$(curl -s -X POST localhost:8080/api/v1/activities/$id/token -H "authorization: Bearer \$J" | sed 's/.*"token":"\\([^"]*\\)".*/\\1/')
curl -s -X POST localhost:8080/api/v1/activities/$id/purchase -H "authorization: Bearer \$J" --json '{"token": "'\$T'"}'
for _ in \$(seq 60); do seckill admin order $id 7 | grep -q '^state: created' && break; sleep 0.5; done
EOF
    fi
  done <<< "$(sed -E "s/\b42\b/$id/g" <<< "$block")"
} > "$script"
bash "$script" || { tail -20 "$work/serve.log"; fail "the block stopped (the line above)"; }
echo "runbook: every command of 'During a sale' answered (activity $id)"
