#!/usr/bin/env bash
# The README's (and docs/usage.md's) copy-pasteable commands, run as a newcomer runs them: the
# words are taken from the documents themselves (not from a copy here), from the root of the
# clone. A green test suite once hid a run command that did not run (issue 13): every test ran
# `target/release/seckill`, never the README's words. Then the documents' links and the
# simulation's catalogue. Needs cargo, python3 and, for the sale on the real stores, the stores
# ci/services.sh starts; ci/test.sh runs it after starting them.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "readme: $*" >&2; exit 1; }

# The lines a generated script starts with so that the server its "&" line starts (recorded as
# $server) is stopped on exit: it runs under a background subshell (cargo run), so its children
# go too (no procps needed).
stopper() {
  echo 'server=""'
  echo 'stop() { [ -n "$server" ] || return 0; for p in $(awk -v pp="$server" '"'"'$4 == pp { print $1 }'"'"' /proc/[0-9]*/stat 2>/dev/null); do kill "$p" 2>/dev/null || true; done; kill "$server" 2>/dev/null || true; }'
  echo 'trap stop EXIT'
}

# Code blocks of one section ("## <title>") of a file (README.md unless given), numbered from 0:
# "<n>: <line>".
blocks() {
  awk -v title="$1" 'BEGIN { n = 0 }
    index($0, "## " title) == 1 { s = 1; next }
    s && /^## / { exit }
    s && /^```/ { inb = !inb; if (!inb) n++; next }
    s && inb { print n ": " $0 }' "${2:-README.md}"
}

# 1. "Set up on a fresh machine": exactly two commands, the run command and the test command.
run_cmd=$(blocks "Set up on a fresh machine" | sed -n 's/^0: //p')
test_cmd=$(blocks "Set up on a fresh machine" | sed -n 's/^1: //p')
[ -n "$run_cmd" ] && [ "$(wc -l <<< "$run_cmd")" -eq 1 ] || fail "the set-up section has no one-line run command"
[ "$test_cmd" = "ci/test.sh" ] || fail "the set-up section's test command is '$test_cmd', not ci/test.sh"
echo "\$ $run_cmd"
out=$(bash -c "$run_cmd") || fail "'$run_cmd' exited $?"
printf '%s\n' "$out"
[ "$(tail -n 1 <<< "$out")" = "invariants: ok" ] || fail "'$run_cmd' did not end with 'invariants: ok'"

# Every other command below runs through the README's own run command with other arguments.
base=${run_cmd% demo} # "cargo run --release --"
[ "$base" != "$run_cmd" ] || fail "the run command does not end in 'demo': '$run_cmd'"
seckill() { bash -c "$base $(printf '%q ' "$@")"; }

# 2. The demo example: "Example (`<command>`):" and the output block after it. The funnel must
# match line for line but for the timing line (a seed replays the same funnel on any machine).
example=$(sed -n 's/.*Example (`\(cargo run --release -- demo[^`]*\)`):.*/\1/p' README.md)
[ -n "$example" ] || fail "the demo example's command is gone"
expected=$(awk '/Example \(`cargo run --release -- demo/ { s = 1; next }
  s && /^```/ { if (inb) exit; inb = 1; next } s && inb' README.md)
echo "\$ $example"
got=$(bash -c "$example") || fail "'$example' exited $?"
printf '%s\n' "$got"
stable() { grep -vE '^elapsed ' <<< "$1"; }
diff <(stable "$expected") <(stable "$got") || fail "'$example' no longer prints the README's funnel"

# 3. The figures the demo section quotes for seed 7 (each claim must still be in the README).
claim() { # claim <README text> <flags> <expected line>
  grep -qF -- "$1" README.md || fail "the README no longer says '$1': update ci/readme.sh"
  local line
  line=$(seckill demo --seed 7 $2 | grep -F -- "$3") || fail "demo --seed 7 $2 does not print '$3'"
  echo "demo --seed 7 $2: $line"
}
claim '`--skew 0.9` sells all 1,000 units with 149' "--skew 0.9" "units sold             1000 of 1000"
claim '`--skew 0.9` sells all 1,000 units with 149' "--skew 0.9" "rebalancer: 149 transfers"
claim '`--skew 0.99 --no-rebalance` leaves 607 unsold' "--skew 0.99 --no-rebalance" "(607 left in redis)"
claim 'with rebalancing 2 are left' "--skew 0.99" "(2 left in redis)"

# 4. Every flag of every synopsis ("seckill <cmd> [--flag ...]" in a code block of the README or
# docs/usage.md) is one the command's --help lists, and a bad flag is refused by name (exit 2).
synopses=$(for f in README.md docs/usage.md; do awk '/^```/ { inb = !inb; next } inb' "$f"; done | awk '
  /^seckill [a-z]+ / { cmd = $2 } /^seckill [a-z]+ / || (/^ +\[--/ && cmd) { print cmd " " $0; next } { cmd = "" }')
for cmd in $(awk '{print $1}' <<< "$synopses" | sort -u); do
  help=$(seckill "$cmd" --help) || fail "seckill $cmd --help exited $?"
  # The flags of its subcommands too (`seckill admin dead-letters replay --help`): every word a
  # synopsis names that is a subcommand, and the subcommands of those.
  words=$(grep "^$cmd " <<< "$synopses" | cut -d' ' -f2- | sed 's/\[[^]]*\]//g' \
    | grep -oE '(^|[ |])[a-z][a-z-]+' | tr -d ' |' | grep -vxE "seckill|$cmd" | sort -u || true)
  for sub in $words; do
    sub_help=$(seckill "$cmd" "$sub" --help 2>/dev/null) || continue
    help+=$'\n'"$sub_help"
    grep -q '^Commands:' <<< "$sub_help" || continue
    for subsub in $words; do
      help+=$'\n'"$(seckill "$cmd" "$sub" "$subsub" --help 2>/dev/null || true)"
    done
  done
  for flag in $(grep "^$cmd " <<< "$synopses" | grep -oE -- '--[a-z][a-z-]*' | sort -u); do
    grep -qE -- "$flag( |,|$)" <<< "$help" || fail "seckill $cmd --help does not list $flag (the README's synopsis does)"
  done
  echo "seckill $cmd --help lists every flag of the README's synopsis"
  set +e; err=$(seckill "$cmd" --no-such-flag 2>&1 >/dev/null); code=$?; set -e
  [ "$code" -eq 2 ] && grep -q -- "--no-such-flag" <<< "$err" || fail "seckill $cmd --no-such-flag: exit $code, not refused by name"
done

# 5. The planner's presets, as the README and BENCHMARKS.md print them.
for preset in seed-funnel-500k seed-100k; do
  # Read whole first: `| grep -q` stops reading at the first match, and under pipefail the
  # planner's write into the closed pipe (a panic: Rust ignores SIGPIPE) failed the step at times.
  plan=$(seckill plan --preset "$preset") || fail "seckill plan --preset $preset exited $?"
  grep -q "short stave" <<< "$plan" || fail "seckill plan --preset $preset names no short stave"
  echo "seckill plan --preset $preset: ok"
done

# 6. The HTTP session of docs/usage.md's serve section, word for word, on the embedded default: every "$ "
# line runs in one shell, in order (the first starts the server in the background); each answer
# must be the README's line after its command, but for the values that change every run (the
# token, the reservation id, the expiry time, the request id).
session=$(awk '/^## `seckill serve`/ { s = 1; next } s && /^## / { exit }
  s && /^```/ { if (inb) { if (hit) { printf "%s", buf; exit } buf = ""; inb = 0 } else inb = 1; next }
  s && inb { buf = buf $0 "\n"; if (index($0, "seckill serve &")) hit = 1 }' docs/usage.md)
[ -n "$session" ] || fail "docs/usage.md's serve section has no session with 'seckill serve &'"
script=$(mktemp) expected_out=$(mktemp) got_out=$(mktemp)
{
  echo "set -euo pipefail"
  # A newcomer's shell: no store settings (ci/test.sh exports the real stores' for the tests).
  echo "unset REDIS_URL KAFKA_BROKERS DATABASE_URL"
  echo "seckill() { $base \"\$@\"; }"
  stopper
  pending=""
  while IFS= read -r line; do
    if [ -n "$pending" ]; then pending+=$'\n'"$line"; [[ "$line" == *\\ ]] && continue; cmd=$pending; pending=""
    elif [[ "$line" == '$ '* ]]; then cmd=${line#\$ }; if [[ "$cmd" == *\\ ]]; then pending=$cmd; continue; fi
    else printf '%s\n' "$line" >> "$expected_out"; echo "printf '%s\\n' \"\$out\""; continue
    fi
    if [[ "$cmd" == *'&' ]]; then
      printf '%s\n' "$cmd"
      echo 'server=$!'
      echo 'for _ in $(seq 600); do curl -sf localhost:9090/healthz >/dev/null && break; sleep 0.5; done'
    elif [[ "$cmd" =~ ^[A-Z]+= ]] || [[ "$cmd" == sleep* ]]; then printf '%s\n' "$cmd"
    else printf 'out=$(%s)\n' "$cmd"
    fi
  done <<< "$session"
} > "$script"
echo "\$ (the serve section's session, $(grep -c '^\$ ' <<< "$session") commands)"
bash "$script" > "$got_out" || fail "the serve section's session exited $? (script: $script)"
# The server's own log lines (JSON with a timestamp, on the same terminal) are not answers.
norm() { grep -v '^{"timestamp"' "$1" | sed -E 's/"(token|reservation_id|request_id)":"[^"]*"/"\1":"…"/g; s/"expires_at_ms":[0-9]+/"expires_at_ms":…/g'; }
diff <(norm "$expected_out") <(norm "$got_out") || fail "the serve section's session no longer answers what the README shows"
echo "the serve section's session answers what the README shows"
rm -f "$script" "$expected_out" "$got_out"

# 7. The README's sale on the real stores, word for word, on the stores ci/test.sh started (the
# block's ci/services.sh finds them answering): its commands in one shell, then the audit it
# names once the workers have applied every order. The sale must have queued and sold units and
# the audit must end "invariants: ok".
sale=$(blocks "A sale on the real stores" | sed -n 's/^0: //p')
[ -n "$sale" ] || fail "the README has no command block under 'A sale on the real stores'"
script=$(mktemp)
{
  echo "set -euo pipefail"
  stopper
  while IFS= read -r line; do
    printf '%s\n' "$line"
    [[ "$line" == *'&' ]] && echo 'server=$!'
  done <<< "$sale"
  # The audit checks R1 only once the consumer group has nothing left to apply.
  echo 'for _ in $(seq 60); do out=$('"$base"' audit --activity "$A") || true; grep -q "consumer lag 0" <<< "$out" && break; sleep 1; done'
  echo 'printf "%s\n" "$out"'
} > "$script"
echo "\$ (the README's sale on the real stores, $(grep -c . <<< "$sale") lines, then seckill audit)"
got=$(bash "$script" 2>&1) || fail "the README's sale on the real stores exited $? (script: $script): $(tail -n 5 <<< "$got")"
printf '%s\n' "$got" | grep -vE '^\[services\]' | tail -n 25
grep -qE '^ +202 queued +[1-9]' <<< "$got" || fail "the README's sale on the real stores queued nothing"
[ "$(tail -n 1 <<< "$got")" = "invariants: ok" ] || fail "the audit after the README's sale did not end with 'invariants: ok'"
rm -f "$script"

# 8. Every link between the documents points at a file of the repository, and an anchor at one
# of its headings (as GitHub derives them).
python3 - <<'PY' || fail "a broken link (above)"
import pathlib, re, sys
def anchors(path):
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.M)}
bad = 0
for doc in [pathlib.Path("README.md"), *sorted(pathlib.Path("docs").glob("*.md"))]:
    for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc.resolve()
        if not path.exists():
            print(f"{doc}: link to {link}: no such file", file=sys.stderr); bad += 1
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            print(f"{doc}: link to {link}: no such heading", file=sys.stderr); bad += 1
sys.exit(1 if bad else 0)
PY
echo "readme: every link between the documents resolves"
# 9. docs/simulation.md's catalogue lists every fault type (the `Fault` enum, by its name in a
# schedule) and every coverage target (`COVERAGE_TARGETS`), each in the first column of a row.
python3 - <<'PY' || fail "docs/simulation.md's catalogue is not complete (above)"
import re, sys
enum = re.search(r"pub enum Fault \{(.*?)\n\}", open("sim/src/world/fault.rs", encoding="utf-8").read(), re.S).group(1)
faults = [re.sub(r"(?<!^)([A-Z])", r"_\1", v).lower() for v in re.findall(r"^    ([A-Z]\w*),$", enum, re.M)]
coverage = open("sim/src/world/coverage.rs", encoding="utf-8").read()
required = coverage[coverage.index("pub const COVERAGE_TARGETS"):]
targets = [re.sub(r"(?<!^)([A-Z])", r"_\1", v).lower() for v in re.findall(r"Target::(\w+),", required)]
rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", open("docs/simulation.md", encoding="utf-8").read(), re.M))
missing = [n for n in faults + targets if n not in rows]
for n in missing:
    print(f"docs/simulation.md: no catalogue row for `{n}`", file=sys.stderr)
print(f"{len(faults)} faults, {len(targets)} coverage targets in the catalogue")
sys.exit(1 if missing or not faults or not targets else 0)
PY
echo "readme: every command checked"
