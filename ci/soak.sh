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

status=0
if [ -n "$planted" ]; then
  if [ "$planted" = all ]; then bugs=$("$bin" bugs); else bugs=$planted; fi
  # One hunt per bug, in parallel: each stops at the first seed that catches its bug.
  printf '%s\n' $bugs | xargs -P "$jobs" -I{} sh -c \
    "'$bin' sweep --planted {} --from $from --seeds $seeds ${shape[*]:-} --failures-dir '$out/caught' > '$out/planted-{}.jsonl' 2>/dev/null || true"
  cat "$out"/planted-*.jsonl | "$bin" summarize --planted || status=$?
else
  chunk=$(( (seeds + jobs - 1) / jobs ))
  pids=()
  for ((i = 0; i < jobs; i++)); do
    start=$(( from + i * chunk ))
    n=$(( from + seeds - start )); [ "$n" -gt "$chunk" ] && n=$chunk
    [ "$n" -ge 1 ] || break
    "$bin" sweep --from "$start" --seeds "$n" ${shape[@]+"${shape[@]}"} --failures-dir "$out/failures" \
      > "$out/part-$i.jsonl" 2>/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  cat "$out"/part-*.jsonl | "$bin" summarize || status=$?
fi

if [ "$status" -eq 0 ] && [ -z "$planted" ]; then
  rm -rf "$out" # nothing failed: keep nothing
else
  echo "logs: $out" >&2
fi
exit "$status"
