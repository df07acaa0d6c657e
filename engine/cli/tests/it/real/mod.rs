//! Tests against the real stores that `ci/services.sh` starts (Redis, a Redis Cluster, Apache
//! Kafka, MariaDB). Without their settings in the environment a test skips — unless
//! `SECKILL_REQUIRE_SERVICES` is set (as `ci/test.sh` does), in which case it fails.
//!
//! The stores outlive a test run, so every test works on activity ids, topics and consumer groups
//! of its own (`unique_id`) and never flushes anything.

mod bump;
mod conformance;
mod dead_letters;
mod differential;
mod e2e;
mod limits;
mod locks;
mod outage;
mod processes;
mod rewind;

use seckill_stores::kafka::{KafkaBus, KafkaConfig};
use seckill_stores::mysql::{MysqlConfig, MysqlLedger};
use seckill_stores::redis::{connect_stock_cache, RedisConfig, RedisStockCache};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A service setting, or `None` to skip the test (never when services are required).
pub fn service(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ if std::env::var_os("SECKILL_REQUIRE_SERVICES").is_some() => {
            panic!("{var} is not set but SECKILL_REQUIRE_SERVICES is: run ci/services.sh and source its env file")
        }
        _ => {
            eprintln!("skipped: {var} is not set (ci/services.sh starts the services)");
            None
        }
    }
}

/// Held by the tests that start many processes or restart a broker of their own: run side by
/// side on two cores, a JVM restarting under seven busy `seckill serve` processes took more than
/// three minutes to answer.
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A loopback port nobody listens on (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Ids no earlier run and no other test in this run has used: the time in ms, times 1000, plus
/// a per-process counter in steps of 100 (each caller may use the 100 ids after its own).
pub fn unique_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    (ms % 1_000_000_000_000) * 1_000 + NEXT.fetch_add(1, Ordering::Relaxed) % 10 * 100
}

pub async fn redis_single() -> Option<RedisStockCache> {
    let url = service("REDIS_URL")?;
    Some(
        connect_stock_cache(&RedisConfig::single(&url))
            .await
            .expect("connect to REDIS_URL"),
    )
}

pub async fn redis_cluster() -> Option<RedisStockCache> {
    let nodes = service("REDIS_CLUSTER_NODES")?;
    Some(
        connect_stock_cache(&RedisConfig::cluster(&nodes))
            .await
            .expect("connect to REDIS_CLUSTER_NODES"),
    )
}

/// A bus on a topic of its own (created with 3 partitions).
pub async fn kafka(topic_tag: &str) -> Option<KafkaBus> {
    let brokers = service("KAFKA_BROKERS")?;
    let mut cfg = KafkaConfig::new(&brokers, &format!("seckill.test.{topic_tag}.{}", unique_id()));
    cfg.partitions = 3;
    let bus = KafkaBus::connect(cfg).expect("kafka client");
    bus.ensure_topics().await.expect("create topics");
    Some(bus)
}

pub async fn mysql() -> Option<MysqlLedger> {
    let url = service("DATABASE_URL")?;
    let ledger = MysqlLedger::connect_lazy(&MysqlConfig::new(&url)).expect("DATABASE_URL");
    ledger.migrate().await.expect("migrate");
    Some(ledger)
}

/// A database of the test's own on the MariaDB server (created and migrated; dropped on drop):
/// for tests that run the jobs role, which works on every activity the registry holds — on the
/// shared database it would recover other tests' activities under their feet.
pub struct OwnDatabase {
    pub url: String,
    name: String,
    admin: sqlx::MySqlPool,
}

impl OwnDatabase {
    pub async fn create() -> Option<OwnDatabase> {
        let shared = service("DATABASE_URL")?;
        let admin = sqlx::MySqlPool::connect(&shared).await.expect("mariadb");
        let name = format!("seckill_t_{}", unique_id());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&admin)
            .await
            .expect("create the test's database");
        let base = shared.rsplit_once('/').expect("a database in DATABASE_URL").0;
        Some(OwnDatabase {
            url: format!("{base}/{name}"),
            name,
            admin,
        })
    }

    pub async fn ledger(&self) -> MysqlLedger {
        let ledger = MysqlLedger::connect_lazy(&MysqlConfig::new(&self.url)).expect("database url");
        ledger.migrate().await.expect("migrate");
        ledger
    }

    pub async fn drop_it(self) {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE `{}`", self.name)))
            .execute(&self.admin)
            .await;
    }
}

