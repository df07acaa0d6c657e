//! `seckill load --stages`: the seeds' three load-test stages, on the real stores, against API
//! processes this command starts itself (this binary, `serve --roles api`), beside one worker
//! and one jobs process that run through all stages:
//!
//! 1. **One node at its limit**: one API process, answered as fast as it can, on a sale with
//!    twice as many units as users, so that no bucket runs out (each click takes the whole path:
//!    JWT, token, reserve, publish).
//! 2. **Scaling across nodes**: the same clicks spread over 1, 2 and 3 API processes. Wall
//!    throughput cannot grow on a machine with fewer cores than processes (here the generator,
//!    the stores and the servers share two), so the figure that shows whether the work scales is
//!    purchases per CPU-second of the API processes: flat when scaling is linear (no process does
//!    more work per purchase because others exist), falling when they contend.
//! 3. **The full funnel at peak**: ten users per unit, repeated clicks, demand crowded on a few
//!    buckets, against three API processes whose global limits the opening burst exceeds: what
//!    each layer refused (the rate limits, the token's sold-out check, the reserve), then, once
//!    the worker applied everything, the orders the ledger holds and the audit.
//!
//! CPU time comes from `/proc/<pid>/task/*/schedstat` (nanoseconds on CPU, per thread).

use super::bench::Bar;
use super::load::{self, Conn, LoadConfig, LoadReport, Target};
use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runs of a `--stages` run (one, three, one), for a progress bar.
pub const RUNS: u64 = 5;

/// The `aud` of the JWTs the stages' buyers send (the engine on real stores requires one).
const AUDIENCE: &str = "seckill";

#[derive(Debug, Clone)]
pub struct StagesOptions {
    /// Users (clicks) of stages 1 and 2; stage 3 has ten times as many users as units.
    pub users: u64,
    pub connections: usize,
    /// Upper bound of each run.
    pub duration: Duration,
    pub seed: u64,
}

/// One run of stage 1 or 2.
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    pub stage: u8,
    pub name: String,
    pub api_processes: usize,
    pub clicks: u64,
    /// Purchases answered (any status) per wall second.
    pub purchases_per_sec: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    /// CPU time of the API processes during the run.
    pub api_cpu_s: f64,
    /// Purchases answered per CPU-second of the API processes.
    pub purchases_per_api_cpu_s: f64,
    pub queued: u64,
    pub errors: u64,
}

