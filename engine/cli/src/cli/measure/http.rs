//! `seckill bench`'s HTTP rows: the purchase route against hello world (`GET /healthz`) on the
//! same server, loaded by the same generator (`seckill load`'s) over the same connections, one
//! right after the other — on a server of the embedded stores (the funnel's own cost) and on one
//! of the real stores (what a deployment pays in Redis, Kafka and MariaDB besides).
//!
//! A click is two requests (a token, then the purchase with it); every row counts requests per
//! second, so a route is compared with hello world request for request. A row's errors are
//! requests with no answer and answers other than the route's success (200 for hello world,
//! 202 for a purchase, 410 for the sold-out row — or 409 for its buyers): a rate limit or a 503
//! in a row means it did not measure what it says.

use super::bench::Row;
use super::load::{self, LoadConfig, LoadReport, Target};
use super::procs::{Settings, AUDIENCE};
use std::time::Duration;

pub const HEALTHZ: &str = "http: GET /healthz, embedded stores";
pub const PURCHASE: &str = "http: token + purchase, embedded stores";
pub const SOLD_OUT: &str = "http: token, sold out, embedded stores";
pub const HEALTHZ_REAL: &str = "http: GET /healthz, Redis + Kafka + MariaDB";
pub const PURCHASE_REAL: &str = "http: token + purchase, Redis + Kafka + MariaDB";
pub const NAMES: [&str; 5] = [HEALTHZ, SOLD_OUT, PURCHASE, HEALTHZ_REAL, PURCHASE_REAL];

/// Connections the generator keeps to the server (BENCHMARKS.md's HTTP method).
const CONNECTIONS: usize = 64;
/// Users each run may click for: more than a run of `duration` gets through, so the duration ends
/// every run.
const USERS: u64 = 1_000_000;
/// Buckets of the sales the purchase rows load.
const BUCKETS: u32 = 64;

/// The worker's own figure beside the real stores' purchase row when instructions are counted:
/// the worker runs in a process of its own there (its instructions per order applied).
pub const APPLY_REAL: &str = "http: worker, order applied, Redis + Kafka + MariaDB";

/// How the rows measure: requests per second for `duration`, or — `Count` — instructions per
/// request of the server (valgrind's callgrind, `clicks` users clicking once each), a figure
/// the noise of a shared box does not move.
#[derive(Clone, Copy)]
pub enum Measure {
    Time(Duration),
    Count { clicks: u64 },
}

