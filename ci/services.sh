#!/usr/bin/env bash
# Install (if missing) and start, on loopback only, the three real stores the tests need:
#   Redis (Debian redis-server): one instance on 6379 and a 3-master Cluster on 7000-7002;
#   MariaDB (Debian mariadb-server): database `seckill`, user `seckill`, snapshot isolation on;
#   Apache Kafka, one KRaft node (broker + controller) on 9092, its jars from Maven Central
#   through ci/kafka/pom.xml, run on the machine's Java 17;
#   and each store over TLS with credentials, with a CA and certificates made here (openssl):
#   Redis on 6380 (TLS only, ACL user) and a 3-master Cluster on 7100-7102 (TLS only, client
#   and cluster bus, password), MariaDB's TLS-only user `seckill_tls`, Kafka SASL_SSL
#   (PLAIN) on 9094;
#   and Jaeger (v2 all-in-one, built with Go through ci/jaeger/go.mod): the OTLP collector the
#   trace test exports to (4318) and reads back (16686).
# Idempotent: whatever already answers is reused. Writes the connection settings to
# $SECKILL_SERVICES_DIR/env (default target/services/env), which ci/test.sh sources.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
dir=${SECKILL_SERVICES_DIR:-$repo/target/services}
mkdir -p "$dir"

say() { printf '[services] %s\n' "$*"; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

# wait_for SECONDS WHAT COMMAND...: retry COMMAND every 0.5 s until it succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  local tries=$((secs * 2))
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "$what did not come up within ${secs}s"
}

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "$@" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}

# Building the engine: librdkafka links the system OpenSSL (Kafka over TLS).
pkg-config --exists openssl 2>/dev/null || { say "installing libssl-dev"; apt_install libssl-dev pkg-config; }
# seckill bench --instructions (and its test) counts with valgrind's callgrind.
command -v callgrind_control >/dev/null || { say "installing valgrind"; apt_install valgrind; }

# ---------------------------------------------------------------------------------------------
# A CA and one server certificate (for 127.0.0.1 and localhost) shared by the three stores' TLS
# listeners; the clients trust the CA. PEM throughout (Kafka reads a PEM keystore since 2.7).
# clientAuth too: a Redis Cluster node presents it on the cluster bus, which always checks it.

tls=$dir/tls
if [ ! -f "$tls/server.pem" ]; then
  say "making a test CA and server certificate in $tls"
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=seckill test CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
    >"$tls/server.ext"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 3650 -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
  cat "$tls/server.key" "$tls/server.pem" >"$tls/keystore.pem"
fi

# ---------------------------------------------------------------------------------------------
# Redis

command -v redis-server >/dev/null || { say "installing redis-server"; apt_install redis-server redis-tools; }

redis_up() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }

start_redis() { # port [extra args...]
  local port=$1; shift
  if redis_up "$port"; then say "redis on $port: already running"; return; fi
  mkdir -p "$dir/redis-$port"
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --dir "$dir/redis-$port" --logfile "$dir/redis-$port/redis.log" \
    --pidfile "$dir/redis-$port/redis.pid" "$@"
  wait_for 10 "redis on $port" redis_up "$port"
  say "redis on $port: started"
}

start_redis 6379
for port in 7000 7001 7002; do
  start_redis "$port" --cluster-enabled yes --cluster-config-file "$dir/redis-$port/nodes.conf" \
    --cluster-node-timeout 5000
done
# TLS only (no plaintext port), the default user off, one ACL user with a password.
redis_tls_up() {
  [ "$(redis-cli -p 6380 --tls --cacert "$tls/ca.pem" --user seckill --pass seckill-tls --no-auth-warning ping 2>/dev/null)" = PONG ]
}
if redis_tls_up; then
  say "redis (TLS) on 6380: already running"
