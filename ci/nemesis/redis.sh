#!/usr/bin/env bash
# Fault injection ("nemesis") against a replicated Redis Cluster on loopback: 3 masters and 3
# replicas (one per master) on 127.0.0.1:7300-7305, cluster bus on port+10000. No persistence:
# a node killed and started again comes back empty, as in a cache fleet without RDB/AOF.
#
#   ci/nemesis/redis.sh [--dir D] [--full-coverage yes|no] COMMAND [ARGS]
#
#   start                  start the six nodes and create the cluster (idempotent; the
#                          options apply to the nodes it starts)
#   stop                   stop every node (and remove any link cut left behind)
#   status                 role, master, pid, memory of each node
#   nodes                  redis://127.0.0.1:7300,...  (all six, the engine's seed list)
#   masters                ports of the current masters (owning slots, not failed), one a line
#   replica-of PORT        port of a live replica of master PORT
#   kill PORT              SIGKILL the node
#   restart PORT           start a killed node again (empty); it rejoins as a replica
#   pause PORT/resume PORT SIGSTOP/SIGCONT the node
#   lagging-failover MASTER_PORT HOLD_MS
#                          cut the replication link of MASTER_PORT's replica (iptables), let the
#                          master accept writes for HOLD_MS, SIGKILL it, wait for the replica's
#                          promotion: every write of the hold is acknowledged and then lost.
#                          Ends with one line on stdout: master=.. replica=..
#                          master_offset=.. replica_offset=.. lost_bytes=.. promoted_offset=..
#                          failover_ms=.. routed_ms=..
#   selftest               shows lagging-failover losing acknowledged INCRs, and restart
#
# State (configs, logs, pid files, nodes.conf) in D/redis/PORT, D default target/nemesis.
# Progress goes to stderr, answers to stdout, so `$(ci/nemesis/redis.sh masters)` is the ports.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

dir=$repo/target/nemesis
# `no`: a dead master makes only its own slots fail (CLUSTERDOWN for those keys, the rest keep
# serving) until its replica takes over. The engine must survive a partial outage of one shard,
# which is the fault we mean to inject; `yes` (Redis's default) turns every master failure into
# a whole-cluster outage of a few seconds, which hides per-shard handling behind a total stop.
full_coverage=no
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --full-coverage) full_coverage=${2:?--full-coverage needs yes or no}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
case "$full_coverage" in yes|no) ;; *) echo "--full-coverage takes yes or no" >&2; exit 2 ;; esac
mkdir -p "$dir/redis"
dir=$(cd "$dir" && pwd)

ports=(7300 7301 7302 7303 7304 7305)
# Tag of our iptables rules, so that `stop` (and a trap) removes exactly those.
tag=seckill-nemesis-redis

who=redis
# shellcheck source=ci/nemesis/lib.sh
source "$repo/ci/nemesis/lib.sh"

is_port() { local p; for p in "${ports[@]}"; do [ "$p" = "${1:-}" ] && return 0; done; return 1; }
need_port() { is_port "${1:-}" || die "expected one of ${ports[*]}, got '${1:-}'"; }

# A paused (SIGSTOPped) node accepts the TCP connection in the kernel and never answers: every
# query has a timeout. CR stripped (INFO ends its lines with \r\n).
cli() { local port=$1; shift; timeout 2 redis-cli -p "$port" "$@" 2>/dev/null | tr -d '\r'; }
up() { [ "$(cli "$1" ping)" = PONG ]; }
info_field() { cli "$1" info "$2" | sed -n "s/^$3:\(.*\)/\1/p"; } # port section field
role() { cli "$1" role | head -1; }

node_dir() { echo "$dir/redis/$1"; }