/// The HTTP rows `wanted` asks for; `stores` are the real stores' settings, `run` this bench
/// run's id (its sales' ids on the real stores start from it).
pub async fn rows(
    stores: Vec<(String, String)>,
    run: u64,
    measure: Measure,
    wanted: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let servers = [
        (Vec::new(), HEALTHZ, PURCHASE, Some(SOLD_OUT)),
        (stores, HEALTHZ_REAL, PURCHASE_REAL, None),
    ];
    // Each counted row's profile is kept there, named for the row.
    let counts = std::env::temp_dir().join(format!("seckill-bench-{run}"));
    let profile = |row: &str| {
        let name: String = row
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        counts.join(format!("{name}.callgrind"))
    };
    let (duration, users) = match measure {
        Measure::Time(d) => (d, USERS),
        // The clicks end every run, however slowly the counted server answers.
        Measure::Count { clicks } => (Duration::from_secs(3_600), clicks),
    };
    for (i, (stores, healthz, purchase, sold_out)) in servers.into_iter().enumerate() {
        if ![healthz, purchase].into_iter().chain(sold_out).any(&wanted) {
            continue;
        }
        let real = !stores.is_empty();
        let settings = Settings::new(stores, run)?;
        let unlimited = super::procs::unlimited();
        let counting = matches!(measure, Measure::Count { .. });
        // Counted on the real stores, the API and the worker run apart so that each has a
        // figure of its own, and the jobs apart from both (not counted: their passes over every
        // sale the database holds would be most of an idle API process's count). The embedded
        // stores live in one process: every role there.
        let dir = counts.join(i.to_string());
        let (server, worker, _jobs) = match (counting, real) {
            (false, _) => (settings.spawn("api,worker,jobs", &unlimited)?, None, None),
            (true, false) => (
                settings.spawn_counted(&dir, "api,worker,jobs", &unlimited)?,
                None,
                None,
            ),
            (true, true) => (
                settings.spawn_counted(&dir.join("api"), "api", &unlimited)?,
                Some(settings.spawn_counted(&dir.join("worker"), "worker", &unlimited)?),
                Some(settings.spawn("jobs", &unlimited)?),
            ),
        };
        settings.ready(&server).await?;
        if let Some(w) = &worker {
            settings.ready(w).await?;
        }
        let api = std::slice::from_ref(&server);
        let cfg = |activity: u64, users: u64, target: Target| LoadConfig {
            addrs: vec![server.public],
            activity,
            users,
            connections: CONNECTIONS,
            rate: 0,
            duration,
            skew: 0.0,
            clicks_per_user: 1,
            seed: run,
            target,
            jwt_secret: settings.jwt_secret.clone(),
            jwt_issuer: None,
            jwt_audience: Some(AUDIENCE.to_string()),
            jwts: None,
        };
        // One measured load: its report, and the server's instructions over it when counted —
        // less what the server runs idle meanwhile (its timers: the registry's refresh, the
        // jobs, metrics), which a slow counted run would otherwise spread over its requests.
        let measured = |name: &str, c: LoadConfig| {
            let (server, keep) = (&server, profile(name));
            async move {
                if !counting {
                    return anyhow::Ok((load::run(&c, || {}).await?, None));
                }
                let idle = server.idle_rate().await?;
                server.count_from()?;
                let started = std::time::Instant::now();
                let r = load::run(&c, || {}).await?;
                let n = server.counted(Some(&keep))?;
                let upkeep = idle * started.elapsed().as_secs_f64();
                anyhow::Ok((r, Some(n.saturating_sub(upkeep as u64))))
            }
        };
        if wanted(healthz) {
            let (r, n) = measured(healthz, cfg(0, users, Target::Healthz)).await?;
            rows.push(row(healthz, &r, r.by_status.get(&200).copied(), n));
        }
        // Ids as `load --stages` makes them: distinct from earlier runs' on the same stores.
        let mut next_id = (run % 1_000_000_000) * 10;
        let mut sale = |stock| {
            next_id += 1;
            let id = next_id;
            let settings = &settings;
            async move { settings.sale(api, id, stock, BUCKETS).await.map(|()| id) }
        };
        if let Some(name) = sold_out.filter(|n| wanted(n)) {
            // A small sale sold out first (not measured), then every click on it — before the
            // purchase row, whose orders the server's worker goes on applying after it.
            let id = sale(100).await?;
            let sell = LoadConfig {
                duration: Duration::from_secs(120).max(duration),
                ..cfg(id, 2_000, Target::Purchase)
            };
            load::run(&sell, || {}).await?;
            let (r, n) = measured(name, cfg(id, users, Target::Purchase)).await?;
            // Sold out is the answer either way: from memory at the token, or — once the
            // server's note that a bucket is empty has aged and it asks Redis again — at the
            // purchase; and "duplicate" there to the users (the first 2,000) who bought a unit.
            let sold_out = [
                r.tokens_refused.get(&410),
                r.by_status.get(&410),
                r.by_status.get(&409),
            ];
            rows.push(row(name, &r, Some(sold_out.into_iter().flatten().sum()), n));
        }
        if wanted(purchase) {
            let id = sale(users * 2).await?;
            if let Some(w) = &worker {
                w.count_from()?;
            }
            let (r, n) = measured(purchase, cfg(id, users, Target::Purchase)).await?;
            let queued = r.by_status.get(&202).copied();
            rows.push(row(purchase, &r, queued, n));
            if real {
                // Not timed: the worker applies what the row queued, so that the sale ends at
                // rest on the stores and the audit says so.
                let audit = settings.settle(api, id).await?;
                if audit["verdict"] != "ok" {
                    anyhow::bail!("{purchase}: the sale's audit after the row: {audit}");
                }
            }
            if let Some(w) = &worker {
                let applied = queued.unwrap_or(0);
                rows.push(Row {
                    instructions: Some(w.counted(Some(&profile(APPLY_REAL)))? / applied.max(1)),
                    ..Row::drained(APPLY_REAL, applied, 0.0, 0)
                });
            }
        }
    }
    if matches!(measure, Measure::Count { .. }) {
        eprintln!(
            "callgrind's profiles of the rows (callgrind_annotate FILE): {}",
            counts.display()
        );
    }
    Ok(rows)
}

/// A row of requests per second; `expected`: the answers that count as the route's success;
/// `instructions`: the server's over the row, if counted.
fn row(name: &str, r: &LoadReport, expected: Option<u64>, instructions: Option<u64>) -> Row {
    let answers = r.by_status.values().sum::<u64>() + r.tokens_refused.values().sum::<u64>();
    Row {
        name: name.to_string(),
        ops: r.requests,
        ops_per_sec: r.requests_per_sec,
        p50_us: r.latency_us_p50,
        p99_us: r.latency_us_p99,
        ratio: 0.0,
        errors: r.errors + answers - expected.unwrap_or(0),
        oversold: None,
        instructions: instructions.map(|n| n / r.requests.max(1)),
    }
}
