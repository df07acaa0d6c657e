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
    /// Where valgrind's callgrind writes this process's counts, if it runs under it.
    counts: Option<std::path::PathBuf>,
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
        self.spawn_under(None, role, extra)
    }

    /// A process whose instructions can be counted: it runs under valgrind's callgrind, its
    /// counting off until [`Proc::count_from`] (so that it starts at a usable speed); `dir` holds
    /// its dumps.
    pub(super) fn spawn_counted(
        &self,
        dir: &std::path::Path,
        role: &str,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Proc> {
        self.spawn_under(Some(dir), role, extra)
    }

    fn spawn_under(
        &self,
        counts: Option<&std::path::Path>,
        role: &str,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Proc> {
        let (public, admin) = (free_addr()?, free_addr()?);
        let mut command = match counts {
            None => Command::new(&self.exe),
            Some(dir) => {
                std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
                let mut c = Command::new("valgrind");
                c.args(["--tool=callgrind", "--instr-atstart=no", "--quiet"])
                    .arg(format!("--callgrind-out-file={}/callgrind.out", dir.display()))
                    .arg(&self.exe);
                c
            }
        };
        let child = command
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
        Ok(Proc {
            child,
            public,
            admin,
            counts: counts.map(|d| d.to_path_buf()),
        })
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

/// Counting a process's instructions with callgrind's own control (`callgrind_control`, which
/// asks the process through valgrind's gdbserver): a figure that does not move with the noise of
/// a shared box, as a wall-clock rate does.
impl Proc {
    /// Count from now on, from zero.
    pub(super) fn count_from(&self) -> anyhow::Result<()> {
        self.callgrind_control(&["--instr=on"])?;
        self.callgrind_control(&["--zero"])
    }

    /// The instructions run since [`Proc::count_from`]; counting stops. The profile is kept
    /// as `keep` (for `callgrind_annotate`), if given.
    pub(super) fn counted(&self, keep: Option<&std::path::Path>) -> anyhow::Result<u64> {
        let dir = self
            .counts
            .as_ref()
            .context("the process does not run under callgrind")?;
        self.callgrind_control(&["--dump"])?;
        self.callgrind_control(&["--instr=off"])?;
        // Each dump is a file of its own (callgrind.out.N); the one there is this one's, the
        // earlier ones having been read and moved away or removed.
        let dumps: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| dir.display().to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("callgrind.out."))
            })
            .collect();
        let dump = match dumps.as_slice() {
            [one] => one.clone(),
            other => anyhow::bail!(format!(
                "{}: expected one dump, found {}",
                dir.display(),
                other.len()
            )),
        };
        let text = std::fs::read_to_string(&dump).with_context(|| dump.display().to_string())?;
        match keep {
            Some(to) => std::fs::rename(&dump, to),
            None => std::fs::remove_file(&dump),
        }
        .with_context(|| dump.display().to_string())?;
        // The dump's header line `summary: <Ir>` (the only event counted) is its total.
        text.lines()
            .find_map(|l| l.strip_prefix("summary:"))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("{}: no summary line", dump.display()))
    }

    /// Instructions per second the process runs while nothing is asked of it: the lower of two
    /// 3 s windows after 2 s left alone (a process just started, or just loaded, is still
    /// finishing what it began — connecting, its first reads — which is not its upkeep).
    pub(super) async fn idle_rate(&self) -> anyhow::Result<f64> {
        const SETTLE: Duration = Duration::from_secs(2);
        const WINDOW: Duration = Duration::from_secs(3);
        tokio::time::sleep(SETTLE).await;
        let mut lowest = f64::INFINITY;
        for _ in 0..2 {
            self.count_from()?;
            let started = std::time::Instant::now();
            tokio::time::sleep(WINDOW).await;
            let n = self.counted(None)?;
            lowest = lowest.min(n as f64 / started.elapsed().as_secs_f64());
        }
        Ok(lowest)
    }

    fn callgrind_control(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("callgrind_control")
            .args(args)
            .arg(self.child.id().to_string())
            .output()
            .context("callgrind_control (valgrind's; apt-get install valgrind)")?;
        // It exits 0 when it found no such process, too; each process it reached says OK.
        if !out.status.success() || !String::from_utf8_lossy(&out.stdout).contains("OK.") {
            anyhow::bail!(format!(
                "callgrind_control {} {}: {}{}",
                args.join(" "),
                self.child.id(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }
}