/// Stage 3: the funnel at peak, layer by layer.
#[derive(Debug, Clone, Serialize)]
pub struct Funnel {
    pub api_processes: usize,
    pub users: u64,
    pub stock: u64,
    pub clicks: u64,
    /// Each API process's global limit (requests per second), a tenth of stage 1's throughput.
    pub global_limit_per_sec: u64,
    /// Token requests refused, by status (429 a rate limit, 410 sold out or ended, …).
    pub tokens_refused: BTreeMap<u16, u64>,
    /// Purchases answered, by status (202 queued, 409 duplicate, 410 sold out, 429, 503).
    pub purchases: BTreeMap<u16, u64>,
    pub errors: u64,
    pub purchases_per_sec: f64,
    pub latency_ms_p99: f64,
    /// What the ledger holds once the worker applied everything, and the audit's verdict.
    pub units_sold: u64,
    pub audit: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StagesReport {
    pub rows: Vec<StageRow>,
    pub funnel: Funnel,
}

/// The settings every process of the run shares (besides the stores' from the environment).
struct Settings {
    exe: std::path::PathBuf,
    env: Vec<(String, String)>,
    admin_token: String,
    jwt_secret: String,
}

/// One `seckill serve` process of the run; killed when dropped.
struct Proc {
    child: Child,
    public: SocketAddr,
    admin: SocketAddr,
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
    fn spawn(&self, role: &str, extra: &[(&str, String)]) -> anyhow::Result<Proc> {
        let (public, admin) = (free_addr()?, free_addr()?);
        let child = Command::new(&self.exe)
            .args(["serve", "--roles", role])
            .args([
                "--listen",
                &public.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .env("SECKILL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start seckill serve --roles {role}"))?;
        Ok(Proc { child, public, admin })
    }

    async fn ready(&self, p: &Proc) -> anyhow::Result<()> {
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
    async fn sale(&self, api: &[Proc], id: u64, stock: u64, buckets: u32) -> anyhow::Result<()> {
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

    /// Load `clicks` of one sale over the API processes, the connections split evenly.
    async fn load(
        &self,
        api: &[Proc],
        activity: u64,
        users: u64,
        clicks_per_user: u32,
        skew: f64,
        opts: &StagesOptions,
    ) -> anyhow::Result<(LoadReport, f64)> {
        let cfg = LoadConfig {
            addrs: api.iter().map(|p| p.public).collect(),
            activity,
            users,
            connections: opts.connections.max(api.len()),
            rate: 0,
            duration: opts.duration,
            skew,
            clicks_per_user,
            seed: opts.seed,
            target: Target::Purchase,
            jwt_secret: self.jwt_secret.clone(),
            jwt_issuer: None,
            jwt_audience: Some(AUDIENCE.to_string()),
        };
        let before = cpu_ns(api)?;
        let report = load::run(&cfg, || {}).await?;
        let cpu_s = (cpu_ns(api)? - before) as f64 / 1e9;
        Ok((report, cpu_s))
    }
}

impl Settings {
    /// Wait until the sale is at rest (every queued order applied, nothing left in the outbox),
    /// so that the worker's backlog does not run into the next measurement; the audit's answer.
    async fn settle(&self, api: &[Proc], activity: u64) -> anyhow::Result<Value> {
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
async fn call(
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
fn cpu_ns(procs: &[Proc]) -> anyhow::Result<u64> {
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

fn row(stage: u8, name: String, api: usize, r: &LoadReport, cpu_s: f64) -> StageRow {
    let purchases: u64 = r.by_status.values().sum();
    StageRow {
        stage,
        name,
        api_processes: api,
        clicks: purchases + r.tokens_refused.values().sum::<u64>(),
        purchases_per_sec: purchases as f64 / r.elapsed_s.max(1e-9),
        latency_ms_p50: r.latency_us_p50 as f64 / 1e3,
        latency_ms_p99: r.latency_us_p99 as f64 / 1e3,
        api_cpu_s: cpu_s,
        purchases_per_api_cpu_s: purchases as f64 / cpu_s.max(1e-9),
        queued: r.by_status.get(&202).copied().unwrap_or(0),
        errors: r.errors,
    }
}

/// Run the three stages. `env` holds the stores' settings (REDIS_URL, KAFKA_BROKERS,
/// DATABASE_URL); `progress` is told each finished run.
pub async fn run(
    opts: &StagesOptions,
    stores: Vec<(String, String)>,
    progress: impl Fn(&str),
) -> anyhow::Result<StagesReport> {
    let run_id = crate::cli::tools::wall_now_ms();
    let secret = |what: &str| format!("stages-{what}-{run_id:x}-0123456789abcdef");
    let settings = Settings {
        exe: std::env::current_exe().context("this binary")?,
        admin_token: secret("admin"),
        jwt_secret: secret("jwt"),
        env: stores
            .into_iter()
            .chain([
                ("SECKILL_TOPIC".into(), format!("seckill.stages.{run_id}")),
                ("SECKILL_ADMIN_TOKEN".into(), secret("admin")),
                ("SECKILL_TOKEN_SECRET".into(), secret("token")),
                ("SECKILL_JWT_SECRET".into(), secret("jwt")),
                ("SECKILL_JWT_AUDIENCE".into(), AUDIENCE.into()),
                ("SECKILL_PAYMENT_SECRET".into(), secret("payment")),
            ])
            .collect(),
    };
    // The generator is one address: the per-IP limit would measure itself, not the engine.
    let unlimited = [
        ("SECKILL_RATE_PER_IP_PER_SEC", "10000000".to_string()),
        ("SECKILL_RATE_GLOBAL_PER_SEC", "10000000".to_string()),
    ];
    let worker = settings.spawn("worker", &[])?;
    let jobs = settings.spawn("jobs", &[])?;
    settings.ready(&worker).await?;
    settings.ready(&jobs).await?;
    // Activity ids of this run: distinct from earlier runs' on the same stores.
    let mut next_id = (run_id % 1_000_000_000) * 10;
    let mut sale_id = || {
        next_id += 1;
        next_id
    };
    let start_api = |n: usize, extra: Vec<(&'static str, String)>| {
        let settings = &settings;
        async move {
            let procs = (0..n)
                .map(|_| settings.spawn("api", &extra))
                .collect::<Result<Vec<_>, _>>()?;
            for p in &procs {
                settings.ready(p).await?;
            }
            Ok::<_, anyhow::Error>(procs)
        }
    };

    let mut rows = Vec::new();
    // Stage 1: one node at its limit.
    let api = start_api(1, unlimited.to_vec()).await?;
    let id = sale_id();
    settings.sale(&api, id, opts.users * 2, 16).await?;
    let (r, cpu) = settings.load(&api, id, opts.users, 1, 0.0, opts).await?;
    settings.settle(&api, id).await?;
    rows.push(row(1, "one API process at its limit".into(), 1, &r, cpu));
    progress(&format!("stage 1: {:.0} purchases/s", rows[0].purchases_per_sec));
    drop(api);

    // Stage 2: the same clicks over 1, 2, 3 API processes.
    for n in 1..=3 {
        let api = start_api(n, unlimited.to_vec()).await?;
        let id = sale_id();
        settings.sale(&api, id, opts.users * 2, 16).await?;
        let (r, cpu) = settings.load(&api, id, opts.users, 1, 0.0, opts).await?;
        settings.settle(&api, id).await?;
        let name = format!("spread over {n} API process{}", if n == 1 { "" } else { "es" });
        rows.push(row(2, name, n, &r, cpu));
        progress(&format!(
            "stage 2, {n} API: {:.0} purchases per API CPU-s",
            rows.last().expect("pushed").purchases_per_api_cpu_s
        ));
    }

    // Stage 3: the funnel at peak. Each process's global limit is a tenth of what one process
    // sustained: the opening burst (every user at once, before the stock is gone and the tokens
    // are refused from memory) exceeds it, so the limiter is a layer that sheds.
    let limit = ((rows[0].purchases_per_sec / 10.0) as u64).max(50);
    let api = start_api(
        3,
        vec![
            ("SECKILL_RATE_PER_IP_PER_SEC", "10000000".to_string()),
            ("SECKILL_RATE_GLOBAL_PER_SEC", limit.to_string()),
        ],
    )
    .await?;
    let stock = (opts.users / 10).max(10);
    let users = stock * 10;
    let id = sale_id();
    settings.sale(&api, id, stock, 16).await?;
    let (r, _) = settings.load(&api, id, users, 3, 0.5, opts).await?;
    let audit = settings.settle(&api, id).await?;
    let purchases: u64 = r.by_status.values().sum();
    let funnel = Funnel {
        api_processes: api.len(),
        users,
        stock,
        clicks: purchases + r.tokens_refused.values().sum::<u64>() + r.errors,
        global_limit_per_sec: limit,
        tokens_refused: r.tokens_refused.clone(),
        purchases: r.by_status.clone(),
        errors: r.errors,
        purchases_per_sec: purchases as f64 / r.elapsed_s.max(1e-9),
        latency_ms_p99: r.latency_us_p99 as f64 / 1e3,
        units_sold: audit["units_sold"].as_u64().unwrap_or(0),
        audit: audit["verdict"].as_str().unwrap_or("unknown").to_string(),
    };
    progress("stage 3: done");
    drop((api, worker, jobs));
    Ok(StagesReport { rows, funnel })
}

/// The report as the table `seckill load --stages` prints.
pub fn table(r: &StagesReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:<34} {:>4} {:>7} {:>12} {:>8} {:>8} {:>9} {:>16}",
        "stage", "run", "api", "clicks", "purchases/s", "p50 ms", "p99 ms", "API CPU-s", "per API CPU-s"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:<5} {:<34} {:>4} {:>7} {:>12.0} {:>8.2} {:>8.2} {:>9.2} {:>16.0}",
            row.stage,
            row.name,
            row.api_processes,
            row.clicks,
            row.purchases_per_sec,
            row.latency_ms_p50,
            row.latency_ms_p99,
            row.api_cpu_s,
            row.purchases_per_api_cpu_s
        );
    }
    let f = &r.funnel;
    let statuses = |m: &BTreeMap<u16, u64>| {
        m.iter()
            .map(|(s, n)| format!("{s} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "\nstage 3, the funnel at peak: {} users for {} units, 1-3 clicks each, half the demand on \
         2 of 16 buckets, {} API processes each limited to {} requests/s",
        f.users, f.stock, f.api_processes, f.global_limit_per_sec
    );
    let _ = writeln!(out, "  clicks             {}", f.clicks);
    let _ = writeln!(out, "  token refused      {}", statuses(&f.tokens_refused));
    let _ = writeln!(out, "  purchase answered  {}", statuses(&f.purchases));
    let _ = writeln!(out, "  no answer          {}", f.errors);
    let _ = writeln!(
        out,
        "  ledger at rest     {} units sold of {}; audit {}",
        f.units_sold, f.stock, f.audit
    );
    out
}

/// The bars of the PNG: stage 1 and 2's purchases per API CPU-second, then stage 3's funnel
/// (red: answers that are failures of the engine, 503 or none).
pub fn bars(r: &StagesReport) -> Vec<Bar> {
    let bar = |label: String, value: f64, bad: bool| Bar { label, value, bad };
    let mut out: Vec<Bar> = r
        .rows
        .iter()
        .map(|row| {
            let label = format!("{}: {}, purchases per API CPU-s", row.stage, row.name);
            bar(label, row.purchases_per_api_cpu_s, row.errors > 0)
        })
        .collect();
    let f = &r.funnel;
    out.push(bar("3: clicks".into(), f.clicks as f64, false));
    for (s, n) in &f.tokens_refused {
        out.push(bar(format!("3: token refused {s}"), *n as f64, *s >= 500));
    }
    for (s, n) in &f.purchases {
        out.push(bar(format!("3: purchase answered {s}"), *n as f64, *s >= 500));
    }
    out.push(bar("3: no answer".into(), f.errors as f64, f.errors > 0));
    out.push(bar(
        "3: units sold (ledger, at rest)".into(),
        f.units_sold as f64,
        false,
    ));
    out
}
