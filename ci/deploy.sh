#!/usr/bin/env bash
# What can be checked of deploy/ on a machine without a container engine or a cluster:
# the Prometheus alert rules (promtool check + unit tests), the systemd units (systemd-analyze
# verify, against the release binary), and that the Dockerfile's runtime stage installs every
# package the release binary's shared libraries come from. Installs Debian's prometheus package
# for promtool when it is missing.
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
say "image: the runtime stage installs every package the binary's shared libraries come from"
runtime=$(awk '/^FROM .* AS runtime/ {on=1} on' deploy/Dockerfile | tr -d '\\' | tr '\n' ' ')
for lib in $(ldd "$bin" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}'); do
  pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true)
  pkg=${pkg%%:*}
  [ -n "$pkg" ] || { echo "no Debian package owns $lib" >&2; exit 1; }
  case " $runtime " in
    *" $pkg "*) ;;
    *) echo "deploy/Dockerfile: the runtime stage does not install $pkg (for $lib)" >&2; exit 1 ;;
  esac
done
say "ok"
