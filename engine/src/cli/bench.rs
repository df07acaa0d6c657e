//! `seckill bench`: the seeds' stock-deduction strategies and the engine's own paths, side by side
//! on the real stores, each for the same duration and concurrency, in one run — ops/s, p99, the
//! ratio to the first row, and each strategy's oversell count under the same contention.
//!
//! Throughput phase: ample stock, `concurrency` workers looping for `duration`. Correctness phase:
//! 100 units, the same workers racing until every one of them has seen "sold out"; a strategy
//! that took more than 100 units oversold by the difference (the naive GET-then-DECR row is
//! there to show that the check can see it).

use crate::adapters::redis::RedisConn;
use crate::adapters::script::{Reply, Script, ScriptConn, ScriptedStockCache};
use crate::domain::{Activity, ActivityId, ActivitySpec, ReservationId, StockPlan, UserId};
use crate::ports::{Ledger, OrderBus, StockCache};
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use serde::Serialize;
use sqlx::mysql::MySqlPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Units in the correctness phase.
pub const CONTENDED_STOCK: u64 = 100;
/// Units in the throughput phase: more than any run can sell.
const AMPLE_STOCK: u64 = 1_000_000_000;
/// Buckets of the bucketed strategies (as the seeds' 100k design).
pub const BUCKETS: u32 = 32;

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
}

/// One attempt to take a unit: `Ok(true)` took one, `Ok(false)` sold out (or gave up on
/// conflicts), `Err` failed.
pub type Attempt = Result<bool, String>;

/// A strategy: set up `stock` units, then attempts by any worker.
pub trait Strategy: Send + Sync {
    fn name(&self) -> String;
    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>>;
    fn attempt(&self, worker: usize, user: u64) -> BoxFuture<'_, Attempt>;
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
                    ops += 1;
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
// MySQL strategies: one table of their own, created on demand.

pub struct Mysql {
    pool: MySqlPool,
    kind: MysqlKind,
    table: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MysqlKind {
    SelectForUpdate,
    ConditionalUpdate,
    OptimisticVersion,
    Buckets,
}

impl Mysql {
    pub fn new(pool: MySqlPool, kind: MysqlKind, run: u64) -> Mysql {
        Mysql {
            pool,
            kind,
            table: format!("bench_stock_{run}"),
        }
    }
}

fn sql(e: sqlx::Error) -> String {
    e.to_string()
}

impl Strategy for Mysql {
    fn name(&self) -> String {
        match self.kind {
            MysqlKind::SelectForUpdate => "mysql: SELECT ... FOR UPDATE, one row",
            MysqlKind::ConditionalUpdate => "mysql: conditional UPDATE, one row",
            MysqlKind::OptimisticVersion => "mysql: optimistic version, one row",
            MysqlKind::Buckets => "mysql: conditional UPDATE, 32 bucket rows",
        }
        .into()
    }

    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let t = &self.table;
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {t} (id INT PRIMARY KEY, remaining BIGINT NOT NULL, version BIGINT NOT NULL) ENGINE=InnoDB"
            );
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t}")))
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            let rows = if self.kind == MysqlKind::Buckets {
                BUCKETS as u64
            } else {
                1
            };
            for i in 0..rows {
                let share = stock / rows + u64::from(i < stock % rows);
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {t} (id, remaining, version) VALUES (?, ?, 0)"
                )))
                .bind(i)
                .bind(share as i64)
                .execute(&self.pool)
                .await
                .map_err(sql)?;
            }
            Ok(())
        })
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            let t = &self.table;
            match self.kind {
                MysqlKind::SelectForUpdate => {
                    let mut tx = self.pool.begin().await.map_err(sql)?;
                    let (left,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT remaining FROM {t} WHERE id = 0 FOR UPDATE"
                    )))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(sql)?;
                    if left <= 0 {
                        return Ok(false);
                    }
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE {t} SET remaining = remaining - 1 WHERE id = 0"
                    )))
                    .execute(&mut *tx)
                    .await
                    .map_err(sql)?;
                    tx.commit().await.map_err(sql)?;
                    Ok(true)
                }
                MysqlKind::ConditionalUpdate | MysqlKind::Buckets => {
                    let id = if self.kind == MysqlKind::Buckets {
                        crate::domain::BucketRouter::route(UserId(user), BUCKETS).0
                    } else {
                        0
                    };
                    let n = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE {t} SET remaining = remaining - 1 WHERE id = ? AND remaining > 0"
                    )))
                    .bind(id)
                    .execute(&self.pool)
                    .await
                    .map_err(sql)?
                    .rows_affected();
                    // A drained bucket row is "sold out" for its users (the seeds' buckets have
                    // no fallback in SQL).
                    Ok(n == 1)
                }
                MysqlKind::OptimisticVersion => {
                    // Read, then write only if nobody wrote in between; retry a few times.
                    for _ in 0..3 {
                        let (left, version): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT remaining, version FROM {t} WHERE id = 0"
                        )))
                        .fetch_one(&self.pool)
                        .await
                        .map_err(sql)?;
                        if left <= 0 {
                            return Ok(false);
                        }
                        let n = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "UPDATE {t} SET remaining = remaining - 1, version = version + 1 WHERE id = 0 AND version = ?"
                        )))
                        .bind(version)
                        .execute(&self.pool)
                        .await
                        .map_err(sql)?
                        .rows_affected();
                        if n == 1 {
                            return Ok(true);
                        }
                    }
                    Err("version conflict 3 times".into())
                }
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Redis strategies, on keys of their own.

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RedisKind {
    /// GET, then DECR in a second call: the race the seeds warn about (oversells).
    NaiveGetDecr,
    WatchOneKey,
    /// Seed 004: a parent key and sub-keys; WATCH a random non-empty sub-key.
    WatchSubKeys,
    LuaOneKey,
    LuaBuckets,
}