/// A one-node KRaft Kafka of a test's own (the jars `ci/services.sh` fetched), on free ports,
/// durable across its restarts.
pub struct OwnKafka {
    libs: String,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl OwnKafka {
    /// Format a node on free ports and start it; once listening, it is returned. The ports are
    /// free when picked, but the JVM binds them seconds later, and an outgoing connection of
    /// another test may take one meanwhile (the ephemeral range is the same): a node that exits
    /// before it listens is started again on other ports.
    pub fn start(libs: String) -> OwnKafka {
        for attempt in 1..=3 {
            let mut k = Self::format(libs.clone());
            k.spawn();
            match k.listening(Duration::from_secs(120)) {
                Ok(()) => return k,
                Err(why) => {
                    let log = std::fs::read_to_string(k.dir.join("kafka.log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    eprintln!("own kafka, attempt {attempt}: {why}; its stderr ended:");
                    tail.iter().rev().for_each(|l| eprintln!("  {l}"));
                }
            }
        }
        panic!("own kafka never listened in three attempts");
    }

    /// Wait until the broker's port accepts connections; `Err` if the JVM exited first or the
    /// deadline passed.
    fn listening(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("the broker on port {} exited: {status}", self.port));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the broker on port {} did not listen within {within:?}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn format(libs: String) -> OwnKafka {
        let (port, controller) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("seckill-test-kafka-{port}"));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n\
             listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
             inter.broker.listener.name=PLAINTEXT\nlog.dirs={}\noffsets.topic.replication.factor=1\n\
             offsets.topic.num.partitions=3\ntransaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\ngroup.initial.rebalance.delay.ms=0\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("server.properties"), props).unwrap();
        let java = |args: &[&str]| {
            let out = Command::new("java")
                .arg("-cp")
                .arg(format!("{libs}/*"))
                .args(args)
                .output()
                .expect("java");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .lines()
                .last()
                .unwrap_or_default()
                .to_string()
        };
        let cluster_id = java(&["kafka.tools.StorageTool", "random-uuid"]);
        let config = dir.join("server.properties").display().to_string();
        java(&[
            "kafka.tools.StorageTool",
            "format",
            "-t",
            &cluster_id,
            "-c",
            &config,
        ]);
        OwnKafka {
            libs,
            dir,
            port,
            child: None,
        }
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Start the node again on its ports (after `kill`) and wait until it listens; a JVM that
    /// exits first is started again.
    pub fn up(&mut self) {
        for attempt in 1..=3 {
            self.spawn();
            match self.listening(Duration::from_secs(120)) {
                Ok(()) => return,
                Err(why) => eprintln!("own kafka restart, attempt {attempt}: {why}"),
            }
        }
        panic!("own kafka on port {} never listened again", self.port);
    }

    fn spawn(&mut self) {
        let child = Command::new("java")
            .args([
                "-Xms128m",
                "-Xmx256m",
                "-cp",
                &format!("{}/*", self.libs),
                "kafka.Kafka",
            ])
            .arg(self.dir.join("server.properties"))
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.join("kafka.log")))
            .spawn()
            .expect("start kafka");
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send the broker's JVM a signal (STOP: it keeps its connections and answers nothing).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("the broker runs").id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{sig} the broker");
    }
}

/// Append to `path` (a child's stderr: why a server of a test's own died).
fn log_file(path: &std::path::Path) -> Stdio {
    match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::null(),
    }
}

impl Drop for OwnKafka {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Wait until the broker serves metadata again (topic creation is idempotent) and `bus` has seen
/// it answer (its probe clears a "known down" left by the broker's absence, as the API role's
/// refresher does every period). A JVM starting while the rest of the suite loads both cores can
/// take a while: the bound is generous.
pub async fn until_kafka_answers(bus: &KafkaBus) {
    use seckill_core::ports::OrderBus;
    let deadline = Instant::now() + Duration::from_secs(180);
    while let Err(e) = async { bus.ensure_topics().await.and(bus.probe().await) }.await {
        assert!(Instant::now() < deadline, "kafka did not come up: {e}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
