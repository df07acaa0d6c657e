#!/usr/bin/env bash
# The OpenAPI document against a live `seckill serve` (embedded stores), with schemathesis
# (PyPI): every documented operation gets a bounded number of generated requests — the buyers'
# routes on the public listener with a user's JWT, the operator's on the admin listener with the
# admin token — and no answer may be a 5xx or differ from the document (status, content type,
# schema). ci/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/schemathesis
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'schemathesis>=4,<5'
fi
cargo build --release -q --bin seckill
bin=target/release/seckill
port=$((20000 + RANDOM % 10000)) admin=$((30000 + RANDOM % 10000))
env -u REDIS_URL -u KAFKA_BROKERS -u DATABASE_URL SECKILL_LOG=warn \
  SECKILL_ADMIN_TOKEN=schemathesis-admin-token SECKILL_PAYMENT_SECRET=schemathesis-payment \
  SECKILL_JWT_SECRET=schemathesis-jwt-secret-0123456789abcdef \
  "$bin" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" > target/schemathesis/serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "localhost:$admin/healthz" > /dev/null && break; sleep 0.2; done
now=$(date +%s%3N)
curl -sf -X POST "localhost:$admin/api/v1/admin/activities" -H 'authorization: Bearer schemathesis-admin-token' \
  -d '{"id": 1, "total_stock": 100, "buckets": 4, "fallback_pct": 10, "start_ms": '"$now"', "end_ms": '"$((now + 3600000))"', "pay_timeout_ms": 900000}' > /dev/null
jwt=$(SECKILL_JWT_SECRET=schemathesis-jwt-secret-0123456789abcdef "$bin" jwt --user 1)
checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
run() { "$venv/bin/st" run engine/openapi.json -n 30 --seed 1 --generation-database none -c "$checks" "$@"; }
run -u "http://127.0.0.1:$port" -H "Authorization: Bearer $jwt" --exclude-path-regex '^/(api/v1/admin|metrics|readyz)'
run -u "http://127.0.0.1:$admin" -H 'Authorization: Bearer schemathesis-admin-token' --include-path-regex '^/(api/v1/admin|metrics|readyz|healthz)'
echo "schemathesis: both listeners answer as the document says"
