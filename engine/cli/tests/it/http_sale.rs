//! A flash sale over real sockets: the API served on loopback (with its consumer and jobs), 5,000
//! users each asking for a token and buying with it (or hearing "sold out" already at the token),
//! 500 units — then the admin audit route must say every unit sold and every invariant holds. On the embedded stores always; on Redis, Kafka
//! and MariaDB when their settings are in the environment.

use crate::real::{free_port, kafka, redis_single, unique_id, OwnDatabase};
use rand::SeedableRng;
use seckill_api::config::ServeConfig;
use seckill_api::nonce::{NonceStore, RedisNonces};
use seckill_api::serve::{self, Secrets, Stores};
use seckill_core::clock::Clock;
use seckill_core::ports::{Ledger, OrderBus, StockCache};
use seckill_stores::redis::RedisRateLimiter;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "admin-token-0123456789";
const JWT_SECRET: &str = "jwt-secret-of-the-login-service-0123";

/// A user's JWT, as the login service would issue it.
fn jwt(user: u64) -> String {
    crate::support::user_jwt(JWT_SECRET, user)
}

/// One HTTP/1.1 request on its own connection, with `bearer` (empty: none); (status, JSON body).
pub(crate) async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    bearer: &str,
) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = if bearer.is_empty() {
        String::new()
    } else {
        format!("authorization: Bearer {bearer}\r\n")
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let payload = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(payload).unwrap_or(Value::Null))
}

