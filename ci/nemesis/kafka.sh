#!/usr/bin/env bash
# A 3-node Apache Kafka cluster in KRaft mode (each node broker + controller) on loopback, for the
# fault-injection test: the nemesis kills, restarts, pauses and resumes single nodes.
#   kafka.sh start | stop | status | brokers                      [--dir D]
#   kafka.sh kill N | restart N | pause N | resume N (N = 1..3)   [--dir D]
#   kafka.sh leader TOPIC PARTITION                               [--dir D]
# Node N: clients on 127.0.0.1:1909(N+1), controller on 127.0.0.1:1919(N+1); its config, data,
# pid and console output in D/kafka/node-N (D: target/nemesis). The jars are ci/services.sh's:
# $KAFKA_LIBS, else target/services/kafka/libs (run ci/services.sh once to fetch them).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=$repo/target/nemesis
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = --dir ]; then dir=$(realpath -m "$2"); shift 2; else args+=("$1"); shift; fi
done
set -- "${args[@]}"
libs=${KAFKA_LIBS:-$repo/target/services/kafka/libs}
kdir=$dir/kafka
brokers=127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094

# Messages on stderr: stdout is for what callers parse (brokers, leader, status).
say() { printf '[nemesis-kafka] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
[ -f "$libs/.complete" ] || die "no Kafka jars in $libs: run ci/services.sh first"

# The 2 cores are shared with the engine, the stores and the checker: small heaps, the serial GC,
# only the C1 JIT and one "processor" (the JVM sizes its own thread pools by it).
jvm=(-Xms128m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ActiveProcessorCount=1
  -XX:ReservedCodeCacheSize=64m -XX:MaxMetaspaceSize=128m -Xss512k -XX:+ExitOnOutOfMemoryError)
# The tools are short-lived JVMs; the jars carry no SLF4J binding: its warning is dropped.
tool() { java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$libs/*" "$@" 2> >(grep -v '^SLF4J' >&2); }

node_ok() { [[ ${1:-} =~ ^[123]$ ]] || die "node id must be 1, 2 or 3 (got '${1:-}')"; }
pid() { cat "$kdir/node-$1/pid" 2>/dev/null; }
alive() { local p; p=$(pid "$1") && grep -qa kafka.Kafka "/proc/$p/cmdline" 2>/dev/null; }
paused() { grep -q '^State:\s*T' "/proc/$(pid "$1")/status" 2>/dev/null; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() { # SECONDS WHAT COMMAND...: retry COMMAND every 0.5 s until it succeeds.
  local secs=$1 what=$2 i n; shift 2
  for ((i = 0; i < secs * 2; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  for n in 1 2 3; do alive $n || say "node $n is down: $(tail -3 "$kdir/node-$n/console.log" 2>/dev/null)"; done
  die "$what: not within ${secs}s"
}

# TopicCommand, bootstrapped from the nodes that run and are not paused: a paused node accepts
# connections and never answers (and is in the metadata until fenced: short request timeouts).
topic_cmd() {
  local up=() n
  for n in 1 2 3; do alive $n && ! paused $n && up+=("127.0.0.1:$((19091 + n))"); done
  printf 'request.timeout.ms=3000\ndefault.api.timeout.ms=10000\nmetadata.max.age.ms=1000\n' >"$kdir/admin.properties"
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(IFS=,; echo "${up[*]:-$brokers}")" \
    --command-config "$kdir/admin.properties" "$@"
}
# partitions TOPIC_REGEX: one "topic partition leader isr" line per partition. Tried 3 times: while
# a paused node is not yet fenced (5 s) a call to it can time out (10 s).
partitions() {
  local out i
  for i in 1 2 3; do out=$(topic_cmd --describe --topic "$1" 2>&1) && break; done || { echo "$out" >&2; return 1; }
  sed -n 's/.*Topic: \([^\t]*\)\tPartition: \([0-9]*\)\tLeader: \([^\t]*\)\tReplicas: [^\t]*\tIsr: \([^\t]*\).*/\1 \2 \3 \4/p' <<<"$out"
}
all_in_sync() { # all 6 + 3 partitions of the two topics have the 3 nodes in their ISR
  [ "$(partitions 'seckill\.orders(\.dlq)?' | awk 'split($4, a, ",") == 3 { n++ } END { print n + 0 }')" = 9 ]
}

conf() { # node N's server.properties, written at every start (the same each time)
  local n=$1 d=$kdir/node-$1
  mkdir -p "$d/data"
  cat >"$d/server.properties" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=1@127.0.0.1:19192,2@127.0.0.1:19193,3@127.0.0.1:19194
listeners=PLAINTEXT://127.0.0.1:$((19091 + n)),CONTROLLER://127.0.0.1:$((19191 + n))
advertised.listeners=PLAINTEXT://127.0.0.1:$((19091 + n))
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
# An acknowledged write (acks=all) is on 2 of 3 nodes and no election may lose it; topics are
# only made on purpose (a misspelt name must fail, not make a new topic).
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
auto.create.topics.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
# A node that stopped (killed or paused) is fenced and loses its leaderships after 5 s, not 9,
# and a request forwarded to a paused active controller is given up after 5 s, not 30.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=5000
controller.socket.timeout.ms=5000
# Few threads where Kafka's defaults assume a machine of its own; the log cleaner's dedupe buffer
# (128 MiB of heap by default) small: only the offsets topic is compacted here.
num.network.threads=1
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=8388608
group.coordinator.threads=1
EOF
}

launch() { # node N in a session of its own: a signal to the caller's process group misses it
  local n=$1 d=$kdir/node-$1
  if alive "$n"; then kill -CONT "$(pid "$n")"; say "node $n: already running (pid $(pid "$n"))"; return; fi
  conf "$n"
  rm -f "$d/pid"
  # bash writes its pid and becomes the JVM: the pid file names the broker itself.
  setsid bash -c 'echo $$ >"$0/pid"; exec "$@"' "$d" java "${jvm[@]}" -cp "$libs/*" kafka.Kafka \
    "$d/server.properties" </dev/null >>"$d/console.log" 2>&1 &
  wait_for 10 "node $n pid file" test -s "$d/pid"
  say "node $n: started (pid $(pid "$n"))"
}
kill_node() { kill -KILL "$(pid "$1")"; wait_for 10 "node $1 to die" eval "! alive $1"; }

cmd=${1:-}
case $cmd in
  start)
    started=$(date +%s); mkdir -p "$kdir"
    # One cluster id for the three, made once (16 random bytes, base64url, Kafka's form).
    while [[ ! -s $kdir/cluster-id || $(cat "$kdir/cluster-id") == -* ]]; do
      head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=' >"$kdir/cluster-id"
    done
    for n in 1 2 3; do
      [ -f "$kdir/node-$n/data/meta.properties" ] && continue
      conf $n
      tool kafka.tools.StorageTool format -t "$(cat "$kdir/cluster-id")" -c "$kdir/node-$n/server.properties" >/dev/null
    done
    for n in 1 2 3; do launch $n; done
    for n in 1 2 3; do wait_for 120 "node $n listening on $((19091 + n))" port_open $((19091 + n)); done
    # Three replicas can only be placed once all three brokers have registered: retry.
    for t in seckill.orders:6 seckill.orders.dlq:3; do
      wait_for 120 "topic ${t%:*}" topic_cmd --create --if-not-exists --topic "${t%:*}" --partitions "${t#*:}" \
        --replication-factor 3 --config min.insync.replicas=2
    done
    wait_for 120 "all partitions with 3 in-sync replicas" all_in_sync
    say "up in $(($(date +%s) - started))s: $brokers (state in $kdir)"
    ;;
  stop)
    for n in 1 2 3; do if alive $n; then kill -CONT "$(pid $n)"; kill -TERM "$(pid $n)"; fi; done
    # A clean shutdown restarts quicker; one that hangs (the quorum gone first) is cut short.
    for ((i = 0; i < 30; i++)); do alive 1 || alive 2 || alive 3 || break; sleep 0.5; done
    for n in 1 2 3; do if alive $n; then kill_node $n; say "node $n: killed after 15s"; fi; done
    say "stopped"
    ;;
  kill) node_ok "${2:-}"; alive "$2" || die "node $2 is not running"; kill_node "$2"; say "node $2: killed" ;;
  restart)
    node_ok "${2:-}"; if alive "$2"; then kill_node "$2"; fi; launch "$2"
    wait_for 120 "node $2 listening" port_open $((19091 + $2))
    ;;
  pause | resume)
    node_ok "${2:-}"; alive "$2" || die "node $2 is not running"
    kill "-$([ "$cmd" = pause ] && echo STOP || echo CONT)" "$(pid "$2")"
    say "node $2: ${cmd}d"
    ;;
  status)
    for n in 1 2 3; do
      if ! alive $n; then echo "node $n down"; else echo "node $n $(paused $n && echo paused || echo running) pid $(pid $n)"; fi
    done
    alive 1 || alive 2 || alive 3 || exit 0
    partitions 'seckill\.orders' | awk '$1 == "seckill.orders" { print "partition", $2, "leader", $3, "isr", $4 }'
    ;;
  brokers) echo "$brokers" ;;
  leader)
    [ $# -eq 3 ] || die "usage: kafka.sh leader TOPIC PARTITION"
    partitions "${2//./\\.}" | awk -v t="$2" -v p="$3" '$1 == t && $2 == p { print $3; f = 1 } END { exit !f }' ||
      die "no partition $3 of $2 in the metadata"
    ;;
  *) die "usage: kafka.sh start|stop|status|brokers|kill N|restart N|pause N|resume N|leader TOPIC PARTITION [--dir D]" ;;
esac
