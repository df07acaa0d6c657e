//! `seckill bench`: the seeds' stock-deduction strategies and the engine's own paths, side by side
//! on the real stores, each for the same duration and concurrency, in one run — ops/s, p99, the
//! ratio to the first row, and each strategy's oversell count under the same contention.
//!
//! Throughput phase: ample stock, `concurrency` workers looping for `duration`. Correctness phase:
//! 100 units, the same workers racing until every one of them has seen "sold out"; a strategy
//! that took more than 100 units oversold by the difference (the naive GET-then-DECR row is
//! there to show that the check can see it).

use crate::cli::tools::{run_on, runtime_multi, wall_now_ms};
use anyhow::Context;
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use seckill_core::adapters::script::{Reply, Script, ScriptConn, ScriptedStockCache};
use seckill_core::domain::{Activity, ActivityId, ActivitySpec, ReservationId, StockPlan, UserId};
use seckill_core::ports::{Ledger, OrderBus, StockCache};
use seckill_stores::backend::{RealBackend, RealSettings};
use seckill_stores::redis::RedisConn;
pub use seckill_stores::strategies::{Attempt, Mysql, MysqlKind, Redis, RedisKind, Strategy, BUCKETS};
use serde::Serialize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Units in the correctness phase.
pub const CONTENDED_STOCK: u64 = 100;
/// Units in the throughput phase: more than any run can sell.
const AMPLE_STOCK: u64 = 1_000_000_000;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// ops/s over the first row's.
    pub ratio: f64,
    pub errors: u64,
    /// Units taken beyond the stock in the correctness phase (`None`: not a stock strategy).
    pub oversold: Option<i64>,
    /// Instructions per op of the process measured (valgrind's callgrind), where counted.
    pub instructions: Option<u64>,
}

pub struct Measurement {
    pub ops: u64,
    pub taken: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency: Histogram<u64>,
}

/// `concurrency` workers calling `attempt` until `stop` says so (checked after each attempt).
async fn drive(
    s: Arc<dyn Strategy>,
    concurrency: usize,
    stop: impl Fn(Duration, u64) -> bool + Send + Sync + Clone + 'static,
) -> Measurement {
    let started = tokio::time::Instant::now();
    let users = Arc::new(AtomicU64::new(1));
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let (s, users, stop) = (s.clone(), users.clone(), stop.clone());
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
                let (mut ops, mut taken, mut errors, mut sold_out) = (0u64, 0u64, 0u64, false);
                while !stop(started.elapsed(), if sold_out { 1 } else { 0 }) {
                    let user = users.fetch_add(1, Ordering::Relaxed);
                    let t = tokio::time::Instant::now();
                    match s.attempt(w, user).await {
                        Ok(true) => taken += 1,
                        Ok(false) => sold_out = true,
                        Err(_) => errors += 1,
                    }
                    let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                    ops += s.per_attempt();
                }
                (ops, taken, errors, h)
            })
        })
        .collect();
    let mut m = Measurement {
        ops: 0,
        taken: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    };
    for t in tasks {
        if let Ok((ops, taken, errors, h)) = t.await {
            m.ops += ops;
            m.taken += taken;
            m.errors += errors;
            let _ = m.latency.add(&h);
        }
    }
    m.elapsed = started.elapsed();
    m
}

/// Throughput only (for paths that are not a stock strategy of their own).
pub async fn measure_throughput(
    s: Arc<dyn Strategy>,
    duration: Duration,
    concurrency: usize,
) -> Result<Row, String> {
    s.setup(AMPLE_STOCK).await?;
    let m = drive(s.clone(), concurrency, move |t, _| t >= duration).await;
    Ok(row(s.name(), &m, None))
}

