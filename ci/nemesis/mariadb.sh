#!/usr/bin/env bash
# Fault injection ("nemesis") against a MariaDB server of its own: 127.0.0.1:3307, its data,
# socket, pid file and logs under D/mariadb -- not the system server on 3306, which the other
# tests use and which must not be killed under them. Durable InnoDB (a commit is on disk before
# the client hears OK), so a SIGKILL is a crash that InnoDB recovers from on the next start.
#
#   ci/nemesis/mariadb.sh [--dir D] COMMAND
#
#   start      create the data directory if needed, start the server, make database `seckill`
#              and user seckill/seckill (all privileges on `seckill%`.*); idempotent
#   stop       clean shutdown
#   kill       SIGKILL mariadbd: the next start runs InnoDB crash recovery
#   restart    start again (after a kill; a running server is killed first) and wait until it
#              answers; prints what the recovery logged
#   pause      SIGSTOP mariadbd (connections stay open, nothing answers)
#   resume     SIGCONT
#   status     pid, state, memory
#   url        mysql://seckill:seckill@127.0.0.1:3307/seckill
#   selftest   SIGKILL during a stream of INSERTs, restart: every acknowledged row is there
#
# D defaults to target/nemesis. Progress goes to stderr, answers (url) to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

dir=$repo/target/nemesis
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
mkdir -p "$dir/mariadb"
m=$(cd "$dir/mariadb" && pwd)

port=3307
cnf=$m/my.cnf
data=$m/data
sock=$m/mariadb.sock
pidfile=$m/mariadb.pid
errlog=$m/error.log
url=mysql://seckill:seckill@127.0.0.1:$port/seckill

who=mariadb
wait_hint=" (see $errlog)"
# shellcheck source=ci/nemesis/lib.sh
source "$repo/ci/nemesis/lib.sh"

# --no-defaults first: the clients must not pick up /etc/mysql's settings for the system server.
# root logs in through our socket (unix_socket authentication: we are root).
admin_sql() { mariadb --no-defaults --socket="$sock" -uroot "$@"; }
app_sql() { timeout 5 mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill "$@"; }