async fn sale<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    stores: Stores<C, B, L, N>,
    activity: u64,
) {
    let cfg = ServeConfig {
        admin_token: Some(ADMIN.into()),
        token_secret: Some("k".repeat(32).into()),
        jwt: Some(seckill_api::config::JwtKeys::Secret(JWT_SECRET.into())),
        // Every client is 127.0.0.1 here: the per-IP limit would be the whole test's limit.
        rate: seckill_api::config::RateLimits {
            per_ip_per_sec: 1_000_000,
            ..ServeConfig::default().rate
        },
        ..ServeConfig::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(activity);
    let secrets = Secrets::resolve(&cfg, &mut rng);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let clock = Clock::new(now_ms, tokio::time::Instant::now());
    let api = serve::api(&cfg, stores, &secrets, clock, &mut rng).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = serve::start(api, listener, admin, &mut rng).await.unwrap();
    let (addr, admin) = (running.addr, running.admin_addr);

    let spec = json!({
        "id": activity, "total_stock": 500, "buckets": 8, "fallback_pct": 10,
        "start_ms": now_ms - 1_000, "end_ms": now_ms + 3_600_000, "pay_timeout_ms": 900_000,
    });
    let (s, body) = http(admin, "POST", "/api/v1/admin/activities", Some(&spec), ADMIN).await;
    assert_eq!(s, 201, "{body}");

    let users: Vec<u64> = (1..=5_000).collect();
    let mut answers: BTreeMap<u16, u64> = BTreeMap::new();
    for wave in users.chunks(64) {
        let tasks: Vec<_> = wave
            .iter()
            .map(|&user| {
                tokio::spawn(async move {
                    let path = format!("/api/v1/activities/{activity}/token");
                    let me = jwt(user);
                    let (s, t) = http(addr, "POST", &path, None, &me).await;
                    if s != 200 {
                        // Known sold out: refused before a token is even issued.
                        assert_eq!(
                            (s, t["error"]["code"].as_str()),
                            (410, Some("sold_out")),
                            "token: {t}"
                        );
                        return s;
                    }
                    let buy = json!({ "token": t["token"] });
                    let path = format!("/api/v1/activities/{activity}/purchase");
                    http(addr, "POST", &path, Some(&buy), &me).await.0
                })
            })
            .collect();
        for t in tasks {
            *answers.entry(t.await.unwrap()).or_default() += 1;
        }
    }
    assert_eq!(
        answers.get(&202),
        Some(&500),
        "exactly the stock is queued: {answers:?}"
    );
    assert_eq!(answers.values().sum::<u64>(), 5_000);
    assert!(
        answers.keys().all(|s| [202, 410].contains(s)),
        "only queued or sold out: {answers:?}"
    );

    // The consumer applies in the background; wait until the audit sees everything at rest.
    let deadline = Instant::now() + Duration::from_secs(60);
    let audit = loop {
        let (s, audit) = http(
            admin,
            "GET",
            &format!("/api/v1/admin/activities/{activity}/audit"),
            None,
            ADMIN,
        )
        .await;
        assert_eq!(s, 200, "{audit}");
        if audit["units_sold"] == 500 && audit["r1_checked"] == true {
            break audit;
        }
        assert!(Instant::now() < deadline, "the sale never settled: {audit}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(audit["verdict"], "ok", "{audit}");
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_over_http_on_the_embedded_stores() {
    let stores = Stores::embedded();
    sale(stores, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_over_http_on_the_real_stores() {
    // A database of its own: the jobs this server runs work on every registered activity.
    let (Some(cache), Some(bus), Some(db)) = (
        redis_single().await,
        kafka("http").await,
        OwnDatabase::create().await,
    ) else {
        return;
    };
    let ledger = db.ledger().await;
    let nonces = RedisNonces::new(cache.conn().clone());
    let limiter = Some(RedisRateLimiter::new(cache.conn().clone()));
    sale(
        Stores {
            cache,
            bus,
            ledger,
            nonces,
            limiter,
        },
        unique_id(),
    )
    .await;
    db.drop_it().await;
}

/// `seckill serve` as a process: it answers, and SIGTERM stops it cleanly (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stops_gracefully_on_sigterm() {
    let (port, admin_port) = (free_port(), free_port());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin_port}"),
        ])
        .env_remove("REDIS_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("DATABASE_URL")
        .env("SECKILL_ADMIN_TOKEN", ADMIN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "serve did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Listening is not ready: /readyz answers 503 until the roles are up (a CI run on a busy
    // machine once asked in between), as an orchestrator's probe would see.
    while http(addr, "GET", "/readyz", None, "").await.0 != 200 {
        assert!(Instant::now() < deadline, "serve did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The shell's builtin kill: no procps needed on the machine.
    let kill = std::process::Command::new("sh")
        .args(["-c", &format!("kill -TERM {}", child.id())])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("not durable") && logs.contains("\"stopped\""),
        "{logs}"
    );
}

#[test]
fn serve_refuses_a_bad_setting_by_name() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["serve"])
        .env("SECKILL_RATE_PER_USER_PER_SEC", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SECKILL_RATE_PER_USER_PER_SEC: must be in 1..=10000000, got 0"),
        "{err}"
    );
}

/// `cfg` served on the embedded stores on two loopback ports of their own.
async fn serve_embedded(cfg: &ServeConfig, seed: u64) -> serve::Running {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let secrets = Secrets::resolve(cfg, &mut rng);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let api = serve::api(
        cfg,
        Stores::embedded(),
        &secrets,
        Clock::new(now_ms, tokio::time::Instant::now()),
        &mut rng,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve::start(api, listener, admin, &mut rng).await.unwrap()
}

/// Slow clients (DESIGN §12): a connection that sends half a header is closed after the
/// header-read timeout, an idle keep-alive connection too, while a normal client keeps being
/// served; connections beyond the cap are closed at once without stalling the rest; and a stop
/// with a request stuck mid-body finishes by the shutdown deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_do_not_stall_the_rest() {
    use seckill_api::listener::ConnLimits;
    let cfg = ServeConfig {
        admin_token: Some(ADMIN.into()),
        token_secret: Some("k".repeat(32).into()),
        jwt: Some(seckill_api::config::JwtKeys::Secret(JWT_SECRET.into())),
        request_timeout: Duration::from_secs(30),
        conn_limits: ConnLimits {
            header_read_timeout: Duration::from_millis(2_000),
            max_connections: 4,
            shutdown_deadline: Duration::from_millis(1_000),
            ..ConnLimits::default()
        },
        ..ServeConfig::default()
    };
    let running = serve_embedded(&cfg, 5).await;
    let addr = running.addr;
    let half = |addr: SocketAddr| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        s
    };
    // Closed: the peer reads end-of-file (nothing, or at most an error answer, then EOF).
    let closed_within = |mut s: tokio::net::TcpStream, d: Duration| async move {
        let mut buf = Vec::new();
        matches!(tokio::time::timeout(d, s.read_to_end(&mut buf)).await, Ok(Ok(_)))
    };

    // Half a header: cut off after the timeout; a normal client is served meanwhile.
    let slow = half(addr).await;
    assert_eq!(http(addr, "GET", "/healthz", None, "").await.0, 200);
    assert!(
        closed_within(slow, Duration::from_secs(5)).await,
        "half a header held the connection"
    );

    // An idle keep-alive connection after its answer: cut off too.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(
        closed_within(idle, Duration::from_secs(5)).await,
        "an idle connection was kept"
    );

    // A head past the size bound, or with too many header lines: 431 and closed, whatever the
    // route (the limits hold before any handler runs).
    let answer = |request: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw)).await;
        String::from_utf8_lossy(&raw)
            .split("\r\n")
            .next()
            .unwrap_or("")
            .to_string()
    };
    let big = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\ncookie: {}\r\n\r\n",
        "c".repeat(20 * 1024)
    );
    assert_eq!(answer(big).await, "HTTP/1.1 431 Request Header Fields Too Large");
    let many: String = (0..100).map(|i| format!("x-h{i}: {i}\r\n")).collect();
    let many = format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{many}\r\n");
    assert_eq!(answer(many).await, "HTTP/1.1 431 Request Header Fields Too Large");
    let fine = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncookie: {}\r\n\r\n",
        "c".repeat(8 * 1024)
    );
    assert_eq!(answer(fine).await, "HTTP/1.1 200 OK");

    // Four slow connections fill the cap: the fifth is closed at once (well before the header
    // timeout would have closed it), and once the slow ones are gone, clients are served again.
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(half(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fifth = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(fifth, Duration::from_secs(5)).await);
    let mut probe = [0u8; 1];
    assert!(
        matches!(slow[0].try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the fifth was closed while the four still held their slots (not by the header timeout)"
    );
    for s in slow {
        assert!(closed_within(s, Duration::from_secs(5)).await);
    }
    assert_eq!(http(addr, "GET", "/healthz", None, "").await.0, 200);

    // A request stuck mid-body (its header arrived: the header timeout no longer applies, and
    // the request timeout is 30 s): the stop ends by the shutdown deadline all the same.
    let mut stuck = tokio::net::TcpStream::connect(addr).await.unwrap();
    stuck
        .write_all(b"POST /api/v1/payments/callback HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"pay")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopping = Instant::now();
    running.shutdown().await.unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the stop waited {:?} for a stuck client",
        stopping.elapsed()
    );
    drop(stuck);
}

/// The login service rotates its keys (DESIGN §12): the engine reads its JWKS file again while
/// it serves, so a JWT signed with the new key is believed without a restart; a file that does
/// not load (half written, a bad key) leaves the keys in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_jwks_file_is_picked_up_without_a_restart() {
    use seckill_api::config::JwtKeys;
    let key_set = |secret: &[u8]| {
        let k = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, secret);
        format!(r#"{{"keys":[{{"kty":"oct","alg":"HS256","kid":"k","k":"{k}"}}]}}"#)
    };
    let (old, new) = (
        b"old-login-key-0123456789abcdefghij",
        b"new-login-key-9876543210zyxwvutsrq",
    );
    let path = std::env::temp_dir().join(format!("seckill-jwks-{}.json", std::process::id()));
    std::fs::write(&path, key_set(old)).unwrap();
    let cfg = ServeConfig {
        admin_token: Some(ADMIN.into()),
        token_secret: Some("k".repeat(32).into()),
        jwt: Some(JwtKeys::Jwks {
            path: path.display().to_string(),
            text: key_set(old),
        }),
        jwt_jwks_reload: Duration::from_millis(100),
        ..ServeConfig::default()
    };
    let running = serve_embedded(&cfg, 6).await;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let addr = running.addr;
    let by = |secret: &[u8]| {
        seckill_api::identity::mint(
            secret,
            seckill_core::domain::UserId(7),
            now_ms / 1_000 + 600,
            None,
            None,
        )
    };
    // No activity 1: a believed identity is answered 404, a refused one 401.
    let status = |jwt: String| async move {
        http(addr, "GET", "/api/v1/activities/1/orders/7", None, &jwt)
            .await
            .0
    };
    let settle = || tokio::time::sleep(Duration::from_millis(600));
    assert_eq!(status(by(old)).await, 404);
    assert_eq!(status(by(new)).await, 401);
    std::fs::write(&path, key_set(new)).unwrap();
    settle().await;
    assert_eq!(status(by(new)).await, 404, "the new key was not picked up");
    assert_eq!(status(by(old)).await, 401, "the old key is still believed");
    std::fs::write(&path, "{\"keys\": [").unwrap();
    settle().await;
    assert_eq!(
        status(by(new)).await,
        404,
        "a file that does not load changed the keys"
    );
    running.shutdown().await.unwrap();
    let _ = std::fs::remove_file(&path);
}