impl Row {
    /// A row of orders drained (`ops` of them at `ops_per_sec`, `p99_us` a batch's): no p50, no
    /// stock to oversell.
    pub(super) fn drained(name: &str, ops: u64, ops_per_sec: f64, p99_us: u64) -> Row {
        Row {
            name: name.into(),
            ops,
            ops_per_sec,
            p50_us: 0,
            p99_us,
            ratio: 0.0,
            errors: 0,
            oversold: None,
            instructions: None,
        }
    }
}

fn row(name: String, m: &Measurement, oversold: Option<i64>) -> Row {
    Row {
        name,
        ops: m.ops,
        ops_per_sec: m.ops as f64 / m.elapsed.as_secs_f64().max(1e-9),
        p50_us: m.latency.value_at_quantile(0.5),
        p99_us: m.latency.value_at_quantile(0.99),
        ratio: 0.0,
        errors: m.errors,
        oversold,
        instructions: None,
    }
}

/// Throughput for `duration`, then the correctness phase; one row.
pub async fn measure(s: Arc<dyn Strategy>, duration: Duration, concurrency: usize) -> Result<Row, String> {
    s.setup(AMPLE_STOCK).await?;
    let m = drive(s.clone(), concurrency, move |t, _| t >= duration).await;
    s.setup(CONTENDED_STOCK).await?;
    // Each worker stops at its first "sold out" (or after a bound, for a strategy that never says so).
    let c = drive(s.clone(), concurrency, |t, sold_out| {
        sold_out == 1 || t >= Duration::from_secs(30)
    })
    .await;
    let mut r = row(
        s.name(),
        &m,
        Some((c.taken as i64 - CONTENDED_STOCK as i64).max(0)),
    );
    r.errors += c.errors;
    Ok(r)
}

/// Fill in the ratio column against the first row.
pub fn with_ratios(mut rows: Vec<Row>) -> Vec<Row> {
    let base = rows.first().map(|r| r.ops_per_sec).unwrap_or(1.0).max(1e-9);
    for r in &mut rows {
        r.ratio = r.ops_per_sec / base;
    }
    rows
}

// ---------------------------------------------------------------------------------------------
// The engine's reserve path against the raw script call.

/// Raw EVALSHA of `reserve.lua` (own bucket) with the arguments the engine would pass.
pub struct RawReserve {
    pub conn: RedisConn,
    pub plan: StockPlan,
    pub next: AtomicU64,
}

/// The limit the engine's reserve path is measured against: one Redis core running
/// `reserve.lua` as fast as a pipelining client can feed it — `PIPELINE` EVALSHAs per round trip,
/// the engine's keys and arguments (as `redis-benchmark -P 16` drives it). Its latency is a
/// pipeline's.
pub struct PipelinedReserve {
    pub raw: RawReserve,
}

/// Scripts per pipeline of `PipelinedReserve`.
pub const PIPELINE: u64 = 16;

/// The row of `PipelinedReserve`.
pub const REDIS_LIMIT: &str = "limit: Redis, EVALSHA reserve.lua pipelined 16 deep";

/// `PurchaseService::purchase` with the same Redis, publishing to an in-process bus (so that what
/// is compared is the engine's reserve path, not Kafka).
pub struct ServiceReserve<B: OrderBus> {
    pub service: seckill_core::service::PurchaseService<ScriptedStockCache<RedisConn>, B>,
    pub cache: ScriptedStockCache<RedisConn>,
    pub activity: Activity,
}

/// A fresh activity for one phase, with ample or contended stock.
pub fn bench_activity(id: u64, stock: u64) -> Activity {
    Activity::new(ActivitySpec {
        id: ActivityId(id),
        total_stock: stock,
        buckets: BUCKETS,
        fallback_pct: 0,
        per_user_limit: 1,
        start_ms: 0,
        end_ms: u64::MAX,
        pay_timeout_ms: 900_000,
        unit_price_minor: 0,
    })
    .expect("a valid bench activity")
}

impl Strategy for RawReserve {
    fn name(&self) -> String {
        "engine: raw EVALSHA reserve.lua".into()
    }

