#!/usr/bin/env bash
# What can be checked of deploy/ on a machine without a container engine or a cluster:
# the Prometheus alert rules (promtool check + unit tests), the systemd units (systemd-analyze
# verify, against the release binary), that the Dockerfile's runtime stage installs every
# package the release binary's shared libraries come from, the Helm chart (helm lint, and
# `helm template` checked by ci/helm_check.py: each role's environment through
# `serve --check-config`, probes, ports, selectors, the optional parts on and off; the values
# schema refusing bad values), and the dashboard and alerts against a real
# Prometheus scraping the three roles on the real stores (ci/prometheus.py: needs the settings
# of ci/services.sh in the environment). Installs Debian's prometheus package when it is
# missing, and Helm from the Go module proxy into target/tools.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[deploy] %s\n' "$*"; }
HELM_VERSION=v3.22.0

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
say "helm chart"
helm=target/tools/bin/helm
if [ ! -x "$helm" ]; then
  say "installing helm $HELM_VERSION (go install, from the Go module proxy)"
  GOBIN="$PWD/target/tools/bin" GOFLAGS=-buildvcs=false go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml
chart=deploy/helm/seckill
render=(--kube-version 1.30.0 -f "$chart/ci/test-values.yaml")
# The chart's files/ links to the alert rules and the dashboard tested below; helm says so on
# stderr ("found symbolic link"), which is expected.
quiet() { "$@" 2> >(grep -v "found symbolic link" >&2); }
lint() { quiet "$helm" lint --strict "$chart" "$@"; }
template() { quiet "$helm" template seckill "$chart" "$@"; }
lint "${render[@]}"
# Without the secrets it refuses to render, naming the value.
if out=$("$helm" template seckill "$chart" --kube-version 1.30.0 2>&1); then
  echo "the chart rendered without its secrets" >&2; exit 1
fi
grep -q "secrets.adminToken is required" <<<"$out" || { printf '%s\n' "$out" >&2; exit 1; }
template "${render[@]}" | python3 ci/helm_check.py "$bin"
# Every optional part on: Ingress, ServiceMonitor, PrometheusRule, the dashboard's ConfigMap.
all_values=(-f "$chart/ci/test-values-all.yaml")
lint "${render[@]}" "${all_values[@]}"
template "${render[@]}" "${all_values[@]}" | python3 ci/helm_check.py "$bin" --optional
# An Ingress without the proxies to believe is refused: every buyer would share one address.
if out=$("$helm" template seckill "$chart" "${render[@]}" "${all_values[@]}" --set trustedProxies= 2>&1); then
  echo "the chart rendered an Ingress with no trustedProxies" >&2; exit 1
fi
grep -q "ingress.enabled needs trustedProxies" <<<"$out" || { printf '%s\n' "$out" >&2; exit 1; }
# Every store over TLS, Kafka with SASL, the CA and a client certificate from a Secret of one's own.
tls_values=(-f "$chart/ci/test-values-tls.yaml")
lint "${render[@]}" "${tls_values[@]}"
template "${render[@]}" "${tls_values[@]}" | python3 ci/helm_check.py "$bin"
template "${render[@]}" "${tls_values[@]}" "${all_values[@]}" | python3 ci/helm_check.py "$bin" --optional
# values.schema.json refuses a misspelt key, a wrong type and a short secret, naming each.
for bad in "ingres.enabled=true|additional properties 'ingres'" \
           "roles.api.replicas=three|/roles/api/replicas" \
           "secrets.adminToken=short|/secrets/adminToken"; do
  if out=$("$helm" template seckill "$chart" "${render[@]}" --set "${bad%%|*}" 2>&1); then
    echo "the chart rendered with --set ${bad%%|*}" >&2; exit 1
  fi
  grep -qF "${bad#*|}" <<<"$out" || { printf '%s\n' "$out" >&2; exit 1; }
done

say "dashboard and alerts against a real Prometheus scraping every role"
python3 ci/prometheus.py "$bin"
say "ok"
