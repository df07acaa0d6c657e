#!/usr/bin/env bash
# The real-store nemesis (DESIGN §13; docs/nemesis.md): from nothing, on this machine, the stores
# replicated as production runs them — a Redis Cluster of 3 masters with a replica each, Kafka as
# 3 KRaft brokers (replication 3, min.insync.replicas 2), MariaDB of its own — the release
# binary as 3 api, 2 worker and 2 jobs processes, sales driven by an independent client that
# records every request and answer, a seeded schedule of overlapping faults, and a checker that
# reads only the history, its own SQL and raw Redis.
#
#   ci/nemesis.sh --minutes N --seed S [--dir D] [--planted BUG [--long-stall SITE]] [--aim FAULT]
#                 [--stock U --users B --buckets K --sale-seconds T]
#
# --aim FAULT begins every round with that fault (the others drawn as usual), and --long-stall
# SITE arms that long fault point in the first jobs runner and none in the others (else one
# drawn for each), so that the others take over from it: a test of the one window a planted bug
# needs.
#
# --planted BUG runs a debug build with the `planted` feature (never a release build: its own
# target dir, target/planted) with SECKILL_PLANTED=BUG in every process, and the engine's fault
# points armed in each (SECKILL_STALLS): the run must fail. --planted none: the same build and
# fault points, no bug: the run must pass.
#
# Output in D/run (D: target/nemesis): report.txt (the verdict per invariant and round, the
# fault timeline, the time to recover after each fault, how busy the cores were), report.json,
# sale.png (throughput and latency with the faults as bands), history.jsonl, events.log, and each
# process's log. Exit 0 when every invariant held in every round, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
minutes=4 seed= dir=$repo/target/nemesis pass=() planted=
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --dir) dir=$(realpath -m "$2"); shift 2 ;;
    --planted) planted=$2; shift 2 ;;
    --stock | --users | --buckets | --sale-seconds | --aim | --long-stall) pass+=("$1" "$2"); shift 2 ;;
    *) echo "ci/nemesis.sh: unknown argument '$1' (see the header of ci/nemesis.sh)" >&2; exit 2 ;;
  esac
done
[ -n "$seed" ] || seed=$(( (RANDOM << 15) | RANDOM ))
say() { printf '[nemesis] %s\n' "$*"; }
say "seed $seed, $minutes minutes, state in $dir (replay: ci/nemesis.sh --minutes $minutes --seed $seed)"

# What the client, checker and plot need (PyPI), in a venv of their own.
venv=$repo/target/nemesis-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import aiohttp, redis, pymysql, jwt, matplotlib, confluent_kafka' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'aiohttp>=3.9,<4' 'redis>=5,<9' 'pymysql>=1.1,<2' 'pyjwt>=2.8,<3' 'matplotlib>=3.8,<4' \
    'confluent-kafka>=2.3,<3'
fi
# Clock skew through libfaketime (Debian).
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || {
  say "installing faketime"; DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null; }
command -v iptables >/dev/null || {
  say "installing iptables"; DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >/dev/null; }

if [ -n "$planted" ]; then
  cargo build -q -p seckill --features planted --bin seckill --target-dir target/planted
  bin=$repo/target/planted/debug/seckill
  [ "$planted" = none ] || export SECKILL_PLANTED=$planted
  # run.py gives every process its own seed of the fault points.
  export SECKILL_NEMESIS_STALLS=1
  say "planted: $planted (debug build with the planted feature, fault points armed)"
else
  cargo build --release -q --bin seckill
  bin=$repo/target/release/seckill
  # The release binary plants nothing: it refuses the variable.
  if env -i SECKILL_PLANTED=no_generation_check "$bin" serve --check-config >/dev/null 2>&1; then
    say "error: the release binary accepts SECKILL_PLANTED: it was built with the planted feature"; exit 2
  fi
fi
# The Kafka jars come from ci/services.sh's fetch (Maven Central).
[ -f "${KAFKA_LIBS:-target/services/kafka/libs}/.complete" ] || bash ci/services.sh

stop_all() {
  # Any engine process on the nemesis's ports (a run interrupted, a planted build's): they would hold them.
  pkill -9 -f -- "serve --roles [a-z]* --listen 127.0.0.1:181[01][0-9]" 2>/dev/null || true
  for s in redis kafka mariadb; do bash ci/nemesis/$s.sh stop --dir "$dir" >/dev/null 2>&1 || true; done
  # iptables rules the run left (it removes its own; an interrupted run may not have)
  iptables-save 2>/dev/null | grep -q 'nemesis' && iptables-save | grep -v 'nemesis' | iptables-restore || true
}
trap stop_all EXIT
stop_all
rm -rf "$dir"
mkdir -p "$dir"
# The run keeps the binary it started with: a build meanwhile must not change what a restart runs.
cp "$bin" "$dir/seckill"
bin=$dir/seckill
say "starting the stores"
bash ci/nemesis/redis.sh start --dir "$dir"
bash ci/nemesis/kafka.sh start --dir "$dir"
bash ci/nemesis/mariadb.sh start --dir "$dir"

"$venv/bin/python" ci/nemesis/run.py --seed "$seed" --minutes "$minutes" --dir "$dir" \
  --bin "$bin" "${pass[@]}"
