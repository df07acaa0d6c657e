#!/usr/bin/env bash
# The README's copy-pasteable commands, run as a newcomer runs them: the words are taken from
# README.md itself (not from a copy here), from the root of the clone. A green test suite once hid
# a run command that did not run (issue 13): every test ran `target/release/seckill`, never the
# README's words. Needs nothing but cargo; ci/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "readme: $*" >&2; exit 1; }

# Code blocks of one README section ("## <title>"), numbered from 0: "<n>: <line>".
blocks() {
  awk -v title="$1" 'BEGIN { n = 0 }
    index($0, "## " title) == 1 { s = 1; next }
    s && /^## / { exit }
    s && /^```/ { inb = !inb; if (!inb) n++; next }
    s && inb { print n ": " $0 }' README.md
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

# 4. Every flag of every synopsis ("seckill <cmd> [--flag ...]" in a code block) is one the
# command's --help lists, and a bad flag is refused by name (exit 2).
synopses=$(awk '/^```/ { inb = !inb; next } inb' README.md | awk '
  /^seckill [a-z]+ / { cmd = $2 } /^seckill [a-z]+ / || (/^ +\[--/ && cmd) { print cmd " " $0; next } { cmd = "" }')
for cmd in $(awk '{print $1}' <<< "$synopses" | sort -u); do
  help=$(seckill "$cmd" --help) || fail "seckill $cmd --help exited $?"
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

# 6. The HTTP session of the serve section, word for word, on the embedded default: every "$ "
# line runs in one shell, in order (the first starts the server in the background); each answer
# must be the README's line after its command, but for the values that change every run (the
# token, the reservation id, the expiry time).
session=$(awk '/^## `seckill serve`/ { s = 1; next } s && /^## / { exit }
  s && /^```/ { if (inb) { if (hit) { printf "%s", buf; exit } buf = ""; inb = 0 } else inb = 1; next }
  s && inb { buf = buf $0 "\n"; if (index($0, "seckill serve &")) hit = 1 }' README.md)
[ -n "$session" ] || fail "the serve section has no session with 'seckill serve &'"
script=$(mktemp) expected_out=$(mktemp) got_out=$(mktemp)
{
  echo "set -euo pipefail"
  # A newcomer's shell: no store settings (ci/test.sh exports the real stores' for the tests).
  echo "unset REDIS_URL KAFKA_BROKERS DATABASE_URL"
  echo "seckill() { $base \"\$@\"; }"
  # The server runs under a background subshell: stop it and its children (no procps needed).
  echo 'server=""'
  echo 'stop() { [ -n "$server" ] || return 0; for p in $(awk -v pp="$server" '"'"'$4 == pp { print $1 }'"'"' /proc/[0-9]*/stat 2>/dev/null); do kill "$p" 2>/dev/null || true; done; kill "$server" 2>/dev/null || true; }'
  echo 'trap stop EXIT'
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
norm() { grep -v '^{"timestamp"' "$1" | sed -E 's/"(token|reservation_id)":"[^"]*"/"\1":"…"/g; s/"expires_at_ms":[0-9]+/"expires_at_ms":…/g'; }
diff <(norm "$expected_out") <(norm "$got_out") || fail "the serve section's session no longer answers what the README shows"
echo "the serve section's session answers what the README shows"
rm -f "$script" "$expected_out" "$got_out"
echo "readme: every command checked"
