#!/usr/bin/env bash
# The nightly soak: many simulated seeds of every scenario, in parallel, keeping logs only of
# failures. Ends with the summary lines:
#   seeds: N passed: P failed: F
#   faults: <type>=<count> ...
#   time-compression: <X>x
# and, with --planted, instead:
#   planted: caught C/T (seeds-to-catch max M median D)
#
#   ci/soak.sh --seeds N [--from S] [--jobs J] [--planted NAME|all] [--standard]
#
# Exit status: non-zero on any violation (or, with --planted, on any planted bug not caught).
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=100 from=0 jobs=$(nproc) planted="" shape=()
usage() { sed -n '2,13p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
    --from) from=${2:?--from needs a number}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --planted) planted=${2:?--planted needs a bug name or all}; shift 2 ;;
    --standard) shape=(--standard); shift ;;
    -h|--help) usage ;;
    *) echo "soak: unknown argument $1" >&2; usage ;;
  esac
done
for n in "$seeds" "$from" "$jobs"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "soak: --seeds/--from/--jobs take whole numbers, got '$n'" >&2; exit 2; }
done
[ "$seeds" -ge 1 ] && [ "$jobs" -ge 1 ] || { echo "soak: --seeds and --jobs must be at least 1" >&2; exit 2; }

unset RUSTFLAGS # it would replace the --cfg madsim below
cargo build -q -p seckill-sim --features simulation --release \
  --config "build.rustflags=['--cfg','madsim']" --target-dir target/sim
bin=target/sim/release/seckill-sim
out=target/soak/run-$$
rm -rf "$out"; mkdir -p "$out"

# Progress on stderr while the runs go: runs finished (and failed) so far — redrawn in place on a
# terminal, a line every 30 s otherwise (CI logs).
progress() {
  local start=$SECONDS last=0 n bad line
  while sleep 1; do
    n=$(cat "$out"/*.jsonl 2>/dev/null | wc -l || true)
    bad=$(cat "$out"/*.jsonl 2>/dev/null | grep -vc '"verdict":"ok"' || true)
    line=$(printf '[soak] %d runs finished, %d with a violation, %d s' "$n" "$bad" $((SECONDS - start)))
    if [ -t 2 ]; then
      printf '\r%s' "$line" >&2
    elif [ $((SECONDS - last)) -ge 30 ]; then
      printf '%s\n' "$line" >&2; last=$SECONDS
    fi
  done
}
progress & progress_pid=$!
trap 'kill $progress_pid 2>/dev/null || true' EXIT

status=0
if [ -n "$planted" ]; then
  if [ "$planted" = all ]; then bugs=$("$bin" bugs); else bugs=$planted; fi
  # One hunt per bug, in parallel: each stops at the first seed that catches its bug.
  printf '%s\n' $bugs | xargs -P "$jobs" -I{} sh -c \
    "'$bin' sweep --planted {} --from $from --seeds $seeds ${shape[*]:-} --failures-dir '$out/caught' > '$out/planted-{}.jsonl' 2>/dev/null || true"
  cat "$out"/planted-*.jsonl | "$bin" summarize --planted || status=$?
else
  # Sweeps of at most $chunk seeds per process, $jobs at a time: the chunks spread the seeds over
  # the jobs, and a process that dies loses only its chunk. (A sweep process used to keep a few
  # MB per run — tasks left pending when a madsim runtime dropped — until the world tore itself down.)
  # A chunk is at most 50 seeds, and small enough that every job gets one (a standard-size
  # soak of a few seeds is otherwise one process on one core).
  chunk=$(( (seeds + jobs - 1) / jobs )); [ "$chunk" -gt 50 ] && chunk=50
  chunk=${SOAK_CHUNK:-$chunk}
  for ((start = from; start < from + seeds; start += chunk)); do
    n=$(( from + seeds - start )); [ "$n" -gt "$chunk" ] && n=$chunk
    echo "$start $n"
  done | xargs -P "$jobs" -L 1 sh -c \
    "'$bin' sweep --from \$0 --seeds \$1 ${shape[*]:-} --failures-dir '$out/failures' > '$out'/part-\$0.jsonl 2>/dev/null; echo \$? > '$out'/part-\$0.code"
  # A sweep exits 1-3 when a seed fails (summarize reports those); one that died (killed by a
  # signal, e.g. out of memory) left seeds unrun, and that fails the soak.
  for f in "$out"/part-*.code; do
    code=$(cat "$f")
    if [ "$code" -gt 3 ]; then
      echo "sweep ${f%.code} died (exit $code): its remaining seeds did not run" >&2
      status=3
    fi
  done
  cat "$out"/part-*.jsonl | "$bin" summarize || status=$?
fi

kill "$progress_pid" 2>/dev/null || true
[ -t 2 ] && printf '\n' >&2
if [ "$status" -eq 0 ] && [ -z "$planted" ]; then
  rm -rf "$out" # nothing failed: keep nothing
else
  echo "logs: $out" >&2
fi
exit "$status"