    fn setup(&self, _stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            ScriptedStockCache::new(self.conn.clone())
                .warmup(
                    &self.plan,
                    &seckill_core::ports::Intent::FIRST,
                    seckill_core::ports::WarmFrom::Plan,
                )
                .await
                .map_err(|e| e.to_string())?;
            self.conn
                .script_load(Script::Reserve.source())
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            let (keys, args) = self.call(user);
            reserved(
                self.conn
                    .eval_sha(Script::Reserve.sha1(), &keys, &args)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        })
    }
}

impl RawReserve {
    /// The keys and arguments of `user`'s reserve in their own bucket, as the engine passes them.
    fn call(&self, user: u64) -> (Vec<String>, Vec<String>) {
        let a = self.plan.activity;
        let b = self.plan.route(UserId(user));
        let keys = vec![
            seckill_core::adapters::script::stock_key(a, b),
            seckill_core::adapters::script::buyers_key(a, b),
            seckill_core::adapters::script::resv_key(a, b),
            seckill_core::adapters::script::gate_key(a, b),
        ];
        let id = ReservationId(self.next.fetch_add(1, Ordering::Relaxed) as u128);
        let args = vec![
            "own".to_string(),
            user.to_string(),
            "1".into(),
            id.to_string(),
            "1".into(),
            b.to_string(),
            "0".into(),
        ];
        (keys, args)
    }
}

/// Whether `reserve.lua` answered "reserved".
fn reserved(reply: Reply) -> Attempt {
    match reply {
        Reply::Array(items) => Ok(matches!(items.first(), Some(Reply::Bulk(t)) if t == b"reserved")),
        other => Err(format!("{other:?}")),
    }
}

impl Strategy for PipelinedReserve {
    fn name(&self) -> String {
        REDIS_LIMIT.into()
    }

    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>> {
        self.raw.setup(stock)
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            // Users `user * PIPELINE ..`: distinct from every other attempt's.
            let calls: Vec<_> = (0..PIPELINE)
                .map(|i| self.raw.call(user * PIPELINE + i))
                .collect();
            let replies = self
                .raw
                .conn
                .eval_sha_pipelined(Script::Reserve.sha1(), &calls)
                .await
                .map_err(|e| e.to_string())?;
            let mut all = true;
            for r in replies {
                all &= reserved(r)?;
            }
            Ok(all)
        })
    }

    fn per_attempt(&self) -> u64 {
        PIPELINE
    }
}

impl<B: OrderBus> Strategy for ServiceReserve<B> {
    fn name(&self) -> String {
        super::capacity::BENCH_APP.into()
    }

