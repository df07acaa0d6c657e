#!/usr/bin/env bash
# Fuzz the decoders of everything a client or a payment provider sends (DESIGN §12) under
# cargo fuzz (libFuzzer, nightly): request bodies and the callback body (purchase_body), purchase
# tokens (token), JWTs and callback signatures (identity), forwarding headers from a trusted proxy
# (forwarded), the login service's JWKS file (jwks). Each target starts from its committed
# corpus (engine/fuzz/corpus/<target>, left untouched: new inputs go to a scratch directory).
#
#   ci/fuzz.sh                  20 seconds per target, optimized build
#   ci/fuzz.sh 300              300 seconds per target
#   ci/fuzz.sh --runs 1000000   a million executions per target (the nightly run)
#   ci/fuzz.sh --dev 20         20 seconds per target on a debug build (what ci/test.sh runs:
#                               the debug build of the engine and its C libraries takes about
#                               half as long as the optimized one, which is most of the cost)
#
# A crash leaves its input under engine/fuzz/artifacts/<target>/ and fails the script (exit 1).
set -euo pipefail
cd "$(dirname "$0")/../engine"

profile=-O
if [ "${1:-}" = "--dev" ]; then
  profile=--dev
  shift
fi
limit="-max_total_time=${1:-20}"
if [ "${1:-}" = "--runs" ]; then
  limit="-runs=${2:?--runs needs a count}"
fi

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "[fuzz] installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked --quiet
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in purchase_body token identity forwarded jwks; do
  mkdir -p "$scratch/$target"
  echo "[fuzz] $target ($limit, $profile)"
  log="$scratch/$target.log"
  if ! cargo +nightly fuzz run --fuzz-dir fuzz "$profile" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
      "$limit" -print_final_stats=1 >"$log" 2>&1; then
    tail -60 "$log" >&2
    echo "[fuzz] $target failed (its input is under engine/fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | sed "s/^/[fuzz] $target /"
done
echo "[fuzz] ok"
