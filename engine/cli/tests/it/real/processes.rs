//! Production topology on the real stores: the real binary as 3 API, 2 worker and 2 jobs
//! processes (`seckill serve --roles …`) on one Redis, Kafka and MariaDB, a sale driven through
//! every API process, and during it: processes killed (SIGKILL) and restarted, Redis restarted
//! without persistence, a pause through one API process and the resume through another, and an
//! API process stopped (SIGSTOP) past the producer's delivery timeout, and — once the recovery
//! after the Redis loss has reopened the sale and a delivery timeout has passed, so the two never
//! overlap — the Kafka broker stopped and started again. At the end, healed: the
//! audit is clean (S1–S3, R1), every 202 "queued" is an order its user can see (but for one whose
//! publish outcome was unknown when Redis lost its outbox entry: counted), no request sent
//! after the pause returned was queued before the resume, and `/metrics` shows the recovery.
//!
//! The test has its own Redis (restarted without persistence), its own Kafka broker (restarted),
//! its own database and topic, so the stores other tests share are left alone. It prints its seed and fault schedule;
//! `SECKILL_PROCESSES_SEED` replays the schedule.

use super::{free_port, service, unique_id, until_kafka_answers, OwnDatabase, OwnKafka};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-token-processes-0123456789";
const SECRET: &str = "processes-token-secret-0123456789abcdef";
const JWT_SECRET: &str = "processes-jwt-secret-0123456789abcdef";
/// The `aud` the engine on real stores requires of a JWT.
const AUDIENCE: &str = "seckill";
/// The producer's delivery timeout (`KafkaConfig::new`): a publish not acknowledged by then has
/// an unknown outcome.
const DELIVERY_TIMEOUT_MS: u128 = 3_000;

/// A user's JWT, as the login service would issue it.
fn jwt(user: u64) -> String {
    crate::support::user_jwt_for(JWT_SECRET, user, Some(AUDIENCE))
}

/// One HTTP/1.1 request with a deadline, as `bearer` (a user's JWT, or the admin token);
/// `None` when the process did not answer in time.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    bearer: &str,
) -> Option<(u16, Value)> {
    http_with(addr, method, path, body, bearer, "").await
}

