# Shared by ci/nemesis/{redis,mariadb}.sh (sourced; `who` names the script in its messages).
# Messages go to stderr: stdout is for what callers parse.
say() { printf '[nemesis-%s] %s\n' "$who" "$*" >&2; }
die() { printf '[nemesis-%s] error: %s\n' "$who" "$*" >&2; exit 1; }

# wait_for SECONDS WHAT COMMAND...: retry COMMAND every 0.1 s until it succeeds (a failover is
# measured in this loop, so it polls finer than ci/services.sh); `wait_hint` ends the message.
wait_for() {
  local secs=$1 what=$2; shift 2
  local tries=$((secs * 10)) i
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  die "$what: not within ${secs}s${wait_hint:-}"
}

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