# The pid of our mariadbd (running or stopped), checked against its command line so that a
# stale pid file never makes us signal another process (such as the system server).
pid_of() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--defaults-file=$cnf" || return 1
  gone "$pid" && return 1
  echo "$pid"
}
alive() { pid_of >/dev/null; }
# Dead, or a zombie its parent (init, the server being orphaned at start) has not reaped yet.
gone() { [ ! -e "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
# Answers: a query over TCP as the application user (a SIGSTOPped server accepts the connection
# in the kernel and then says nothing: the timeout).
answers() { [ "$(app_sql -N -e 'SELECT 1' 2>/dev/null)" = 1 ]; }
root_answers() { [ "$(timeout 5 mariadb --no-defaults --socket="$sock" -uroot -N -e 'SELECT 1' 2>/dev/null)" = 1 ]; }

write_cnf() {
  # Snapshot isolation as on the system server (ci/services.sh): a transaction may not write a
  # row changed since its read view (error 1020). The variable exists since 10.6.18/10.11.8.
  local si="# innodb_snapshot_isolation: not in $(mariadbd --version | awk '{print $3}')"
  if mariadbd --no-defaults --verbose --help 2>/dev/null | grep -q '^innodb-snapshot-isolation '; then
    si="innodb_snapshot_isolation = ON"
  fi
  cat >"$cnf" <<EOF
[mariadbd]
user = root
datadir = $data
socket = $sock
pid-file = $pidfile
port = $port
bind-address = 127.0.0.1
log-error = $errlog
skip-name-resolve
skip-log-bin
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
innodb_buffer_pool_size = 128M
innodb_flush_log_at_trx_commit = 1
innodb_doublewrite = ON
key_buffer_size = 8M
aria_pagecache_buffer_size = 16M
$si
EOF
  # innodb_flush_log_at_trx_commit = 1: the redo log is written and fsynced at every commit,
  #   so what the client saw committed survives a SIGKILL (and a power cut, which we do not
  #   inject). No binary log (no replica here): sync_binlog has nothing to act on.
  # innodb_doublewrite: the default, written down because a torn page is what it guards
  #   against and a crash test should not run without it.
  # The character set and collation of Debian's packaged server (the system one on 3306).
  # key_buffer_size/aria_pagecache_buffer_size: MyISAM and Aria hold nothing of ours; their
  #   128 MB defaults would only add to the footprint.
}

start_server() {
  rm -f "$sock" # a SIGKILL leaves it behind; no server of ours is using it now
  # Orphaned at once (not a job of this shell), with no shell left holding our stdout. Not
  # mysqld_safe: it would start the server again after a kill, and a kill must stay a kill.
  ( (exec setsid mariadbd --defaults-file="$cnf") >>"$m/mariadbd.out" 2>&1 </dev/null &)
  # Crash recovery runs before the server listens: give it time.
  wait_for 120 "mariadbd on $port answering" root_answers
}

setup_sql() {
  admin_sql <<'SQL'
CREATE DATABASE IF NOT EXISTS seckill;
CREATE USER IF NOT EXISTS 'seckill'@'localhost' IDENTIFIED BY 'seckill';
CREATE USER IF NOT EXISTS 'seckill'@'127.0.0.1' IDENTIFIED BY 'seckill';
GRANT ALL PRIVILEGES ON `seckill%`.* TO 'seckill'@'localhost';
GRANT ALL PRIVILEGES ON `seckill%`.* TO 'seckill'@'127.0.0.1';
SQL
}

cmd_start() {
  if alive; then
    answers || root_answers || die "mariadbd on $port runs but does not answer (paused? try: $0 --dir $dir resume)"
  else
    write_cnf
    if [ ! -d "$data/mysql" ]; then
      say "creating the data directory $data"
      rm -rf "$data"
      mariadb-install-db --defaults-file="$cnf" --auth-root-authentication-method=socket \
        --skip-test-db >"$m/install.log" 2>&1 || { tail -20 "$m/install.log" >&2; die "mariadb-install-db failed"; }
    fi
    start_server
  fi
  setup_sql
  wait_for 10 "mariadbd on $port answering the seckill user" answers
  say "mariadb on $port: up (pid $(pid_of)), $(mariadbd --version | awk '{print $3}')," \
    "snapshot isolation $(app_sql -N -e 'SELECT IF(@@innodb_snapshot_isolation, "ON", "OFF")' 2>/dev/null || echo n/a)"
}

cmd_stop() {
  local pid
  pid=$(pid_of) || { say "mariadb on $port: not running"; return 0; }
  kill -CONT "$pid" 2>/dev/null || true
  admin_sql -e 'SHUTDOWN' 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do gone "$pid" && break; sleep 0.2; done
  if ! gone "$pid"; then
    say "mariadb on $port: no clean shutdown within 60 s: SIGKILL"
    kill -9 "$pid"
  fi
  say "mariadb on $port: stopped"
}

cmd_kill() {
  local pid
  pid=$(pid_of) || die "mariadb on $port is not running"
  kill -9 "$pid"
  wait_for 10 "mariadbd to die" gone "$pid"
  say "mariadb on $port: killed (pid $pid)"
}

cmd_restart() {
  local t0 from
  if alive; then say "mariadb on $port is running: killing it first"; cmd_kill; fi
  [ -d "$data/mysql" ] || die "no data directory in $data: use start"
  from=$(($(stat -c %s "$errlog" 2>/dev/null || echo 0) + 1))
  t0=$(now_ms)
  write_cnf
  start_server
  wait_for 10 "mariadbd on $port answering the seckill user" answers
  say "mariadb on $port: back after $(($(now_ms) - t0)) ms (pid $(pid_of)); recovery said:"
  tail -c +"$from" "$errlog" | grep -E 'crash recovery|Starting final batch|recovered|Rolled back|rollback|To recover|log sequence number|LSN' \
    | sed 's/^/    /' >&2 || say "    (nothing about recovery: it was a clean stop)"
}

cmd_pause() { local pid; pid=$(pid_of) || die "mariadb on $port is not running"; kill -STOP "$pid"; say "mariadb on $port: paused"; }
cmd_resume() { local pid; pid=$(pid_of) || die "mariadb on $port is not running"; kill -CONT "$pid"; say "mariadb on $port: resumed"; }

cmd_status() {
  local pid
  if ! pid=$(pid_of); then echo "down"; return 0; fi
  if [ "$(awk '{print $3}' "/proc/$pid/stat")" = T ]; then echo "paused pid=$pid"; return 0; fi
  echo "up pid=$pid rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")KiB" \
    "answers=$(answers && echo yes || echo no) url=$url"
}

# A stream of autocommit INSERTs, each followed by a SELECT of its number in the same session:
# a number printed is an INSERT the server acknowledged as committed. SIGKILL under it, restart:
# every acknowledged row must be there (at most one more: committed, its OK lost in the kill).
# A process kill leaves the OS page cache alone, so this tells flush_log_at_trx_commit=0 (redo
# kept in the server's memory up to a second: thousands of acknowledged rows lost) from 1 or 2,
# not 1 from 2; only a power cut or VM crash would.
cmd_selftest() {
  local wlog=$m/selftest-writes.log acked rows maxv below
  cmd_start
  app_sql seckill -e 'DROP TABLE IF EXISTS nemesis_selftest;
    CREATE TABLE nemesis_selftest (id BIGINT AUTO_INCREMENT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB'
  # --unbuffered: each result is written out as it arrives, not when the client exits.
  (seq 1 10000000 | sed 's/.*/INSERT INTO nemesis_selftest (v) VALUES (&); SELECT &;/' \
    | mariadb --no-defaults -h127.0.0.1 -P"$port" -useckill -pseckill -N --unbuffered seckill \
      >"$wlog" 2>"$wlog.err" || true) &
  local writer=$!
  sleep 2
  cmd_kill
  wait "$writer" || true
  acked=$(grep -E '^[0-9]+$' "$wlog" | tail -1)
  [ -n "$acked" ] || die "no INSERT was acknowledged before the kill ($(cat "$wlog.err"))"
  say "last acknowledged INSERT before the kill: v=$acked (the client then said: $(tr '\n' ' ' <"$wlog.err"))"
  cmd_restart
  read -r rows maxv below < <(app_sql seckill -N -e \
    "SELECT COUNT(*), COALESCE(MAX(v), 0), SUM(v <= $acked) FROM nemesis_selftest")
  echo "acknowledged: $acked; after crash recovery: rows=$rows max(v)=$maxv rows with v<=$acked: $below"
  [ "$below" = "$acked" ] || die "acknowledged rows lost: $below of $acked survived"
  [ "$rows" -le $((acked + 1)) ] || die "more rows than INSERTs sent? rows=$rows acked=$acked"
  app_sql seckill -e 'DROP TABLE nemesis_selftest'
  say "selftest: every acknowledged INSERT survived the SIGKILL"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  restart) cmd_restart ;;
  pause) cmd_pause ;;
  resume) cmd_resume ;;
  status) cmd_status ;;
  url) echo "$url" ;;
  selftest) cmd_selftest ;;
  *) usage >&2; exit 2 ;;
esac
