#!/usr/bin/env bash
# Mutation score of the simulation: apply each mutant of ci/mutants.txt to a copy of the tree, one
# at a time, build the simulation, run a short soak, and count the mutants a violation killed.
#
#   ci/mutants.sh [--seeds N] [--only id,id,...] [--check]
#
# --seeds N   seeds of every scenario per mutant (default 30: 360 runs, about a minute); the
#             first 10 first, the rest only for a mutant those did not kill
# --only      run only these mutants
# --check     only check that every mutant applies (its `from` occurs exactly once); no builds
#
# A mutant is killed when its soak reports a violation or a crashed world, or when it does not
# build (reported apart: a catalogue entry that stops compiling is a catalogue bug to fix). One
# listed in ci/mutants-equivalent.txt (with the reason it cannot change behaviour) is not run.
# Prints `mutants: K killed of N, E equivalent (score S%)` with S = K / (N - E), and the
# survivors. Too long for ci/test.sh: the nightly workflow runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=30 only="" check=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=${2:?--seeds wants a number}; shift 2 ;;
    --only) only=${2:?--only wants ids}; shift 2 ;;
    --check) check=1; shift ;;
    *) echo "ci/mutants.sh: unknown argument $1 (want --seeds N, --only ids, --check)" >&2; exit 64 ;;
  esac
done

# Incremental release builds in the mutants' own target dir: a mutant changes one line, and the
# rebuild of the engine and the simulation drops from about a minute to seconds (a Lua script)
# or half a minute (Rust). The soak's own build inherits it (same flags: no second build).
export CARGO_PROFILE_RELEASE_INCREMENTAL=true

root=$PWD
work=$root/target/mutants
# --check gets a tree and catalogue of its own: it may run while a full run uses the others.
tree=$work/tree${check:+-check}
catalogue=$work/catalogue${check:+-check}.jsonl
mkdir -p "$work"

# The catalogue, parsed once: one JSON object per mutant (id, file, from, to).
python3 - "$root/ci/mutants.txt" > "$catalogue" <<'EOF'
import json, sys
blocks, cur = [], {}
for n, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
    line = line.rstrip("\n")
    if line.startswith("#"):
        continue
    if not line.strip():
        if cur:
            blocks.append(cur)
        cur = {}
        continue
    key, sep, value = line.partition(":")
    if not sep or key not in ("id", "file", "from", "to") or key in cur:
        sys.exit(f"ci/mutants.txt:{n}: expected one of id:, file:, from:, to: once per block, got {line!r}")
    cur[key] = value[1:] if value.startswith(" ") else value
    cur.setdefault("line", n)
if cur:
    blocks.append(cur)
seen = set()
for b in blocks:
    missing = {"id", "file", "from", "to"} - b.keys()
    if missing:
        sys.exit(f"ci/mutants.txt:{b['line']}: block lacks {', '.join(sorted(missing))}")
    if b["id"] in seen:
        sys.exit(f"ci/mutants.txt:{b['line']}: id {b['id']} twice")
    seen.add(b["id"])
    b["from"] = b["from"].replace("\\n", "\n")
    b["to"] = b["to"].replace("\\n", "\n")
    print(json.dumps(b))
EOF

# Apply mutant $1 (its JSON line) to the tree; fails if `from` does not occur exactly once.
apply() {
  python3 - "$tree" "$1" <<'EOF'
import json, sys
tree, m = sys.argv[1], json.loads(sys.argv[2])
path = f"{tree}/{m['file']}"
text = open(path, encoding="utf-8").read()
n = text.count(m["from"])
if n != 1:
    sys.exit(f"mutant {m['id']}: `from` occurs {n} times in {m['file']} (ci/mutants.txt:{m['line']})")
open(path, "w", encoding="utf-8").write(text.replace(m["from"], m["to"]))
EOF
}

# A copy of the working tree (tracked files, as they are now), with a target dir of its own that
# outlives the copy (kept warm from one run to the next).
rm -rf "$tree"; mkdir -p "$tree" "$work/target"
git ls-files -z | xargs -0 cp --parents -t "$tree"
ln -s "$work/target" "$tree/target"
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

if [ -n "$check" ]; then
  status=0
  while IFS= read -r m; do
    file=$(field "$m" file)
    cp "$tree/$file" "$work/pristine-check"
    apply "$m" || status=1
    cp "$work/pristine-check" "$tree/$file"
  done < "$catalogue"
  [ "$status" -eq 0 ] && echo "mutants: every one of $(wc -l < "$catalogue") applies"
  exit "$status"
fi

equivalent=$(grep -v '^#' ci/mutants-equivalent.txt 2>/dev/null | awk 'NF { print $1 }' || true)

# The unmutated tree must build and pass, or no mutant says anything.
echo "[mutants] baseline: build and soak the tree as it is" >&2
if ! (cd "$tree" && ci/soak.sh --seeds "$seeds" > "$work/baseline.log" 2>&1); then
  echo "ci/mutants.sh: the unmutated soak fails (log: $work/baseline.log)" >&2
  exit 1
fi

# A mutant's soak: seeds $1.. ($2 of them) of every scenario, appended to its log. Most mutants
# die in the first 10 seeds; only a survivor of those pays for the rest.
first=$((seeds < 10 ? seeds : 10))
soak() { (cd "$tree" && timeout 900 ci/soak.sh --from "$1" --seeds "$2") >> "$work/$id.log" 2>&1; }

killed=0 total=0 equiv=0 unviable=0 survivors=() start=$SECONDS
while IFS= read -r m; do
  id=$(field "$m" id); file=$(field "$m" file)
  if [ -n "$only" ] && [[ ",$only," != *",$id,"* ]]; then continue; fi
  total=$((total + 1))
  if grep -qx "$id" <<< "$equivalent"; then
    equiv=$((equiv + 1)); echo "[mutants] $id: equivalent (ci/mutants-equivalent.txt)" >&2; continue
  fi
  # The tree's own copy comes back afterwards (not $root's: the checkout may change meanwhile).
  cp "$tree/$file" "$work/pristine"
  rm -f "$work/$id.log"
  apply "$m"
  t0=$SECONDS
  if ! (cd "$tree" && cargo build -q -p seckill-sim --features simulation --release \
        --config "build.rustflags=['--cfg','madsim']" --target-dir target/sim) > "$work/$id.build.log" 2>&1; then
    verdict="killed (does not build: $work/$id.build.log)"; killed=$((killed + 1)); unviable=$((unviable + 1))
  elif soak 0 "$first" && { [ "$seeds" -le "$first" ] || soak "$first" $((seeds - first)); }; then
    verdict="SURVIVED"; survivors+=("$id ($file)")
  else
    verdict="killed: $(grep -m1 -E '^(violated|  [a-z-]+ seed|sweep)' "$work/$id.log" || grep -m1 'failed: [1-9]' "$work/$id.log" || echo 'soak failed')"
    killed=$((killed + 1))
  fi
  cp "$work/pristine" "$tree/$file"
  echo "[mutants] $id: $verdict ($((SECONDS - t0)) s)" >&2
done < "$catalogue"

scored=$((total - equiv))
score=$(awk -v k="$killed" -v n="$scored" 'BEGIN { printf "%.1f", n ? 100 * k / n : 0 }')
echo "mutants: $killed killed of $total, $equiv equivalent (score $score%)"
[ "$unviable" -gt 0 ] && echo "  of the killed, $unviable did not build (fix their catalogue entries)"
for s in "${survivors[@]}"; do echo "  survived: $s"; done
echo "  $seeds seeds of every scenario per mutant, $((SECONDS - start)) s in all"