pub struct Redis {
    /// One connection per worker: WATCH state belongs to a connection.
    conns: Vec<RedisConn>,
    kind: RedisKind,
    prefix: String,
    cluster: bool,
}

const TAKE_ONE: &str = "local n = tonumber(redis.call('GET', KEYS[1]) or '0') \
                        if n <= 0 then return 0 end redis.call('DECR', KEYS[1]) return 1";

impl Redis {
    pub fn new(conns: Vec<RedisConn>, kind: RedisKind, run: u64, cluster: bool) -> Redis {
        Redis {
            conns,
            kind,
            prefix: format!("bench:{run}"),
            cluster,
        }
    }

    fn key(&self, i: u32) -> String {
        match self.kind {
            // Each bucket its own hash tag: spread over a cluster like the engine's buckets.
            RedisKind::LuaBuckets | RedisKind::WatchSubKeys => format!("{}:{{b{i}}}", self.prefix),
            _ => format!("{}:{{one}}", self.prefix),
        }
    }

    fn subkeys(&self) -> u32 {
        match self.kind {
            RedisKind::LuaBuckets => BUCKETS,
            RedisKind::WatchSubKeys => 16,
            _ => 1,
        }
    }
}

async fn q(c: &RedisConn, cmd: &redis::Cmd) -> Result<Reply, String> {
    match c.query("bench", cmd).await {
        Ok(Reply::Error(e)) => Err(e),
        Ok(r) => Ok(r),
        Err(e) => Err(e.to_string()),
    }
}

