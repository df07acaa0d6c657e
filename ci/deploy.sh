#!/usr/bin/env bash
# What can be checked of deploy/ on a machine without a container engine or a cluster:
# the Prometheus alert rules (promtool check + unit tests) and the systemd units (systemd-analyze
# verify, against the release binary). Installs Debian's prometheus package for promtool when it
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[deploy] %s\n' "$*"; }

if ! command -v promtool >/dev/null; then
  say "installing prometheus (for promtool)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q prometheus >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; }
fi
say "alert rules"
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml)

say "systemd units"
cargo build --release -q --bin seckill
bin="$PWD/target/release/seckill"
units=$(mktemp -d)
trap 'rm -rf "$units"' EXIT
# The units name the installed binary; verify them against the one just built.
for unit in deploy/systemd/*.service; do
  sed "s#/usr/local/bin/seckill#$bin#" "$unit" >"$units/$(basename "$unit")"
done
# systemd-analyze exits 0 on unknown keys and other warnings: any output is a failure here.
out=$(systemd-analyze verify "$units"/*.service 2>&1 || true)
if [ -n "$out" ]; then
  printf '%s\n' "$out" >&2
  exit 1
fi
for unit in deploy/systemd/*.service; do
  role=$(basename "$unit" .service); role=${role#seckill-}
  grep -q -- "--roles $role\$" "$unit" || { echo "$unit does not run the role $role" >&2; exit 1; }
done
say "ok"