    fn setup(&self, _stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let plan = StockPlan::new(&self.activity);
            let intent = seckill_core::ports::Intent::FIRST;
            self.cache
                .warmup(&plan, &intent, seckill_core::ports::WarmFrom::Plan)
                .await
                .map_err(|e| e.to_string())?;
            self.service.load_activity(&seckill_core::ports::Registered {
                activity: self.activity.clone(),
                intent,
            });
            Ok(())
        })
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            match self.service.purchase(self.activity.id(), UserId(user), 1).await {
                Ok(seckill_core::service::PurchaseOutcome::Queued(_)) => Ok(true),
                Ok(seckill_core::service::PurchaseOutcome::SoldOut) => Ok(false),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The consumer: Kafka -> MariaDB, batched against one transaction per order.

/// Drain `orders` published orders through an `OrderConsumer` with batches of `max_batch`;
/// returns (orders applied per second, p99 of one batch in µs).
pub async fn consume<B: OrderBus, L: Ledger, C: StockCache>(
    bus: &B,
    ledger: &L,
    cache: &C,
    group: &str,
    orders: u64,
    max_batch: usize,
) -> anyhow::Result<(f64, u64)> {
    let source = bus.subscribe(group).await?;
    let mut consumer =
        seckill_core::service::OrderConsumer::new(ledger.clone(), cache.clone(), source, max_batch);
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let started = tokio::time::Instant::now();
    let mut applied = 0u64;
    while applied < orders {
        let t = tokio::time::Instant::now();
        let r = consumer.run_once().await?;
        if r.delivered > 0 {
            let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        }
        applied += r.delivered;
        if started.elapsed() > Duration::from_secs(300) {
            anyhow::bail!(format!("only {applied} of {orders} applied in 300 s"));
        }
    }
    Ok((
        applied as f64 / started.elapsed().as_secs_f64(),
        h.value_at_quantile(0.99),
    ))
}

/// The row of the ledger's batched apply alone.
pub const LEDGER_LIMIT: &str = "limit: MariaDB, the ledger's batched apply alone";

/// Connections applying at once in `apply_alone`: a worker pool's.
const APPLY_CONNECTIONS: u64 = 4;

/// `orders` applied straight to the ledger in batches of the consumer's size, by
/// `APPLY_CONNECTIONS` tasks at once, each on an activity of its own (as workers apply
/// partitions of their own); returns (orders per second, p99 of one batch in µs).
pub async fn apply_alone<L: Ledger>(ledger: &L, first_id: u64, orders: u64) -> anyhow::Result<(f64, u64)> {
    use seckill_core::domain::Reservation;
    let batch = seckill_core::service::consumer::DEFAULT_MAX_BATCH as u64;
    let per_task = orders.div_ceil(APPLY_CONNECTIONS);
    let mut plans = Vec::new();
    for t in 0..APPLY_CONNECTIONS {
        let activity = bench_activity(first_id + t, 1_000_000_000);
        let plan = StockPlan::new(&activity);
        ledger.install(&activity, &plan).await?;
        plans.push(plan);
    }
    let started = tokio::time::Instant::now();
    let tasks = plans.into_iter().map(|plan| async move {
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
        for from in (0..per_task).step_by(batch as usize) {
            let events: Vec<Reservation> = (from..(from + batch).min(per_task))
                .map(|i| {
                    let user = UserId(i + 1);
                    Reservation {
                        id: ReservationId(((plan.activity.0 as u128) << 64) | i as u128),
                        activity: plan.activity,
                        user,
                        bucket: plan.route(user),
                        qty: 1,
                        reserved_at_ms: 0,
                        generation: 0,
                    }
                })
                .collect();
            let t = tokio::time::Instant::now();
            ledger.apply(&events).await?;
            let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        }
        Ok::<_, anyhow::Error>(h)
    });
    let mut all = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    for h in futures::future::try_join_all(tasks).await? {
        all.add(&h).expect("same bounds");
    }
    Ok((
        (per_task * APPLY_CONNECTIONS) as f64 / started.elapsed().as_secs_f64(),
        all.value_at_quantile(0.99),
    ))
}

// ---------------------------------------------------------------------------------------------
// The chart.

/// Where a TrueType font usually is on Debian (`fonts-dejavu-core`), for the chart's text.
const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// A horizontal bar chart of ops/s (log scale, so that 100/s and 100,000/s both show), one bar
/// per row, red where the strategy oversold.
/// The table as CSV (the `csv` crate: names with commas or quotes stay one field), one header
/// row and one row per strategy; rates to 0.1 op/s and ratios to 4 places, as the table prints.
pub fn write_csv(rows: &[Row], path: &std::path::Path) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    for r in rows {
        let rounded = Row {
            ops_per_sec: (r.ops_per_sec * 10.0).round() / 10.0,
            ratio: (r.ratio * 10_000.0).round() / 10_000.0,
            ..r.clone()
        };
        w.serialize(rounded)?;
    }
    w.flush()?;
    Ok(())
}

