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
//! CPU time comes from `/proc/<pid>/task/*/schedstat` (nanoseconds on CPU, per thread). Every
//! run also reports how long its buyers' "queued" lasted: from each reservation to its order's
//! row in the ledger (`MysqlLedger::queued_to_order_ms`), once the sale is at rest.

use super::bench::Bar;
use super::load::{self, LoadConfig, LoadReport, Target};
use super::procs::{cpu_ns, Proc, Settings, AUDIENCE};
use seckill_core::domain::ActivityId;
use seckill_stores::mysql::MysqlLedger;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Runs of a `--stages` run (one, three, one), for a progress bar.
pub const RUNS: u64 = 5;

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
    /// From a buyer's 202 to the order's ledger row, over the run's orders (the ledger's
    /// `created_at` against the reservation's time: both this machine's clock).
    pub queued_to_order: QueuedToOrder,
}

/// Percentiles of the time from a 202 ("queued") to the order's row in the ledger, ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct QueuedToOrder {
    pub orders: usize,
    pub p50_ms: i64,
    pub p99_ms: i64,
    pub max_ms: i64,
}

impl QueuedToOrder {
    async fn of(ledger: &MysqlLedger, activity: u64) -> anyhow::Result<QueuedToOrder> {
        let mut ms = ledger.queued_to_order_ms(ActivityId(activity)).await?;
        ms.sort_unstable();
        let at = |q: f64| {
            ms.get(((ms.len() as f64 * q) as usize).min(ms.len().saturating_sub(1)))
                .copied()
        };
        Ok(QueuedToOrder {
            orders: ms.len(),
            p50_ms: at(0.5).unwrap_or(0),
            p99_ms: at(0.99).unwrap_or(0),
            max_ms: ms.last().copied().unwrap_or(0),
        })
    }
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
    pub queued_to_order: QueuedToOrder,
}

#[derive(Debug, Clone, Serialize)]
pub struct StagesReport {
    pub rows: Vec<StageRow>,
    pub funnel: Funnel,
}

impl Settings {
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
            jwts: None,
        };
        let before = cpu_ns(api)?;
        let report = load::run(&cfg, || {}).await?;
        let cpu_s = (cpu_ns(api)? - before) as f64 / 1e9;
        Ok((report, cpu_s))
    }
}

fn row(
    stage: u8,
    name: String,
    api: usize,
    r: &LoadReport,
    cpu_s: f64,
    queued_to_order: QueuedToOrder,
) -> StageRow {
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
        queued_to_order,
    }
}

/// Run the three stages. `env` holds the stores' settings (REDIS_URL, KAFKA_BROKERS,
/// DATABASE_URL); `progress` is told each finished run.
pub async fn run(
    opts: &StagesOptions,
    stores: Vec<(String, String)>,
    ledger: &MysqlLedger,
    progress: impl Fn(&str),
) -> anyhow::Result<StagesReport> {
    let run_id = crate::cli::tools::wall_now_ms();
    let settings = Settings::new(stores, run_id)?;
    let unlimited = super::procs::unlimited();
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
    let waited = QueuedToOrder::of(ledger, id).await?;
    rows.push(row(1, "one API process at its limit".into(), 1, &r, cpu, waited));
    progress(&format!("stage 1: {:.0} purchases/s", rows[0].purchases_per_sec));
    drop(api);

    // Stage 2: the same clicks over 1, 2, 3 API processes.
    for n in 1..=3 {
        let api = start_api(n, unlimited.to_vec()).await?;
        let id = sale_id();
        settings.sale(&api, id, opts.users * 2, 16).await?;
        let (r, cpu) = settings.load(&api, id, opts.users, 1, 0.0, opts).await?;
        settings.settle(&api, id).await?;
        let waited = QueuedToOrder::of(ledger, id).await?;
        let name = format!("spread over {n} API process{}", if n == 1 { "" } else { "es" });
        rows.push(row(2, name, n, &r, cpu, waited));
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
        queued_to_order: QueuedToOrder::of(ledger, id).await?,
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
        "{:<5} {:<34} {:>4} {:>7} {:>12} {:>8} {:>8} {:>9} {:>14} {:>22}",
        "stage",
        "run",
        "api",
        "clicks",
        "purchases/s",
        "p50 ms",
        "p99 ms",
        "API CPU-s",
        "per API CPU-s",
        "202 -> order p50/p99 ms"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:<5} {:<34} {:>4} {:>7} {:>12.0} {:>8.2} {:>8.2} {:>9.2} {:>14.0} {:>22}",
            row.stage,
            row.name,
            row.api_processes,
            row.clicks,
            row.purchases_per_sec,
            row.latency_ms_p50,
            row.latency_ms_p99,
            row.api_cpu_s,
            row.purchases_per_api_cpu_s,
            format!("{} / {}", row.queued_to_order.p50_ms, row.queued_to_order.p99_ms),
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
    let q = &f.queued_to_order;
    let _ = writeln!(
        out,
        "  202 -> order      p50 {} ms, p99 {} ms, max {} ms over {} orders",
        q.p50_ms, q.p99_ms, q.max_ms, q.orders
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