else
  mkdir -p "$dir/redis-6380"
  redis-server --port 0 --tls-port 6380 --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --tls-cert-file "$tls/server.pem" --tls-key-file "$tls/server.key" \
    --tls-ca-cert-file "$tls/ca.pem" --tls-auth-clients no \
    --user default off --user seckill on '>seckill-tls' '~*' '&*' '+@all' \
    --dir "$dir/redis-6380" --logfile "$dir/redis-6380/redis.log" --pidfile "$dir/redis-6380/redis.pid"
  wait_for 10 "redis (TLS) on 6380" redis_tls_up
  say "redis (TLS) on 6380: started"
fi

cluster_ok() { redis-cli -p 7000 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
if ! cluster_ok; then
  if [ "$(redis-cli -p 7000 cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 1 ]; then
    redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 \
      --cluster-replicas 0 --cluster-yes >"$dir/redis-cluster-create.log"
  fi
  wait_for 30 "redis cluster state ok" cluster_ok
fi
say "redis cluster on 7000-7002: $(redis-cli -p 7000 cluster info | grep -E '^cluster_(state|known_nodes)' | tr -d '\r' | tr '\n' ' ')"

# The same Cluster shape over TLS (client and cluster bus), with a password: 7100-7102.
tls_cli() { redis-cli --tls --cacert "$tls/ca.pem" -a seckill-tls --no-auth-warning "$@"; }
tls_node_up() { [ "$(tls_cli -p "$1" ping 2>/dev/null)" = PONG ]; }
for port in 7100 7101 7102; do
  if tls_node_up "$port"; then continue; fi
  mkdir -p "$dir/redis-$port"
  redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
    --tls-cert-file "$tls/server.pem" --tls-key-file "$tls/server.key" --tls-ca-cert-file "$tls/ca.pem" \
    --tls-auth-clients no --tls-cluster yes --requirepass seckill-tls --masterauth seckill-tls \
    --cluster-enabled yes --cluster-config-file "$dir/redis-$port/nodes.conf" --cluster-node-timeout 5000 \
    --dir "$dir/redis-$port" --logfile "$dir/redis-$port/redis.log" --pidfile "$dir/redis-$port/redis.pid"
  wait_for 10 "redis (TLS cluster) on $port" tls_node_up "$port"
done
tls_cluster_ok() { tls_cli -p 7100 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
if ! tls_cluster_ok; then
  if [ "$(tls_cli -p 7100 cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 1 ]; then
    tls_cli --cluster create 127.0.0.1:7100 127.0.0.1:7101 127.0.0.1:7102 \
      --cluster-replicas 0 --cluster-yes >"$dir/redis-tls-cluster-create.log"
  fi
  wait_for 30 "redis TLS cluster state ok" tls_cluster_ok
fi
say "redis TLS cluster on 7100-7102: $(tls_cli -p 7100 cluster info | grep -E '^cluster_(state|known_nodes)' | tr -d '\r' | tr '\n' ' ')"

# ---------------------------------------------------------------------------------------------
# MariaDB

command -v mariadbd >/dev/null || { say "installing mariadb-server"; apt_install mariadb-server mariadb-client; }

mariadb_up() { mariadb-admin --protocol=socket ping >/dev/null 2>&1; }
# TLS for MariaDB: the server's files where the mysql user can read them, named in a config file
# the packaged server reads at start. A server running without them is restarted.
mkdir -p /etc/mysql/seckill-tls /etc/mysql/mariadb.conf.d
cp "$tls/ca.pem" "$tls/server.pem" "$tls/server.key" /etc/mysql/seckill-tls/
chown -R mysql:mysql /etc/mysql/seckill-tls 2>/dev/null || true
cat >/etc/mysql/mariadb.conf.d/90-seckill-tls.cnf <<'CNF'
[mariadbd]
ssl_ca = /etc/mysql/seckill-tls/ca.pem
ssl_cert = /etc/mysql/seckill-tls/server.pem
ssl_key = /etc/mysql/seckill-tls/server.key
CNF
# MariaDB 11.6 and later refuse a write to a row changed since the transaction's read view
# (error 1020) where 10.x lets it work on rows its view does not show: the tests run under the
# stricter default (set globally below too, for a server that is already running).
cat >/etc/mysql/mariadb.conf.d/91-seckill-snapshot.cnf <<'CNF'
[mariadbd]
innodb_snapshot_isolation = ON
CNF
if mariadb_up && [ "$(mariadb --protocol=socket -N -e "SELECT @@have_ssl" 2>/dev/null)" != YES ]; then
  say "mariadb: restarting to enable TLS"
  mariadb-admin --protocol=socket shutdown
  wait_for 60 "mariadb to stop" sh -c '! mariadb-admin --protocol=socket ping'
fi
if ! mariadb_up; then
  # No systemd in a container: the Debian init script starts mysqld_safe with the packaged config.
  service mariadb start >/dev/null 2>&1 || {
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    (setsid mysqld_safe >"$dir/mariadb.out" 2>&1 &)
  }
  wait_for 60 "mariadb" mariadb_up
  say "mariadb: started"
else
  say "mariadb: already running"
fi
# The tests create their own databases (seckill_*) so that runs never see each other's rows.
mariadb --protocol=socket <<'SQL'
SET GLOBAL innodb_snapshot_isolation = ON;
CREATE DATABASE IF NOT EXISTS seckill;
CREATE USER IF NOT EXISTS 'seckill'@'localhost' IDENTIFIED BY 'seckill';
CREATE USER IF NOT EXISTS 'seckill'@'127.0.0.1' IDENTIFIED BY 'seckill';
GRANT ALL PRIVILEGES ON `seckill%`.* TO 'seckill'@'localhost';
GRANT ALL PRIVILEGES ON `seckill%`.* TO 'seckill'@'127.0.0.1';
CREATE USER IF NOT EXISTS 'seckill_tls'@'127.0.0.1' IDENTIFIED BY 'seckill-tls' REQUIRE SSL;
GRANT ALL PRIVILEGES ON `seckill%`.* TO 'seckill_tls'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------------------------------------
# Kafka (KRaft, one node)

kafka_dir=$dir/kafka
libs=$kafka_dir/libs
java -version 2>&1 | grep -q '"17\.' || die "Kafka needs Java 17 (java -version: $(java -version 2>&1 | head -1))"
if [ ! -f "$libs/.complete" ]; then
  say "fetching the Kafka broker jars from Maven Central (ci/kafka/pom.xml)"
  rm -rf "$libs"
  mvn -q -B -f ci/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$libs" >"$kafka_dir.mvn.log" 2>&1 || { tail -20 "$kafka_dir.mvn.log"; die "mvn failed"; }
  touch "$libs/.complete"
fi
kafka_class() { java -cp "$libs/*" "$@" 2>&1 | grep -v '^SLF4J'; }
kafka_up() { kafka_class org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 --list; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if port_open 9092 && ! port_open 9094; then
  say "kafka: restarting to add the SASL_SSL listener on 9094"
  pkill -f 'kafka[.]Kafka ' || true
  wait_for 60 "kafka to stop" sh -c "! (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null"
fi
if ! port_open 9092; then
  mkdir -p "$kafka_dir/data"
  sed -e "s|@DATA@|$kafka_dir/data|" -e "s|@TLS@|$tls|" ci/kafka/server.properties >"$kafka_dir/server.properties"
  if [ ! -f "$kafka_dir/data/meta.properties" ]; then
    cluster_id=$(kafka_class kafka.tools.StorageTool random-uuid | tail -1)
    kafka_class kafka.tools.StorageTool format -t "$cluster_id" -c "$kafka_dir/server.properties" >/dev/null
  fi
  (setsid java -Xms256m -Xmx512m -cp "$libs/*" kafka.Kafka "$kafka_dir/server.properties" \
    >"$kafka_dir/kafka.out" 2>&1 &)
  wait_for 90 "kafka on 9092" port_open 9092
  wait_for 30 "kafka (SASL_SSL) on 9094" port_open 9094
  say "kafka: started"
else
  say "kafka: already running"
fi
wait_for 60 "kafka answering metadata requests" kafka_up
for topic in seckill.orders seckill.orders.dlq; do
  kafka_class org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 --create \
    --if-not-exists --topic "$topic" --partitions 6 --replication-factor 1 | grep -v WARNING || true
done

# ---------------------------------------------------------------------------------------------
# Jaeger (v2 all-in-one, spans in memory): the OTLP collector the trace test exports to and
# queries. Built with Go through ci/jaeger/go.mod (a few minutes the first time on 2 cores;
# then Go's build cache), configured by ci/jaeger/config.yaml (loopback only).

jaeger=$dir/jaeger/jaeger
jaeger_version=$(sed -n 's|^\tgithub.com/jaegertracing/jaeger \(v[^ ]*\).*|\1|p' ci/jaeger/go.mod)
if [ ! -x "$jaeger" ] || [ "$(cat "$dir/jaeger/.version" 2>/dev/null)" != "$jaeger_version" ]; then
  command -v go >/dev/null || die "Jaeger is built with Go: put go on PATH"
  say "building Jaeger $jaeger_version (ci/jaeger/go.mod)"
  mkdir -p "$dir/jaeger"
  (cd ci/jaeger && go build -o "$jaeger" github.com/jaegertracing/jaeger/cmd/jaeger) >"$dir/jaeger.build.log" 2>&1 \
    || { tail -20 "$dir/jaeger.build.log"; die "building Jaeger failed"; }
  echo "$jaeger_version" >"$dir/jaeger/.version"
fi
jaeger_up() { curl -sf http://127.0.0.1:16686/api/services; }
if jaeger_up >/dev/null 2>&1; then
  say "jaeger: already running"
else
  (cd "$dir/jaeger" && setsid nohup "$jaeger" --config="file:$repo/ci/jaeger/config.yaml" >"$dir/jaeger.log" 2>&1 &)
  wait_for 60 "jaeger answering its query API" jaeger_up
  say "jaeger: started (OTLP/HTTP on 4318, query API on 16686)"
fi

# ---------------------------------------------------------------------------------------------
# A TrueType font for `seckill bench --plot` (chart text).

[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || { say "installing fonts-dejavu-core"; apt_install fonts-dejavu-core; }

# ---------------------------------------------------------------------------------------------

cat >"$dir/env" <<EOF
export REDIS_URL=redis://127.0.0.1:6379
export REDIS_CLUSTER_NODES=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002
export DATABASE_URL=mysql://seckill:seckill@127.0.0.1:3306/seckill
export KAFKA_BROKERS=127.0.0.1:9092
export REDIS_TLS_URL=rediss://seckill:seckill-tls@127.0.0.1:6380
export REDIS_TLS_CLUSTER_NODES=rediss://:seckill-tls@127.0.0.1:7100,rediss://:seckill-tls@127.0.0.1:7101,rediss://:seckill-tls@127.0.0.1:7102
export DATABASE_TLS_URL='mysql://seckill_tls:seckill-tls@127.0.0.1:3306/seckill?ssl-mode=verify_identity&ssl-ca=$tls/ca.pem'
export KAFKA_TLS_BROKERS=127.0.0.1:9094
export SECKILL_TEST_CA_FILE=$tls/ca.pem
export REDIS_SERVER_BIN=$(command -v redis-server)
export KAFKA_LIBS=$libs
export JAEGER_OTLP=http://127.0.0.1:4318
export JAEGER_QUERY=http://127.0.0.1:16686
EOF

say "versions:"
say "  $(redis-server --version)"
say "  $(mariadbd --version)"
say "  jaeger $jaeger_version"
say "  kafka $(ls "$libs" | sed -n 's/^kafka_2\.13-\(.*\)\.jar$/\1/p') (KRaft), $(java -version 2>&1 | head -1)"
say "settings in $dir/env"