/// The strategies' ops/s as a PNG bar chart, log scale (red: oversold).
pub fn plot(rows: &[Row], path: &std::path::Path) -> Result<(), String> {
    let bars: Vec<Bar> = rows
        .iter()
        .map(|r| Bar {
            label: r.name.clone(),
            value: r.ops_per_sec,
            bad: r.oversold.unwrap_or(0) > 0,
        })
        .collect();
    bar_chart(
        path,
        "seckill bench: ops/s, log scale (red: oversold)",
        &bars,
        true,
    )
}

/// One bar of a chart: its label, its value, and whether it is drawn red (a failure).
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub bad: bool,
}

/// Horizontal bars, one per row, labelled with their values (`log_scale`: lengths by log10).
pub fn bar_chart(path: &std::path::Path, title: &str, bars: &[Bar], log_scale: bool) -> Result<(), String> {
    use plotters::prelude::*;
    let font = FONT_PATHS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no TrueType font found (install fonts-dejavu-core)")?;
    // plotters keeps registered fonts for the life of the process.
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| "the font does not load")?;
    let (w, row_h, label_w, top) = (1400u32, 30u32, 560i32, 50i32);
    let h = top as u32 + row_h * bars.len() as u32 + 20;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    root.draw(&Text::new(title, (10, 12), ("sans-serif", 22).into_font()))
        .map_err(err)?;
    let largest = bars.iter().map(|b| b.value).fold(10.0f64, f64::max);
    let scale = |v: f64| match log_scale {
        true => v.max(1.0).log10() / largest.log10().ceil(),
        false => v.max(0.0) / largest,
    };
    let bar_w = (w as i32 - label_w - 140) as f64;
    for (i, b) in bars.iter().enumerate() {
        let y = top + i as i32 * row_h as i32;
        let len = (scale(b.value) * bar_w).max(1.0) as i32;
        let color = if b.bad { RED } else { BLUE };
        root.draw(&Text::new(
            b.label.clone(),
            (10, y + 6),
            ("sans-serif", 16).into_font(),
        ))
        .map_err(err)?;
        root.draw(&Rectangle::new(
            [(label_w, y + 4), (label_w + len, y + row_h as i32 - 4)],
            color.mix(0.7).filled(),
        ))
        .map_err(err)?;
        let value = format!("{:.0}", b.value);
        root.draw(&Text::new(
            value,
            (label_w + len + 8, y + 6),
            ("sans-serif", 16).into_font(),
        ))
        .map_err(err)?;
    }
    root.present().map_err(err)
}

pub struct BenchOptions {
    pub duration: std::time::Duration,
    pub concurrency: usize,
    pub orders: u64,
    pub only: Option<String>,
    pub json: bool,
    pub csv: Option<std::path::PathBuf>,
    pub plot: Option<std::path::PathBuf>,
    /// Count instead of time: the HTTP rows' servers under callgrind, this many clicks a row.
    pub instructions: Option<u64>,
}

