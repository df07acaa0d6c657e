//! `seckill serve` processes of this binary, started and loaded by the measuring commands
//! (`load --stages`, `bench`'s HTTP rows): on free loopback ports, with their own secrets, ready
//! when their admin listener says so; killed when dropped.

use crate::cli::client::Conn;
use anyhow::Context;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `aud` of the JWTs the buyers send (the engine on real stores requires one).
pub(super) const AUDIENCE: &str = "seckill";

/// The settings every process of the run shares (besides the stores' from the environment).
pub(super) struct Settings {
    exe: std::path::PathBuf,
    env: Vec<(String, String)>,
    pub(super) admin_token: String,
    pub(super) jwt_secret: String,
}

/// One `seckill serve` process of the run; killed when dropped.
pub(super) struct Proc {
    child: Child,
    pub(super) public: SocketAddr,
    pub(super) admin: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("no free port")
}

impl Settings {
    pub(super) fn spawn(&self, role: &str, extra: &[(&str, String)]) -> anyhow::Result<Proc> {
        let (public, admin) = (free_addr()?, free_addr()?);
        let child = Command::new(&self.exe)
            .args(["serve", "--roles", role])
            .args([
                "--listen",
                &public.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ])
            // The stores are the run's (none: the embedded stores), whatever this process has.
            .env_remove("REDIS_URL")
            .env_remove("SECKILL_REDIS_CLUSTER")
            .env_remove("KAFKA_BROKERS")
            .env_remove("DATABASE_URL")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .env("SECKILL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start seckill serve --roles {role}"))?;
        Ok(Proc { child, public, admin })
    }

    pub(super) async fn ready(&self, p: &Proc) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = call(p.admin, "GET", "/readyz", "", "").await {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(format!("the process on {} did not become ready in 60 s", p.admin));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Create a sale through the first API process's admin listener; every API process knows it
    /// on return.
    pub(super) async fn sale(&self, api: &[Proc], id: u64, stock: u64, buckets: u32) -> anyhow::Result<()> {
        let now = crate::cli::tools::wall_now_ms();
        let spec = json!({
            "id": id, "total_stock": stock, "buckets": buckets, "fallback_pct": 10,
            "start_ms": now - 1_000, "end_ms": now + 3_600_000, "pay_timeout_ms": 3_600_000,
        });
        let (status, body) = call(
            api[0].admin,
            "POST",
            "/api/v1/admin/activities",
            &self.admin_token,
            &spec.to_string(),
        )
        .await?;
        if status != 201 {
            anyhow::bail!(format!("create sale {id}: {status} {body}"));
        }
        for p in api {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while call(p.public, "GET", &format!("/api/v1/activities/{id}"), "", "")
                .await?
                .0
                != 200
            {
                if tokio::time::Instant::now() > deadline {
                    anyhow::bail!(format!(
                        "the API process on {} never learnt of sale {id}",
                        p.public
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

/// The rate limits out of the way: the generator is one address, and the per-IP limit would
/// measure itself, not the engine.
pub(super) fn unlimited() -> [(&'static str, String); 2] {
    [
        ("SECKILL_RATE_PER_IP_PER_SEC", "10000000".to_string()),
        ("SECKILL_RATE_GLOBAL_PER_SEC", "10000000".to_string()),
    ]
}

/// The real stores' settings of this process's environment, as the processes it starts get them.
pub(super) fn stores_from_env() -> Vec<(String, String)> {
    ["REDIS_URL", "KAFKA_BROKERS", "DATABASE_URL"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

impl Settings {
    /// The settings of a run: `stores` (REDIS_URL, KAFKA_BROKERS, DATABASE_URL; none for the
    /// embedded stores), secrets of the run's own, and a topic of its own.
    pub(super) fn new(stores: Vec<(String, String)>, run_id: u64) -> anyhow::Result<Settings> {
        let secret = |what: &str| format!("measure-{what}-{run_id:x}-0123456789abcdef");
        Ok(Settings {
            exe: std::env::current_exe().context("this binary")?,
            admin_token: secret("admin"),
            jwt_secret: secret("jwt"),
            env: stores
                .into_iter()
                .chain([
                    ("SECKILL_TOPIC".into(), format!("seckill.measure.{run_id}")),
                    ("SECKILL_ADMIN_TOKEN".into(), secret("admin")),
                    ("SECKILL_TOKEN_SECRET".into(), secret("token")),
                    ("SECKILL_JWT_SECRET".into(), secret("jwt")),
                    ("SECKILL_JWT_AUDIENCE".into(), AUDIENCE.into()),
                    ("SECKILL_PAYMENT_SECRET".into(), secret("payment")),
                ])
                .collect(),
        })
    }
}

impl Settings {
    /// Wait until the sale is at rest (every queued order applied, nothing left in the outbox),
    /// so that the worker's backlog does not run into the next measurement; the audit's answer.
    pub(super) async fn settle(&self, api: &[Proc], activity: u64) -> anyhow::Result<Value> {
        let path = format!("/api/v1/admin/activities/{activity}/audit");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            let (status, body) = call(api[0].admin, "GET", &path, &self.admin_token, "").await?;
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            if status == 200 && v["consumer_lag"] == 0 && v["open_reservations"] == 0 {
                return Ok(v);
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(format!("sale {activity} never came to rest: {status} {body}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// One HTTP exchange on a fresh connection: the status and the body as text.
pub(super) async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut c = Conn::new(addr);
    let status = c
        .request(method, path, bearer, body)
        .await
        .with_context(|| format!("{method} {path} on {addr}"))?;
    Ok((status, String::from_utf8_lossy(&c.body).into_owned()))
}

/// CPU time the processes have used so far (all their threads), in nanoseconds.
pub(super) fn cpu_ns(procs: &[Proc]) -> anyhow::Result<u64> {
    let mut total = 0;
    for p in procs {
        let dir = format!("/proc/{}/task", p.child.id());
        for task in std::fs::read_dir(&dir).with_context(|| dir.clone())? {
            let path = task?.path().join("schedstat");
            // A thread that ended between the listing and the read is simply not counted.
            if let Ok(text) = std::fs::read_to_string(&path) {
                total += text
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .with_context(|| format!("{}: unreadable", path.display()))?;
            }
        }
    }
    Ok(total)
}