# The pid of the node on PORT if it is running (or stopped), from its pid file; the process title
# ("redis-server 127.0.0.1:PORT [cluster]") guards against a pid reused by something else.
pid_of() {
  local pid
  pid=$(cat "$(node_dir "$1")/redis.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "redis-server.*:$1\b" || return 1
  gone "$pid" && return 1
  echo "$pid"
}
alive() { pid_of "$1" >/dev/null; }
# Dead, or a zombie its parent (init, the node being orphaned at start) has not reaped yet.
gone() { [ ! -e "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

start_node() {
  local port=$1 d
  d=$(node_dir "$port")
  mkdir -p "$d"
  # nodes.conf is the node's cluster identity (id, epochs, who it replicates); kept across a
  # restart on purpose: see cmd_restart.
  cat >"$d/redis.conf" <<EOF
port $port
bind 127.0.0.1
dir $d
logfile $d/redis.log
pidfile $d/redis.pid
daemonize no
save ""
appendonly no
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
cluster-replica-validity-factor 0
cluster-require-full-coverage $full_coverage
repl-diskless-sync yes
repl-diskless-sync-delay 0
rdb-del-sync-files yes
EOF
  # cluster-replica-validity-factor 0: a replica may be promoted however long it has been cut
  #   from its master -- the lagging failover below depends on it.
  # repl-diskless-sync-delay 0: a node that rejoins empty gets its full sync at once instead of
  #   after the default 5 s wait for other replicas to join the same transfer.
  # rdb-del-sync-files yes: a replica loads its full sync from a dump.rdb in its dir, and Redis
  #   loads a dump.rdb found at startup whatever `save` says -- a node restarted "empty" would
  #   come back with its last full sync (and `cluster create` refuses a node with keys). The file
  #   is deleted once loaded; the rm below covers a node killed in the middle of a sync.
  # No cluster-announce-*: clients reach the nodes at the addresses the nodes see themselves at.
  # Not a child of this shell (which would report its kill as a job), and exec: no shell stays
  # behind as its parent holding the caller's stdout (a caller reading this script's output
  # through a pipe would wait for that forever).
  rm -f "$d"/dump.rdb "$d"/temp-*.rdb
  ( (cd "$d" && exec setsid redis-server "$d/redis.conf") >>"$d/stdout.log" 2>&1 </dev/null &)
  wait_for 10 "redis on $port" up "$port"
}

# CLUSTER NODES as seen by the first node that answers (skipping EXCEPT); lines
#   <id> <ip:port@cport> <flags> <master-id|-> <ping> <pong> <epoch> <link> [slots...]
view() {
  local p out
  for p in "${ports[@]}"; do
    [ "$p" = "${1:-}" ] && continue
    out=$(cli "$p" cluster nodes) && [ -n "$out" ] && { echo "$out"; return 0; }
  done
  return 1
}
# Flag "fail" (agreed by a majority of masters), not "fail?" (one node's suspicion).
masters_in() { awk '$3 ~ /master/ && $3 !~ /(^|,)fail(,|$)/ && NF >= 9 { split($2, a, "[:@]"); print a[2] }'; }
id_in() { awk -v p="$1" '{ split($2, a, "[:@]"); if (a[2] == p) print $1 }'; }
replicas_in() { awk -v m="$1" '$4 == m && $3 ~ /slave/ && $3 !~ /(^|,)fail(,|$)/ { split($2, a, "[:@]"); print a[2] }'; }

replica_of() {
  local v id r
  v=$(view) || die "no node answers"
  id=$(id_in "$1" <<<"$v")
  [ -n "$id" ] || die "no node on $1 in the cluster"
  r=$(replicas_in "$id" <<<"$v" | head -1)
  [ -n "$r" ] || die "master $1 has no live replica"
  echo "$r"
}

# Healthy: every node answers, agrees the state is ok and knows all six, three masters own the
# slots, and each has a replica whose link is up (so writes are being copied again).
node_ok() { cli "$1" cluster info | grep -q '^cluster_state:ok'; }
healthy() {
  local p n=0
  for p in "${ports[@]}"; do
    cli "$p" cluster info | grep -q '^cluster_state:ok' || return 1
    cli "$p" cluster info | grep -q '^cluster_known_nodes:6' || return 1
    if [ "$(role "$p")" = slave ]; then
      [ "$(info_field "$p" replication master_link_status)" = up ] || return 1
      n=$((n + 1))
    fi
  done
  [ "$n" = 3 ] || return 1
  # and the node we read the topology from already knows who replicates whom (gossip lags).
  local v m
  v=$(view) || return 1
  [ "$(masters_in <<<"$v" | wc -l)" = 3 ] || return 1
  for m in $(masters_in <<<"$v"); do [ -n "$(replicas_in "$(id_in "$m" <<<"$v")" <<<"$v")" ] || return 1; done
}

iptables_ready() {
  command -v iptables >/dev/null || {
    say "installing iptables"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q iptables >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q iptables >/dev/null; }
  }
  iptables -w -S INPUT >/dev/null 2>&1 || die "iptables does not work here (root with CAP_NET_ADMIN needed)"
}
# Remove the rules we added (by their comment: $tag-MASTER_PORT), those of one master's cut or,
# with no argument, all of them whatever command added them.
uncut() {
  command -v iptables >/dev/null || return 0
  local rule
  iptables -w -S INPUT 2>/dev/null | { grep -F -- "--comment $tag${1:+-$1}" || true; } | sed 's/^-A /-D /' \
    | while read -r rule; do
      # shellcheck disable=SC2086 # the rule is a list of words on purpose
      iptables -w $rule
    done
}

# ---------------------------------------------------------------------------------------------

cmd_start() {
  local p running=0
  for p in "${ports[@]}"; do alive "$p" && running=$((running + 1)); done
  if [ "$running" = 0 ]; then
    # Nothing runs: make a fresh cluster. Old nodes.conf files would bring back the previous
    # topology with no data in it, which is not what `start` should mean.
    for p in "${ports[@]}"; do rm -f "$(node_dir "$p")/nodes.conf"; done
  fi
  for p in "${ports[@]}"; do
    if alive "$p"; then
      up "$p" || die "redis on $p runs but does not answer (paused? try: $0 --dir $dir resume $p)"
    else
      start_node "$p"
    fi
  done
  if [ "$(cli 7300 cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\)/\1/p')" = 1 ]; then
    local addrs=() a
    for a in "${ports[@]}"; do addrs+=("127.0.0.1:$a"); done
    # Six nodes and one replica each: the first three become the masters; which replica follows
    # which is redis-cli's choice (it shuffles them), hence `replica-of`.
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
      >"$dir/redis/cluster-create.log" 2>&1 || { tail -20 "$dir/redis/cluster-create.log" >&2; die "cluster create failed"; }
  fi
  wait_for 60 "redis cluster healthy (state ok on all six, replicas linked)" healthy
  say "redis cluster on ${ports[0]}-${ports[5]}: healthy"
  local m
  for m in $(view | masters_in | sort -n); do say "  master $m  replica $(replica_of "$m")"; done
}

cmd_stop() {
  local p pid
  uncut
  for p in "${ports[@]}"; do
    pid=$(pid_of "$p") || continue
    kill -CONT "$pid" 2>/dev/null || true
    # Nothing to save (no persistence): NOW skips a master's wait for lagging replicas.
    cli "$p" shutdown nosave now >/dev/null || true
    for _ in $(seq 50); do gone "$pid" && break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    say "redis on $p: stopped"
  done
}

cmd_status() {
  local p pid st
  for p in "${ports[@]}"; do
    if ! pid=$(pid_of "$p"); then printf '%s down\n' "$p"; continue; fi
    st=$(awk '{print $3}' "/proc/$pid/stat")
    if [ "$st" = T ]; then printf '%s paused pid=%s\n' "$p" "$pid"; continue; fi
    printf '%s %s pid=%s rss=%sKiB used_memory=%s state=%s%s\n' "$p" "$(role "$p")" "$pid" \
      "$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")" "$(info_field "$p" memory used_memory_human)" \
      "$(cli "$p" cluster info | sed -n 's/^cluster_state://p')" \
      "$([ "$(role "$p")" = slave ] && echo " of=$(info_field "$p" replication master_port) link=$(info_field "$p" replication master_link_status)")"
  done
}

cmd_nodes() {
  local p out=()
  for p in "${ports[@]}"; do out+=("redis://127.0.0.1:$p"); done
  (IFS=,; echo "${out[*]}")
}

cmd_masters() { local v; v=$(view) || die "no node answers"; masters_in <<<"$v" | sort -n; }

cmd_kill() {
  local pid
  pid=$(pid_of "$1") || die "redis on $1 is not running"
  kill -9 "$pid"
  wait_for 10 "redis on $1 to die" gone "$pid"
  say "redis on $1: killed (pid $pid)"
}

cmd_pause() { local pid; pid=$(pid_of "$1") || die "redis on $1 is not running"; kill -STOP "$pid"; say "redis on $1: paused"; }
cmd_resume() { local pid; pid=$(pid_of "$1") || die "redis on $1 is not running"; kill -CONT "$pid"; say "redis on $1: resumed"; }

# The node comes back with its nodes.conf, so with its old id and epochs but no data. If it was a
# master and its replica has been promoted meanwhile (a higher config epoch now owns its slots),
# the cluster tells it so on the first gossip and it turns itself into a replica of the new
# master, then full-syncs from it: that is the rejoin we want. Started *before* the failover, it
# would instead come back as the master of its slots, empty, and its replica would full-sync
# from it and drop the shard's data. So a master is started again only once another node owns
# its slots (which takes cluster-node-timeout plus an election: a few seconds).
cmd_restart() {
  local port=$1 id t0 want=slave
  if alive "$port"; then say "redis on $port is running: killing it first"; cmd_kill "$port"; fi
  id=$(awk '/myself/ {print $1}' "$(node_dir "$port")/nodes.conf" 2>/dev/null || true)
  [ -n "$id" ] || die "no cluster identity for $port ($(node_dir "$port")/nodes.conf): use start"
  owns_slots() { view "$port" | awk -v id="$id" '$1 == id && $3 ~ /master/ && NF >= 9 {f=1} END {exit !f}'; }
  # A replica that answers could still take over; with none (killed too), waiting is pointless.
  replica_up() {
    local rp
    for rp in $(view "$port" | awk -v id="$id" '$4 == id && $3 ~ /slave/ { split($2, a, "[:@]"); print a[2] }'); do
      up "$rp" && return 0
    done
    return 1
  }
  if owns_slots; then
    t0=$(now_ms)
    if replica_up; then
      say "redis on $port still owns its slots: waiting for its replica to take over first"
      for _ in $(seq 300); do owns_slots && replica_up || break; sleep 0.1; done
    fi
    if owns_slots; then
      say "no failover (no live replica, or none within 30 s): $port comes back as an EMPTY master of its slots"
      want=master
    else
      say "failover of $port done after $(($(now_ms) - t0)) ms more"
    fi
  fi
  t0=$(now_ms)
  start_node "$port"
  wait_for 30 "redis on $port to rejoin as $want (cluster state ok, replication link up)" rejoined "$port" "$want"
  say "redis on $port: back as $(role "$port")$([ "$(role "$port")" = slave ] && echo " of $(info_field "$port" replication master_port)") in $(($(now_ms) - t0)) ms"
}
rejoined() { # port slave|master
  node_ok "$1" && [ "$(role "$1")" = "$2" ] || return 1
  [ "$2" = master ] || [ "$(info_field "$1" replication master_link_status)" = up ]
}

cmd_lagging_failover() {
  local m=$1 hold=$2 r rpid conns eph moff roff t0 t1 t2 poff
  [[ "$hold" =~ ^[0-9]+$ ]] || die "HOLD_MS must be a whole number of milliseconds, got '$hold'"
  # Past repl-timeout (60 s) the replica drops the silent link and reconnects on a new port,
  # which the rules below do not match: the lag would end by a full resync.
  [ "$hold" -lt 50000 ] || die "HOLD_MS must stay below 50000 (repl-timeout is 60 s)"
  [ "$(role "$m")" = master ] || die "redis on $m is not an answering master"
  r=$(replica_of "$m")
  [ "$(info_field "$r" replication master_link_status)" = up ] || die "replica $r of $m is not linked"
  iptables_ready
  rpid=$(pid_of "$r") || die "no pid for replica $r"

  # The replication link is the replica's own TCP connection to the master's client port
  # (127.0.0.1:EPHEMERAL -> 127.0.0.1:M). Dropping that 4-tuple both ways freezes the copy while
  # the cluster bus (port+10000, other connections) keeps running, so the failure detection and
  # election still happen. Neither side notices: no RST, nothing until repl-timeout (60 s).
  conns=$(ss -Htnp state established "( dport = :$m )" | grep -F "pid=$rpid," | awk '{print $3}')
  [ "$(grep -c . <<<"$conns")" = 1 ] || die "expected one replication connection from $r (pid $rpid) to $m, found: ${conns:-none}"
  eph=${conns##*:}
  # INPUT only: every loopback packet passes OUTPUT then INPUT, and a DROP in OUTPUT would hand
  # the sender an EPERM instead of silence.
  trap "uncut $m" EXIT
  iptables -w -I INPUT 1 -i lo -p tcp -s 127.0.0.1 -d 127.0.0.1 --sport "$eph" --dport "$m" \
    -m comment --comment "$tag-$m" -j DROP
  iptables -w -I INPUT 1 -i lo -p tcp -s 127.0.0.1 -d 127.0.0.1 --sport "$m" --dport "$eph" \
    -m comment --comment "$tag-$m" -j DROP
  say "cut replication link $r(:$eph) <-> $m; master_repl_offset=$(info_field "$m" replication master_repl_offset)" \
    "replica offset=$(info_field "$r" replication slave_repl_offset); holding ${hold} ms"
  sleep "$(printf '%d.%03d' $((hold / 1000)) $((hold % 1000)))"

  moff=$(info_field "$m" replication master_repl_offset)
  roff=$(info_field "$r" replication slave_repl_offset)
  kill -9 "$(pid_of "$m")"
  t0=$(now_ms)
  say "killed master $m at master_repl_offset=$moff (at least: writes may land between INFO and the kill);" \
    "replica $r at slave_repl_offset=$roff: $((moff - roff)) bytes behind"
  wait_for 30 "promotion of $r" sh -c "[ \"\$(timeout 2 redis-cli -p $r role 2>/dev/null | head -1)\" = master ]"
  t1=$(now_ms)
  uncut "$m"
  trap - EXIT
  poff=$(info_field "$r" replication master_repl_offset)
  say "replica $r promoted after $((t1 - t0)) ms; its master_repl_offset=$poff"
  # Served again: every live node routes the slots to the promoted node (a client redirected by
  # any of them lands there) and reports cluster_state:ok. With full coverage off the state
  # alone says little: it stays ok while one shard is down.
  routed() {
    local p rid
    rid=$(view "$m" | id_in "$r")
    for p in "${ports[@]}"; do
      [ "$p" = "$m" ] && continue
      node_ok "$p" || return 1
      cli "$p" cluster nodes | awk -v id="$rid" '$1 == id && $3 ~ /master/ && NF >= 9 {f=1} END {exit !f}' || return 1
    done
  }
  wait_for 30 "every live node routing the slots to $r" routed
  t2=$(now_ms)
  say "all five live nodes route the slots to $r $((t2 - t0)) ms after the kill"
  echo "master=$m replica=$r master_offset=$moff replica_offset=$roff lost_bytes=$((moff - roff)) promoted_offset=$poff failover_ms=$((t1 - t0)) routed_ms=$((t2 - t0))"
}

# Acknowledged INCRs on a master during a cut-off hold are gone after the lagging failover, and
# the killed master comes back as a replica of the promoted one.
cmd_selftest() {
  local key='{nemesis}lag' slot m r wlog acked got report
  cmd_start
  slot=$(cli 7300 cluster keyslot "$key")
  m=$(view | awk -v s="$slot" '$3 ~ /master/ && $3 !~ /(^|,)fail(,|$)/ {
        for (i = 9; i <= NF; i++) { n = split($i, a, "-"); lo = a[1]; hi = (n == 2 ? a[2] : a[1]);
          if (s >= lo + 0 && s <= hi + 0) { split($2, b, "[:@]"); print b[2] } } }')
  [ -n "$m" ] || die "no master owns slot $slot"
  r=$(replica_of "$m")
  say "selftest: key $key (slot $slot) on master $m, replica $r"
  cli "$m" set "$key" 0 >/dev/null
  cli "$m" wait 1 2000 >/dev/null # the replica has the starting value
  wlog=$dir/redis/selftest-writes.log
  # One INCR a millisecond on the master itself; each reply printed is an acknowledged write.
  # redis-cli exits on its own when the master dies under it.
  (redis-cli -p "$m" -r -1 -i 0.001 INCR "$key" >"$wlog" 2>/dev/null || true) &
  local writer=$!
  sleep 0.5
  report=$(cmd_lagging_failover "$m" 2000)
  wait "$writer" || true
  acked=$(grep -E '^[0-9]+$' "$wlog" | tail -1)
  got=$(cli "$r" get "$key")
  echo "$report"
  echo "last acknowledged INCR on $m: $acked; value on the promoted $r: $got; lost: $((acked - got))"
  [ "$got" -lt "$acked" ] || die "the promoted replica has every acknowledged write ($got >= $acked): no loss shown"
  cmd_restart "$m"
  wait_for 30 "cluster healthy again" healthy
  # A replica answers reads only on a READONLY connection (else MOVED to its master).
  [ "$(printf 'READONLY\nGET %s\n' "$key" | timeout 2 redis-cli -p "$m" | tail -1)" = "$got" ] \
    || die "restarted $m does not hold the promoted value"
  say "selftest: $m rejoined as a replica of $(info_field "$m" replication master_port) holding $key=$got; cluster healthy"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  nodes) cmd_nodes ;;
  masters) cmd_masters ;;
  replica-of) need_port "${2:-}"; replica_of "$2" ;;
  kill) need_port "${2:-}"; cmd_kill "$2" ;;
  restart) need_port "${2:-}"; cmd_restart "$2" ;;
  pause) need_port "${2:-}"; cmd_pause "$2" ;;
  resume) need_port "${2:-}"; cmd_resume "$2" ;;
  lagging-failover) need_port "${2:-}"; [ -n "${3:-}" ] || die "usage: lagging-failover MASTER_PORT HOLD_MS"
    cmd_lagging_failover "$2" "$3" ;;
  selftest) cmd_selftest ;;
  *) usage >&2; exit 2 ;;
esac