/// `http` with more header lines (`extra`: each ending in CRLF).
async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    bearer: &str,
    extra: &str,
) -> Option<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n\
             authorization: Bearer {bearer}\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw);
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let payload = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, serde_json::from_str(payload).unwrap_or(Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// One `seckill serve` process of the topology.
struct Proc {
    name: String,
    roles: &'static str,
    addr: SocketAddr,
    /// The admin listener: admin routes, /readyz, /metrics.
    admin: SocketAddr,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Proc {
    fn start(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(["serve", "--roles", self.roles, "--listen", &self.addr.to_string()])
            .args(["--admin-listen", &self.admin.to_string()])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("SECKILL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start seckill serve");
        self.child = Some(child);
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("sh")
            .args(["-c", &format!("kill -{sig} {pid}")])
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{sig} {}", self.name);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = http(self.admin, "GET", "/readyz", None, "").await;
            if let Some((200, _)) = answer {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} never became ready: {answer:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The settings every process of a test's topology shares: its stores and topic, the secrets.
fn topology_env(
    redis_url: String,
    brokers: String,
    database_url: &str,
    topic: &str,
) -> Vec<(String, String)> {
    vec![
        ("REDIS_URL".into(), redis_url),
        ("KAFKA_BROKERS".into(), brokers),
        ("DATABASE_URL".into(), database_url.into()),
        ("SECKILL_TOPIC".into(), topic.into()),
        ("SECKILL_TOKEN_SECRET".into(), SECRET.into()),
        ("SECKILL_ADMIN_TOKEN".into(), ADMIN.into()),
        ("SECKILL_JWT_SECRET".into(), JWT_SECRET.into()),
        ("SECKILL_JWT_AUDIENCE".into(), AUDIENCE.into()),
    ]
}

/// Processes of `roles`, named `<roles>-<i>`, on loopback ports of their own.
fn procs<'a>(n: usize, roles: &'static str, env: &'a [(String, String)]) -> impl Iterator<Item = Proc> + 'a {
    (0..n).map(move |i| Proc {
        name: format!("{roles}-{i}"),
        roles,
        addr: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        admin: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        env: env.to_vec(),
        child: None,
    })
}

/// Start them all: the first migrates the database, the others start once it is ready.
async fn start_all(procs: &mut [Proc]) {
    procs[0].start();
    procs[0].ready().await;
    for p in procs.iter_mut().skip(1) {
        p.start();
    }
    for p in procs.iter() {
        p.ready().await;
    }
}

/// Create a sale (`spec`, open since a second ago) through the admin listener `admin`, and wait
/// until every API process in `api` has learnt of it, as an operator creates a sale ahead of its
/// start (every process loads it at its next registry refresh).
async fn create_sale(admin: SocketAddr, api: &[SocketAddr], spec: Value) {
    let (s, body) = http(admin, "POST", "/api/v1/admin/activities", Some(&spec), ADMIN)
        .await
        .unwrap();
    assert_eq!(s, 201, "{body}");
    for addr in api {
        let path = format!("/api/v1/activities/{}", spec["id"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(http(*addr, "GET", &path, None, "").await, Some((200, _))) {
            assert!(Instant::now() < deadline, "{addr} never learnt of the activity");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Now, in ms since the epoch (a sale's times).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A Redis server of the test's own, without persistence: a restart loses everything.
struct Volatile {
    bin: String,
    port: u16,
    child: Option<Child>,
}

impl Volatile {
    fn up(&mut self) {
        let child = Command::new(&self.bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.up();
    }
}

impl Drop for Volatile {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What the clients saw: (user, reservation) of every 202; purchases answered 202 although sent
/// after a pause returned and before the resume was issued.
#[derive(Default)]
struct Seen {
    /// (user, reservation, sent and answered at ms since the sale began, API process).
    queued: Vec<(u64, String, u128, u128, usize)>,
    /// Per user: "token 503", "no answer", or the purchase's status.
    answers: std::collections::BTreeMap<String, u64>,
    /// When the pause returned, when the resume was issued (ms since the sale began).
    pause: Option<(u128, Option<u128>)>,
    pause_broken: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_production_topology_survives_kills_a_redis_loss_a_pause_and_a_zombie() {
    let (Some(redis_bin), Some(kafka_libs), Some(db)) = (
        service("REDIS_SERVER_BIN"),
        service("KAFKA_LIBS"),
        OwnDatabase::create().await,
    ) else {
        return;
    };
    let _heavy = super::HEAVY.lock().await;
    let seed: u64 = std::env::var("SECKILL_PROCESSES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| unique_id() % 1_000_000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let id = unique_id();

    // Stores of the test's own: a Redis, a database, a topic.
    let mut redis = Volatile {
        bin: redis_bin,
        port: free_port(),
        child: None,
    };
    redis.up();
    let mut kafka = OwnKafka::start(kafka_libs);
    let brokers = kafka.brokers();
    let topic = format!("seckill.test.procs.{id}");
    // A client of the test's own: it tells when the broker answers again.
    let probe =
        seckill_stores::kafka::KafkaBus::connect(seckill_stores::kafka::KafkaConfig::new(&brokers, &topic))
            .expect("a Kafka client");
    until_kafka_answers(&probe).await;
    let env = topology_env(
        format!("redis://127.0.0.1:{}", redis.port),
        brokers,
        &db.url,
        &topic,
    );
    let mut procs: Vec<Proc> = procs(3, "api", &env)
        .chain(procs(2, "worker", &env))
        .chain(procs(2, "jobs", &env))
        .collect();
    start_all(&mut procs).await;
    let api: Vec<SocketAddr> = procs[..3].iter().map(|p| p.addr).collect();
    let admin: Vec<SocketAddr> = procs[..3].iter().map(|p| p.admin).collect();

    // The sale: 2,400 units for 3,000 users, so it sells through every fault; created through api-0.
    let activity = id;
    let now = now_ms();
    let spec = json!({
        "id": activity, "total_stock": 2400, "buckets": 8, "fallback_pct": 10,
        "start_ms": now - 1_000, "end_ms": now + 600_000, "pay_timeout_ms": 600_000,
    });
    create_sale(admin[0], &api, spec).await;

    // The fault schedule, drawn from the seed and printed: when (ms into the sale) and what.
    let kill_worker = rng.gen_range(0..2usize) + 3;
    let kill_api = rng.gen_range(1..3usize);
    let kill_jobs = rng.gen_range(0..2usize) + 5;
    let stop_api = 3 - kill_api; // the other of api-1 and api-2
    let schedule = vec![
        (
            1_000u64,
            format!("pause through api-{}, resume through api-{} 1.5 s later", 0, 1),
        ),
        (
            4_000,
            format!("SIGKILL {} and restart it", procs[kill_worker].name),
        ),
        (5_000, format!("SIGKILL {} and restart it", procs[kill_jobs].name)),
        (
            6_000,
            format!(
                "SIGSTOP {} for 5 s (past the 3 s delivery timeout)",
                procs[stop_api].name
            ),
        ),
        (7_000, "restart Redis without persistence".to_string()),
        (9_000, format!("SIGKILL {} and restart it", procs[kill_api].name)),
        (
            11_000,
            "SIGCONT the stopped API process; then, once the sale reopened after the recovery and 3 s \
             more passed, stop the Kafka broker for 1 s and start it again"
                .to_string(),
        ),
    ];
    println!("processes: seed {seed}");
    for (at, what) in &schedule {
        println!("processes: at {at:>6} ms: {what}");
    }

    let seen = Arc::new(Mutex::new(Seen::default()));
    let started = Instant::now();
    let users: Vec<u64> = (1..=3_000).collect();
    let clients = {
        let (seen, api) = (seen.clone(), api.clone());
        tokio::spawn(async move {
            // 16 users every 75 ms, ~14 s in all, spread over the three API processes.
            for (n, wave) in users.chunks(16).enumerate() {
                let tasks: Vec<_> = wave
                    .iter()
                    .map(|&user| {
                        let (seen, addr) = (seen.clone(), api[(user as usize) % 3]);
                        tokio::spawn(async move {
                            let path = format!("/api/v1/activities/{activity}/token");
                            let me = jwt(user);
                            let t = match http(addr, "POST", &path, None, &me).await {
                                Some((200, t)) => t,
                                other => {
                                    let what = other.map_or("no answer".to_string(), |(s, b)| {
                                        format!(
                                            "token {s} {}",
                                            b["error"]["code"].as_str().unwrap_or_default()
                                        )
                                    });
                                    *seen.lock().unwrap().answers.entry(what).or_default() += 1;
                                    return;
                                }
                            };
                            let buy = json!({ "token": t["token"] });
                            let path = format!("/api/v1/activities/{activity}/purchase");
                            let sent = started.elapsed().as_millis();
                            let answer = http(addr, "POST", &path, Some(&buy), &me).await;
                            let got = started.elapsed().as_millis();
                            let mut seen = seen.lock().unwrap();
                            let Some((status, body)) = answer else {
                                *seen.answers.entry("no answer".into()).or_default() += 1;
                                return;
                            };
                            *seen.answers.entry(status.to_string()).or_default() += 1;
                            if status == 202 {
                                let rid = body["reservation_id"].as_str().unwrap_or_default().to_string();
                                if let Some((paused, resumed)) = seen.pause {
                                    if paused <= sent && resumed.is_none_or(|r| got <= r) {
                                        seen.pause_broken.push(format!("user {user} queued at {got} ms"));
                                    }
                                }
                                seen.queued.push((user, rid, sent, got, (user as usize) % 3));
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
                let next = Duration::from_millis(75 * (n as u64 + 1));
                tokio::time::sleep_until(tokio::time::Instant::from_std(started + next)).await;
            }
        })
    };

    // The faults, on schedule.
    let at = |ms: u64| {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + Duration::from_millis(ms),
        ))
    };
    at(1_000).await;
    let (s, body) = http(
        admin[0],
        "POST",
        &format!("/api/v1/admin/activities/{activity}/pause"),
        None,
        ADMIN,
    )
    .await
    .expect("pause answers");
    assert_eq!(s, 200, "{body}");
    seen.lock().unwrap().pause = Some((started.elapsed().as_millis(), None));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    if let Some(p) = seen.lock().unwrap().pause.as_mut() {
        p.1 = Some(started.elapsed().as_millis());
    }
    let (s, body) = http(
        admin[1],
        "POST",
        &format!("/api/v1/admin/activities/{activity}/resume"),
        None,
        ADMIN,
    )
    .await
    .expect("resume answers");
    assert_eq!(s, 200, "{body}");
    at(4_000).await;
    procs[kill_worker].kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    procs[kill_worker].start();
    at(5_000).await;
    procs[kill_jobs].kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    procs[kill_jobs].start();
    at(6_000).await;
    procs[stop_api].signal("STOP");
    at(7_000).await;
    redis.restart();
    let redis_lost_at = started.elapsed().as_millis();
    at(9_000).await;
    procs[kill_api].kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    procs[kill_api].start();
    at(11_000).await;
    procs[stop_api].signal("CONT");
    // The broker restart never overlaps the recovery: wait until the sale is open again (the
    // recovery finished), then a delivery timeout more.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let path = format!("/api/v1/activities/{activity}");
        if let Some((200, view)) = http(api[0], "GET", &path, None, "").await {
            if view["state"] == "open" {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the sale never reopened after the Redis loss"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stopped_at = started.elapsed().as_millis();
    kafka.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    kafka.up();
    until_kafka_answers(&probe).await;
    println!(
        "processes: the broker was down from {stopped_at} ms to {} ms",
        started.elapsed().as_millis()
    );
    clients.await.unwrap();

    // Healed: wait until the audit sees everything at rest (no lag, nothing left in the outbox: a
    // purchase queued during the broker's absence waits there for the reconciler's republish)
    // and clean.
    let deadline = Instant::now() + Duration::from_secs(120);
    let audit = loop {
        let path = format!("/api/v1/admin/activities/{activity}/audit");
        if let Some((200, audit)) = http(admin[0], "GET", &path, None, ADMIN).await {
            if audit["r1_checked"] == true && audit["open_reservations"] == 0 && audit["verdict"] == "ok" {
                break audit;
            }
            assert!(Instant::now() < deadline, "the sale never settled clean: {audit}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // Every 202 ends in an order its user can see (created, or failed when a process paused
    // across the recovery published it late and the ledger refused its generation).
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    // A 202 after a publish whose outcome was unknown (answered a delivery timeout or more after
    // it was sent) lives only in Redis's outbox until the reconciler republishes it: a Redis
    // restart without persistence before that takes it with everything else only Redis held
    // (DESIGN §9: L1 "with an exact account" where Redis data is lost). Only such answers may end
    // without an order, and they are counted.
    let lost_with_redis =
        |sent: u128, got: u128| got - sent >= DELIVERY_TIMEOUT_MS && got <= redis_lost_at + 500;
    let (mut failed, mut lost) = (0, 0);
    for (user, rid, sent, got, by) in &seen.queued {
        let path = format!("/api/v1/activities/{activity}/orders/{user}");
        let (s, order) = http(api[0], "GET", &path, None, &jwt(*user))
            .await
            .expect("order view answers");
        assert_eq!(s, 200, "user {user}: {order}");
        match order["state"].as_str() {
            Some("created" | "paid") => assert_eq!(order["reservation_id"], rid.as_str(), "user {user}"),
            Some("failed") => failed += 1,
            Some("none") if lost_with_redis(*sent, *got) => lost += 1,
            other => panic!(
                "user {user} was told queued ({rid}) by api-{by}, sent at {sent} ms and answered at {got} ms, \
                 and sees {other:?}: {order}; the audit at rest: {audit}"
            ),
        }
    }
    assert!(
        seen.pause_broken.is_empty(),
        "the pause did not hold: {:?}",
        seen.pause_broken
    );

    // The recovery shows in the metrics of the job runner that ran it (both run since before
    // the Redis restart).
    let mut metrics = String::new();
    for p in &procs[5..] {
        metrics += &metrics_of(p.admin).await;
    }
    assert!(
        metrics.contains("seckill_recovery_runs_total"),
        "no recovery in the jobs' metrics:\n{metrics}"
    );
    // ... and the failures the broker's and Redis's absences caused the jobs (counted, not lost).
    assert!(
        metrics.contains("seckill_job_failures_total"),
        "no job failure in the jobs' metrics:\n{metrics}"
    );
    let sold = audit["units_sold"].as_u64().unwrap_or(0);
    println!(
        "processes: seed {seed}: {} users ({:?}), {} queued, {} orders sold, {failed} refused by generation, \
         {lost} lost with Redis, \
         7 faults, {} s, verdict {}",
        seen.answers.values().sum::<u64>(),
        seen.answers,
        seen.queued.len(),
        sold,
        started.elapsed().as_secs(),
        audit["verdict"]
    );
    drop(procs);
    db.drop_it().await;
}

/// `/metrics` as text (the helper above parses JSON bodies).
async fn metrics_of(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = format!("GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    if stream.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    String::from_utf8_lossy(&raw).into_owned()
}

/// The rate limits hold across processes (DESIGN §12): three API processes on one Redis admit a
/// user's rate and the global rate once, not three times. A user at 1 request/s (a burst of 1)
/// whose requests reach all three processes at once gets at most 1 + 1/s of them through; a
/// crowd of users at a global 10/s gets at most 10 + 10/s. Each process's own layer alone would
/// admit a user's first request in every process (3) and a global burst in every process (30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_api_processes_share_the_user_and_global_rates() {
    let (Some(redis), Some(brokers), Some(db)) = (
        service("REDIS_URL"),
        service("KAFKA_BROKERS"),
        OwnDatabase::create().await,
    ) else {
        return;
    };
    let _heavy = super::HEAVY.lock().await;
    let id = unique_id();
    let mut env = topology_env(redis, brokers, &db.url, &format!("seckill.test.rates.{id}"));
    env.extend(
        [
            ("SECKILL_RATE_PER_USER_PER_SEC", "1"),
            ("SECKILL_RATE_GLOBAL_PER_SEC", "10"),
            ("SECKILL_RATE_PER_IP_PER_SEC", "100000"),
            ("SECKILL_RATE_RAMP_MS", "0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let mut procs: Vec<Proc> = procs(3, "api", &env).collect();
    start_all(&mut procs).await;
    let api: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let now = now_ms();
    let spec = json!({
        "id": id, "total_stock": 1000, "buckets": 4, "fallback_pct": 10,
        "start_ms": now - 1_000, "end_ms": now + 600_000, "pay_timeout_ms": 600_000,
    });
    create_sale(procs[0].admin, &api, spec).await;
    let path = format!("/api/v1/activities/{id}/token");

    // Token requests (the purchase funnel's front: per-user, then global), all at once, spread
    // over the three processes: how many were admitted (200) and refused (429), over how long.
    let burst = |users: Vec<u64>| {
        let (api, path) = (api.clone(), path.clone());
        async move {
            let started = Instant::now();
            let answers = futures::future::join_all(users.iter().enumerate().map(|(i, &user)| {
                let (addr, path, me) = (api[i % 3], path.clone(), jwt(user));
                async move { http(addr, "POST", &path, None, &me).await.map(|(s, _)| s) }
            }))
            .await;
            let elapsed = started.elapsed().as_secs_f64();
            let count = |s: u16| answers.iter().filter(|a| **a == Some(s)).count();
            let (admitted, refused) = (count(200), count(429));
            assert_eq!(
                admitted + refused,
                users.len(),
                "every answer 200 or 429: {answers:?}"
            );
            (admitted, elapsed)
        }
    };

    let user = id % 1_000_000;
    let (admitted, elapsed) = burst(vec![user; 30]).await;
    println!("rates: one user, 30 requests over 3 processes: {admitted} admitted in {elapsed:.2} s");
    assert!(admitted >= 1, "the user's burst is admitted");
    assert!(
        admitted as f64 <= 1.0 + elapsed + 1.0,
        "a user at 1/s got {admitted} requests through 3 processes in {elapsed:.2} s"
    );

    // The global key back at its full burst (10/s: 1.5 s is plenty), then 60 users at once.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let crowd: Vec<u64> = (1..=60).map(|u| user + 1_000 + u).collect();
    let (admitted, elapsed) = burst(crowd).await;
    println!("rates: 60 users over 3 processes: {admitted} admitted in {elapsed:.2} s");
    assert!(admitted >= 10, "the global burst is admitted: {admitted}");
    assert!(
        admitted as f64 <= 10.0 + 10.0 * elapsed + 1.0,
        "a global 10/s let {admitted} requests through 3 processes in {elapsed:.2} s"
    );
    drop(procs);
    db.drop_it().await;
}

/// One purchase is one trace in a real collector (Jaeger's all-in-one, which ci/services.sh
/// starts): the API process's request with its reserve and publish, then — through the Kafka
/// record's `traceparent` header — the worker's span of that record with the ledger's commit and
/// the settle in Redis as its children, all under the trace id of the `traceparent` the buyer's
/// client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_purchase_is_one_trace_from_the_click_through_kafka_to_the_settle() {
    let (Some(otlp), Some(query), Some(redis_url), Some(brokers), Some(database_url)) = (
        service("JAEGER_OTLP"),
        service("JAEGER_QUERY"),
        service("REDIS_URL"),
        service("KAFKA_BROKERS"),
        service("DATABASE_URL"),
    ) else {
        return;
    };
    let _heavy = super::HEAVY.lock().await;
    let id = unique_id();
    let mut env = topology_env(
        redis_url,
        brokers,
        &database_url,
        &format!("seckill.test.traces.{id}"),
    );
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp));
    env.push(("OTEL_SERVICE_NAME".into(), format!("seckill-test-{id}")));
    // Each process exports its spans a second after they end (the batch's default is 5 s).
    env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "1000".into()));
    let mut all: Vec<Proc> = procs(1, "api", &env).chain(procs(1, "worker", &env)).collect();
    start_all(&mut all).await;
    let (api, admin) = (all[0].addr, all[0].admin);
    let spec = json!({
        "id": id, "total_stock": 10, "buckets": 2, "fallback_pct": 0,
        "start_ms": now_ms() - 1_000, "end_ms": now_ms() + 3_600_000, "pay_timeout_ms": 900_000,
    });
    create_sale(admin, &[api], spec).await;

    // The buyer's client starts the trace (sampled): the engine continues it.
    let trace_id = format!("{:032x}", (0x5ec_u128 << 112) | u128::from(id));
    let traceparent = format!("traceparent: 00-{trace_id}-00f067aa0ba902b7-01\r\n");
    let user = 7;
    let (s, t) = http(
        api,
        "POST",
        &format!("/api/v1/activities/{id}/token"),
        None,
        &jwt(user),
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{t}");
    let buy = json!({ "token": t["token"] });
    let path = format!("/api/v1/activities/{id}/purchase");
    let (s, q) = http_with(api, "POST", &path, Some(&buy), &jwt(user), &traceparent)
        .await
        .unwrap();
    assert_eq!(s, 202, "{q}");

    // The collector's query API has the whole trace within seconds of the settle.
    let url = format!("{}/api/traces/{trace_id}", query.trim_end_matches('/'));
    let want = [
        "request",
        "reserve",
        "publish",
        "order",
        "ledger.commit",
        "redis.followup",
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let trace = loop {
        let got = tokio::task::spawn_blocking({
            let url = url.clone();
            move || Command::new("curl").args(["-s", &url]).output().unwrap().stdout
        })
        .await
        .unwrap();
        let v: Value = serde_json::from_slice(&got).unwrap_or(Value::Null);
        let names: Vec<&str> = (v["data"][0]["spans"].as_array().into_iter().flatten())
            .filter_map(|s| s["operationName"].as_str())
            .collect();
        if want.iter().all(|w| names.contains(w)) {
            break v["data"][0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the trace never had {want:?}: {names:?} ({url})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let spans = trace["spans"].as_array().unwrap();
    let span = |name: &str| spans.iter().find(|s| s["operationName"] == name).unwrap();
    let parent = |s: &Value| s["references"][0]["spanID"].as_str().map(str::to_string);
    let roles = |s: &Value| {
        let process = &trace["processes"][s["processID"].as_str().unwrap()];
        (process["tags"].as_array().unwrap().iter())
            .find(|t| t["key"] == "seckill.roles")
            .map(|t| t["value"].as_str().unwrap().to_string())
    };
    assert_eq!(
        parent(span("request")).as_deref(),
        Some("00f067aa0ba902b7"),
        "the client's span"
    );
    for (child, of) in [
        ("reserve", "request"),
        ("publish", "request"),
        ("order", "publish"),
    ] {
        assert_eq!(
            parent(span(child)),
            span(of)["spanID"].as_str().map(str::to_string),
            "{child} under {of}"
        );
    }
    for child in ["ledger.commit", "redis.followup"] {
        assert_eq!(
            parent(span(child)),
            span("order")["spanID"].as_str().map(str::to_string),
            "{child}"
        );
    }
    assert_eq!(roles(span("publish")).as_deref(), Some("api"));
    assert_eq!(roles(span("order")).as_deref(), Some("worker"));
    let outcome = (span("order")["tags"].as_array().unwrap().iter())
        .find(|t| t["key"] == "outcome")
        .map(|t| t["value"].clone());
    assert_eq!(outcome, Some(json!("Created")), "{}", span("order"));
}