fn int(r: &Reply) -> i64 {
    match r {
        Reply::Int(i) => *i,
        Reply::Bulk(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

impl Strategy for Redis {
    fn name(&self) -> String {
        let on = if self.cluster { "redis cluster" } else { "redis" };
        let what = match self.kind {
            RedisKind::NaiveGetDecr => "GET then DECR (no atomicity)",
            RedisKind::WatchOneKey => "WATCH/MULTI, one key",
            RedisKind::WatchSubKeys => "WATCH/MULTI, parent + 16 sub-keys",
            RedisKind::LuaOneKey => "Lua, one key",
            RedisKind::LuaBuckets => "Lua, 32 buckets",
        };
        format!("{on}: {what}")
    }

    fn setup(&self, stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let c = &self.conns[0];
            let n = self.subkeys();
            for i in 0..n {
                let share = stock / n as u64 + u64::from((i as u64) < stock % n as u64);
                q(c, redis::cmd("SET").arg(self.key(i)).arg(share)).await?;
            }
            if self.kind == RedisKind::WatchSubKeys {
                q(
                    c,
                    redis::cmd("SET")
                        .arg(format!("{}:parent", self.prefix))
                        .arg(stock),
                )
                .await?;
            }
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(TAKE_ONE);
            for conn in &self.conns {
                conn.query_nodes("bench", &load)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    fn attempt(&self, worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            let c = &self.conns[worker % self.conns.len()];
            let sha = crate::adapters::script::sha1_hex(TAKE_ONE);
            match self.kind {
                RedisKind::NaiveGetDecr => {
                    let left = int(&q(c, redis::cmd("GET").arg(self.key(0))).await?);
                    if left <= 0 {
                        return Ok(false);
                    }
                    q(c, redis::cmd("DECR").arg(self.key(0))).await?;
                    Ok(true)
                }
                RedisKind::LuaOneKey | RedisKind::LuaBuckets => {
                    let i = crate::domain::BucketRouter::route(UserId(user), self.subkeys()).0;
                    Ok(int(&q(c, redis::cmd("EVALSHA").arg(&sha).arg(1).arg(self.key(i))).await?) == 1)
                }
                RedisKind::WatchOneKey | RedisKind::WatchSubKeys => {
                    // Up to 3 tries (on a collision another sub-key is picked, seed 004).
                    for attempt in 0..3u64 {
                        let i = match self.kind {
                            RedisKind::WatchSubKeys => {
                                crate::domain::BucketRouter::route(
                                    UserId(user.wrapping_mul(31).wrapping_add(attempt)),
                                    self.subkeys(),
                                )
                                .0
                            }
                            _ => 0,
                        };
                        let key = self.key(i);
                        q(c, redis::cmd("WATCH").arg(&key)).await?;
                        let left = int(&q(c, redis::cmd("GET").arg(&key)).await?);
                        if left <= 0 {
                            q(c, &redis::cmd("UNWATCH")).await?;
                            if self.kind == RedisKind::WatchSubKeys {
                                let parent =
                                    int(&q(c, redis::cmd("GET").arg(format!("{}:parent", self.prefix)))
                                        .await?);
                                if parent > 0 {
                                    continue;
                                }
                            }
                            return Ok(false);
                        }
                        let mut tx = redis::pipe();
                        tx.atomic().cmd("DECR").arg(&key);
                        let done = match c {
                            RedisConn::Single(m) => {
                                let mut m = m.clone();
                                tx.query_async::<Option<Vec<i64>>>(&mut m)
                                    .await
                                    .map_err(|e| e.to_string())?
                            }
                            RedisConn::Cluster(_) => return Err("WATCH/MULTI runs on one server".into()),
                        };
                        if done.is_some() {
                            if self.kind == RedisKind::WatchSubKeys {
                                q(c, redis::cmd("DECR").arg(format!("{}:parent", self.prefix))).await?;
                            }
                            return Ok(true);
                        }
                    }
                    Err("WATCH collision 3 times".into())
                }
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The engine's reserve path against the raw script call.

/// Raw EVALSHA of `reserve.lua` (own bucket) with the arguments the engine would pass.
pub struct RawReserve {
    pub conn: RedisConn,
    pub plan: StockPlan,
    pub next: AtomicU64,
}

/// `PurchaseService::purchase` with the same Redis, publishing to an in-process bus (so that what
/// is compared is the engine's reserve path, not Kafka).
pub struct ServiceReserve<B: OrderBus> {
    pub service: crate::service::PurchaseService<ScriptedStockCache<RedisConn>, B>,
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
                    &crate::ports::Intent::FIRST,
                    crate::ports::WarmFrom::Plan,
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
            let a = self.plan.activity;
            let b = self.plan.route(UserId(user));
            let keys = [
                crate::adapters::script::stock_key(a, b),
                crate::adapters::script::buyers_key(a, b),
                crate::adapters::script::resv_key(a, b),
                crate::adapters::script::gate_key(a, b),
            ];
            let id = ReservationId(self.next.fetch_add(1, Ordering::Relaxed) as u128);
            let args = [
                "own".to_string(),
                user.to_string(),
                "1".into(),
                id.to_string(),
                "1".into(),
                b.to_string(),
                "0".into(),
            ];
            match self
                .conn
                .eval_sha(Script::Reserve.sha1(), &keys, &args)
                .await
                .map_err(|e| e.to_string())?
            {
                Reply::Array(items) => Ok(matches!(items.first(), Some(Reply::Bulk(t)) if t == b"reserved")),
                other => Err(format!("{other:?}")),
            }
        })
    }
}

impl<B: OrderBus> Strategy for ServiceReserve<B> {
    fn name(&self) -> String {
        crate::capacity::BENCH_APP.into()
    }

    fn setup(&self, _stock: u64) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let plan = StockPlan::new(&self.activity);
            let intent = crate::ports::Intent::FIRST;
            self.cache
                .warmup(&plan, &intent, crate::ports::WarmFrom::Plan)
                .await
                .map_err(|e| e.to_string())?;
            self.service.load_activity(&crate::ports::Registered {
                activity: self.activity.clone(),
                intent,
            });
            Ok(())
        })
    }

    fn attempt(&self, _worker: usize, user: u64) -> BoxFuture<'_, Attempt> {
        Box::pin(async move {
            match self.service.purchase(self.activity.id(), UserId(user), 1).await {
                Ok(crate::service::PurchaseOutcome::Queued(_)) => Ok(true),
                Ok(crate::service::PurchaseOutcome::SoldOut) => Ok(false),
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
) -> Result<(f64, u64), String> {
    let source = bus.subscribe(group).await.map_err(|e| e.to_string())?;
    let mut consumer = crate::service::OrderConsumer::new(ledger.clone(), cache.clone(), source, max_batch);
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let started = tokio::time::Instant::now();
    let mut applied = 0u64;
    while applied < orders {
        let t = tokio::time::Instant::now();
        let r = consumer.run_once().await.map_err(|e| e.to_string())?;
        if r.delivered > 0 {
            let _ = h.record(t.elapsed().as_micros().max(1) as u64);
        }
        applied += r.delivered;
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("only {applied} of {orders} applied in 300 s"));
        }
    }
    Ok((
        applied as f64 / started.elapsed().as_secs_f64(),
        h.value_at_quantile(0.99),
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
pub fn write_csv(rows: &[Row], path: &std::path::Path) -> Result<(), String> {
    let mut w = csv::Writer::from_path(path).map_err(|e| e.to_string())?;
    for r in rows {
        let rounded = Row {
            ops_per_sec: (r.ops_per_sec * 10.0).round() / 10.0,
            ratio: (r.ratio * 10_000.0).round() / 10_000.0,
            ..r.clone()
        };
        w.serialize(rounded).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
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
            "name,ops,ops_per_sec,p50_us,p99_us,ratio,errors,oversold"
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