/// `seckill bench`: every strategy on the real stores, one table.
pub fn run(opts: BenchOptions) -> ExitCode {
    use super::bench::{self, MysqlKind, RedisKind, Row, Strategy};
    use seckill_stores::redis::{RedisConfig, RedisConn};
    use std::sync::Arc;

    let runtime = match runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    run_on(runtime, async move {
        let settings = RealSettings::from_env()?
            .context("bench needs the real stores: set REDIS_URL, KAFKA_BROKERS and DATABASE_URL")?;
        let real = RealBackend::connect(&settings).await?;
        let run = wall_now_ms();
        // Counting instructions is for the HTTP rows alone: the other rows run in this process.
        let counted = |name: &str| opts.instructions.is_none() || super::http::NAMES.contains(&name);
        let wanted =
            |name: &str| opts.only.as_ref().is_none_or(|o| name.contains(o.as_str())) && counted(name);
        let conns = |cfg: RedisConfig, n: usize| async move {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(RedisConn::connect(&cfg).await?);
            }
            Ok::<_, anyhow::Error>(v)
        };
        let single = conns(settings.redis.clone(), opts.concurrency).await?;
        let mut strategies: Vec<Arc<dyn Strategy>> = Vec::new();
        let pool = real.ledger.pool().clone();
        for kind in [
            MysqlKind::SelectForUpdate,
            MysqlKind::ConditionalUpdate,
            MysqlKind::OptimisticVersion,
            MysqlKind::Buckets,
        ] {
            strategies.push(Arc::new(bench::Mysql::new(pool.clone(), kind, run)));
        }
        for kind in [
            RedisKind::NaiveGetDecr,
            RedisKind::WatchOneKey,
            RedisKind::WatchSubKeys,
            RedisKind::LuaOneKey,
            RedisKind::LuaBuckets,
        ] {
            strategies.push(Arc::new(bench::Redis::new(single.clone(), kind, run, false)));
        }
        if let Ok(nodes) = std::env::var("REDIS_CLUSTER_NODES") {
            let cluster = conns(RedisConfig::cluster(&nodes), 1).await?;
            for kind in [RedisKind::LuaOneKey, RedisKind::LuaBuckets] {
                strategies.push(Arc::new(bench::Redis::new(cluster.clone(), kind, run, true)));
            }
        }
        let mut rows: Vec<Row> = Vec::new();
        // Progress on stderr (drawn only on a terminal): the runs done and the one running.
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} bench: {pos} runs done, running {msg}  {elapsed}",
            )
            .expect("the template is fixed"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        for s in strategies.into_iter().filter(|s| wanted(&s.name())) {
            bar.set_message(s.name());
            rows.push(
                bench::measure(s, opts.duration, opts.concurrency)
                    .await
                    .map_err(anyhow::Error::msg)?,
            );
            bar.inc(1);
        }
        // The engine's reserve path against the raw script and against one Redis core's limit:
        // fresh activities, ample stock.
        let raw = |id: u64| bench::RawReserve {
            conn: single[0].clone(),
            plan: seckill_core::domain::StockPlan::new(&bench::bench_activity(id, 1_000_000_000)),
            next: std::sync::atomic::AtomicU64::new(1),
        };
        let engine_rows: [Arc<dyn Strategy>; 3] = [
            Arc::new(bench::PipelinedReserve {
                raw: raw(run + 20_000),
            }),
            Arc::new(raw(run)),
            {
                let activity = bench::bench_activity(run + 1, 1_000_000_000);
                let cache = seckill_core::adapters::script::ScriptedStockCache::new(single[0].clone());
                let bus = seckill_core::adapters::embedded::EmbeddedBus::new(6, usize::MAX >> 1);
                let clock = seckill_core::clock::Clock::new(wall_now_ms(), tokio::time::Instant::now());
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(run);
                let service = seckill_core::service::PurchaseService::new(
                    cache.clone(),
                    bus,
                    clock,
                    Default::default(),
                    &mut rng,
                );
                Arc::new(bench::ServiceReserve {
                    service,
                    cache,
                    activity,
                })
            },
        ];
        for s in engine_rows.into_iter().filter(|s| wanted(&s.name())) {
            bar.set_message(s.name());
            let mut row = bench::measure_throughput(s, opts.duration, opts.concurrency)
                .await
                .map_err(anyhow::Error::msg)?;
            row.oversold = None;
            rows.push(row);
            bar.inc(1);
        }
        // The consumer, batched against one transaction per order, on orders published for it.
        for (max_batch, name) in [
            (
                seckill_core::service::consumer::DEFAULT_MAX_BATCH,
                super::capacity::BENCH_DB,
            ),
            (1, "engine: consumer Kafka -> MariaDB, one transaction per order"),
        ] {
            if !wanted(name) {
                continue;
            }
            bar.set_message(name);
            let id = run + 2 + max_batch as u64;
            let activity = bench::bench_activity(id, 1_000_000_000);
            let plan = seckill_core::domain::StockPlan::new(&activity);
            real.ledger.install(&activity, &plan).await?;
            for i in 0..opts.orders {
                let user = seckill_core::domain::UserId(i + 1);
                let r = seckill_core::domain::Reservation {
                    id: seckill_core::domain::ReservationId(((id as u128) << 64) | i as u128),
                    activity: activity.id(),
                    user,
                    bucket: plan.route(user),
                    qty: 1,
                    reserved_at_ms: wall_now_ms(),
                    generation: 0,
                };
                real.bus.publish(&r).await?;
            }
            let group = format!("bench-{id}");
            let (ops, p99) = bench::consume(
                &real.bus,
                &real.ledger,
                &real.cache,
                &group,
                opts.orders,
                max_batch,
            )
            .await?;
            rows.push(Row::drained(name, opts.orders, ops, p99));
            bar.inc(1);
        }
        // The limit the consumer is measured against: the ledger's batched apply alone (no
        // Kafka, no Redis), the same statements on as many connections as a worker pool has.
        if wanted(LEDGER_LIMIT) {
            bar.set_message(LEDGER_LIMIT);
            let (ops, p99) = bench::apply_alone(&real.ledger, run + 10_000, opts.orders).await?;
            rows.push(Row::drained(LEDGER_LIMIT, opts.orders, ops, p99));
            bar.inc(1);
        }
        // The HTTP route against hello world, on a server of this binary per backend.
        if super::http::NAMES.iter().any(|n| wanted(n)) {
            bar.set_message("http");
            let stores = super::procs::stores_from_env();
            let measure = match opts.instructions {
                Some(clicks) => super::http::Measure::Count { clicks },
                None => super::http::Measure::Time(opts.duration),
            };
            rows.extend(super::http::rows(stores, run, measure, wanted).await?);
            bar.inc(1);
        }
        bar.finish_and_clear();
        let rows = bench::with_ratios(rows);
        if let Some(path) = &opts.csv {
            bench::write_csv(&rows, path).with_context(|| format!("--csv {}", path.display()))?;
        }
        if let Some(path) = &opts.plot {
            bench::plot(&rows, path)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--plot {}", path.display()))?;
        }
        if opts.json {
            let value = serde_json::json!({
                "duration_ms": opts.duration.as_millis() as u64,
                "concurrency": opts.concurrency,
                "contended_stock": bench::CONTENDED_STOCK,
                "rows": rows,
            });
            println!("{value}");
        } else {
            println!(
                "seckill bench: {} s per strategy, {} workers; oversold = units taken beyond {} under the same contention",
                opts.duration.as_secs_f64(), opts.concurrency, bench::CONTENDED_STOCK
            );
            if let Some(clicks) = opts.instructions {
                println!(
                    "instructions counted by valgrind's callgrind in the server over {clicks} clicks a row (ops/s and latency are callgrind's, not the engine's)"
                );
            }
            println!(
                "{:<62} {:>11} {:>10} {:>10} {:>8} {:>7} {:>8} {:>9}",
                "strategy", "ops/s", "p50 us", "p99 us", "ratio", "errors", "oversold", "instr/op"
            );
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
            for r in &rows {
                println!(
                    "{:<62} {:>11.0} {:>10} {:>10} {:>8.3} {:>7} {:>8} {:>9}",
                    r.name,
                    r.ops_per_sec,
                    r.p50_us,
                    r.p99_us,
                    r.ratio,
                    r.errors,
                    or_dash(r.oversold.map(|o| o.to_string())),
                    or_dash(r.instructions.map(|i| i.to_string())),
                );
            }
            let find = |n: &str| rows.iter().find(|r| r.name == n).map(|r| r.ops_per_sec);
            // Counted, a route against hello world in instructions per request (callgrind counts
            // no time in the kernel, where hello world spends most of its: no throughput ratio).
            let count = |n: &str| rows.iter().find(|r| r.name == n).and_then(|r| r.instructions);
            for (route, hello) in [
                (super::http::SOLD_OUT, super::http::HEALTHZ),
                (super::http::PURCHASE, super::http::HEALTHZ),
                (super::http::PURCHASE_REAL, super::http::HEALTHZ_REAL),
            ] {
                if let (Some(a), Some(b @ 1..)) = (count(route), count(hello)) {
                    println!(
                        "{route}: {a} instructions per request, {b} for hello world ({:.1}x)",
                        a as f64 / b as f64
                    );
                }
            }
            let ratios: [(&str, &str, &str, &str); 7] = [
                (
                    super::capacity::BENCH_APP,
                    bench::REDIS_LIMIT,
                    "engine reserve path / one Redis core's pipelined limit",
                    "0.60",
                ),
                (
                    super::capacity::BENCH_APP,
                    "engine: raw EVALSHA reserve.lua",
                    "engine reserve path / raw EVALSHA",
                    "0.80",
                ),
                (
                    super::capacity::BENCH_DB,
                    LEDGER_LIMIT,
                    "consumer batched / the ledger's batched apply alone",
                    "0.30",
                ),
                (
                    super::capacity::BENCH_DB,
                    "engine: consumer Kafka -> MariaDB, one transaction per order",
                    "consumer batched / one transaction per order",
                    "20x",
                ),
                (
                    super::http::PURCHASE,
                    super::http::HEALTHZ,
                    "http token + purchase / GET /healthz, embedded stores",
                    "0.50",
                ),
                (
                    super::http::SOLD_OUT,
                    super::http::HEALTHZ,
                    "http token sold out / GET /healthz, embedded stores",
                    "0.90",
                ),
                (
                    super::http::PURCHASE_REAL,
                    super::http::HEALTHZ_REAL,
                    "http token + purchase / GET /healthz, Redis + Kafka + MariaDB",
                    "",
                ),
            ];
            for (this, that, line, goal) in ratios.into_iter().filter(|_| opts.instructions.is_none()) {
                if let (Some(a), Some(b)) = (find(this), find(that)) {
                    match goal.strip_suffix('x') {
                        _ if goal.is_empty() => println!("{line}: {:.2}", a / b),
                        Some(_) => println!("{line}: {:.1}x (goal >= {goal})", a / b),
                        None => println!("{line}: {:.2} (goal >= {goal})", a / b),
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod csv_tests {
    use super::*;

    #[test]
    fn the_csv_has_one_field_per_column_whatever_the_names() {
        let row = |name: &str, oversold| Row {
            name: name.to_string(),
            ops: 10,
            ops_per_sec: 2767.7123,
            p50_us: 5,
            p99_us: 9,
            ratio: 0.123456,
            errors: 0,
            oversold,
            instructions: None,
        };
        let path = std::env::temp_dir().join(format!("seckill-bench-{}.csv", std::process::id()));
        write_csv(
            &[row(r#"redis: "GET", then DECR"#, Some(3)), row("engine", None)],
            &path,
        )
        .unwrap();
        let mut r = csv::Reader::from_path(&path).unwrap();
        let header: Vec<String> = r.headers().unwrap().iter().map(str::to_string).collect();
        assert_eq!(
            header.join(","),
            "name,ops,ops_per_sec,p50_us,p99_us,ratio,errors,oversold,instructions"
        );
        let records: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
        assert_eq!(&records[0][0], r#"redis: "GET", then DECR"#);
        assert_eq!(
            (&records[0][2], &records[0][5], &records[0][7]),
            ("2767.7", "0.1235", "3")
        );
        assert_eq!(
            &records[1][7], "",
            "no oversell count for a path that is not a strategy"
        );
        let _ = std::fs::remove_file(&path);
    }
}
