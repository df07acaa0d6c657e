//! The operator commands that work on the real stores: `migrate`, `audit`, `reconcile`.
//! Exit codes: 0 all good, 1 an invariant is violated (or the reconciler found a difference it
//! cannot explain), 2 the command could not run (bad settings, a store unreachable).

use crate::adapters::mysql::{MysqlConfig, MysqlLedger};
use crate::backend::{RealBackend, RealSettings};
use crate::domain::{ActivityId, StockPlan};
use crate::jobs::{self, ReconcileConfig};
use crate::ports::{Ledger, OrderBus};
use crate::service::audit;
use seckill_invariants::Invariant;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    // One thread: the embedded stores serialize on their locks anyway (as Redis does), and a
    // current-thread scheduler makes a demo seed replay the same interleaving.
    built(tokio::runtime::Builder::new_current_thread().enable_all().build())
}

/// Every core: for the commands that serve or generate load.
pub fn runtime_multi() -> Result<tokio::runtime::Runtime, ExitCode> {
    built(tokio::runtime::Builder::new_multi_thread().enable_all().build())
}

fn built(rt: std::io::Result<tokio::runtime::Runtime>) -> Result<tokio::runtime::Runtime, ExitCode> {
    rt.map_err(|e| {
        eprintln!("error: cannot start the runtime: {e}");
        ExitCode::from(2)
    })
}

pub fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Connect to the stores the environment names (all three are required here).
pub async fn connect() -> Result<RealBackend, String> {
    let settings = RealSettings::from_env().map_err(|e| e.to_string())?.ok_or(
        "no stores configured: set REDIS_URL, KAFKA_BROKERS and DATABASE_URL (ci/services.sh writes them)",
    )?;
    RealBackend::connect(&settings).await.map_err(|e| e.to_string())
}

/// Run `f` on a fresh current-thread runtime; an `Err` is printed and exits 2.
fn run(f: impl std::future::Future<Output = Result<ExitCode, String>>) -> ExitCode {
    match runtime() {
        Ok(rt) => run_on(rt, f),
        Err(code) => code,
    }
}

fn run_on(
    runtime: tokio::runtime::Runtime,
    f: impl std::future::Future<Output = Result<ExitCode, String>>,
) -> ExitCode {
    match runtime.block_on(f) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

pub fn migrate() -> ExitCode {
    run(async {
        let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL: not set".to_string())?;
        let ledger = MysqlLedger::connect_lazy(&MysqlConfig::new(&url)).map_err(|e| e.to_string())?;
        ledger.migrate().await.map_err(|e| e.to_string())?;
        println!("migrations applied");
        Ok(ExitCode::SUCCESS)
    })
}

async fn load(real: &RealBackend, id: ActivityId) -> Result<StockPlan, String> {
    let activity = real
        .ledger
        .activity(id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("--activity: activity {id} is not installed in the ledger"))?;
    Ok(StockPlan::new(&activity))
}

pub fn audit(id: u64, json: bool) -> ExitCode {
    run(async move {
        let real = connect().await?;
        let plan = load(&real, ActivityId(id)).await?;
        let audit = audit::audit(&real.cache, &real.ledger, &real.bus, &plan)
            .await
            .map_err(|e| e.to_string())?;
        let (lag, quiescent, violations) = (audit.consumer_lag, audit.r1_checked, &audit.violations);
        let checked: Vec<Invariant> = [
            Invariant::S1NoOversell,
            Invariant::S2OneOrderPerUser,
            Invariant::S3RedisNonNegative,
        ]
        .into_iter()
        .chain(quiescent.then_some(Invariant::R1Reconciled))
        .collect();
        if json {
            let value = serde_json::json!({
                "activity": id,
                "consumer_lag": lag,
                "transfers_in_flight": audit.transfers_in_flight,
                "cancels_in_flight": audit.cancels_in_flight,
                "open_reservations": audit.open_reservations,
                "checked": checked.iter().map(|i| i.code()).collect::<Vec<_>>(),
                "violations": violations,
                "verdict": audit.verdict(),
            });
            println!("{value}");
        } else {
            println!(
                "activity {id}: {} units in {} buckets + fallback, {} orders, consumer lag {lag}",
                plan.total_stock,
                plan.buckets(),
                audit.snapshot.orders.len()
            );
            for i in &checked {
                let broken: Vec<_> = violations.iter().filter(|v| v.invariant == *i).collect();
                println!(
                    "{:<34} {}",
                    i.to_string(),
                    if broken.is_empty() { "ok" } else { "VIOLATED" }
                );
                for v in broken {
                    println!("  {v}");
                }
            }
            if !quiescent {
                println!(
                    "{:<34} not checked: {lag} records not yet applied, {} transfers and {} cancels half-way",
                    Invariant::R1Reconciled.to_string(),
                    audit.transfers_in_flight,
                    audit.cancels_in_flight
                );
            }
            println!("invariants: {}", audit.verdict());
        }
        Ok(if violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

pub fn reconcile(id: u64, json: bool) -> ExitCode {
    run(async move {
        let real = connect().await?;
        let plan = load(&real, ActivityId(id)).await?;
        let r = jobs::reconcile(
            &real.cache,
            &real.ledger,
            &real.bus,
            &plan,
            wall_now_ms(),
            &ReconcileConfig::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        if json {
            let mut value = serde_json::to_value(&r).expect("plain data");
            value["activity"] = serde_json::json!(id);
            println!("{value}");
        } else if r.skipped {
            println!(
                "activity {id}: skipped (Redis lost the activity or it is recovering: the recovery job's)"
            );
        } else {
            println!(
                "activity {id}: settled {}, failed orders' users freed {}, republished {}, pending marks kept {} / cleared {}, cancels released {}, transfers finished {}, gates given the registry's intent {}, failed {}",
                r.settled, r.failed_freed, r.republished, r.pending_kept, r.pending_cleared, r.cancels_released, r.transfers_finished, r.gates_resynced, r.failed
            );
            for d in &r.differences {
                println!("difference: {d}");
            }
        }
        Ok(if r.differences.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

/// With real stores, every secret must be one somebody chose (`config::placeholder`): the
/// example environment file and the documentation's values are refused by name, the stores' URL
/// passwords included.
fn refuse_placeholders(cfg: &crate::api::config::ServeConfig, s: &RealSettings) -> Result<(), String> {
    use crate::api::config::{placeholder, JwtKeys};
    let url_password = |u: &str| {
        url::Url::parse(u)
            .ok()
            .and_then(|u| u.password().map(str::to_string))
    };
    let (db, redis) = (
        url_password(&s.mysql.url),
        s.redis.urls.iter().map(|u| url_password(u)).collect::<Vec<_>>(),
    );
    let jwt = match &cfg.jwt {
        Some(JwtKeys::Secret(secret)) => Some(&**secret),
        _ => None,
    };
    let mut secrets: Vec<(&str, Option<&str>)> = vec![
        ("admin_token (SECKILL_ADMIN_TOKEN)", cfg.admin_token.as_deref()),
        ("token_secret (SECKILL_TOKEN_SECRET)", cfg.token_secret.as_deref()),
        ("jwt_secret (SECKILL_JWT_SECRET)", jwt),
        (
            "payment_secret (SECKILL_PAYMENT_SECRET)",
            cfg.payment_secret.as_deref(),
        ),
        (
            "payment_secret_previous (SECKILL_PAYMENT_SECRET_PREVIOUS)",
            cfg.payment_secret_previous.as_deref(),
        ),
        ("DATABASE_URL's password", db.as_deref()),
    ];
    secrets.extend(redis.iter().map(|p| ("REDIS_URL's password", p.as_deref())));
    if let Some(sasl) = &s.kafka.security.sasl {
        secrets.push(("SECKILL_KAFKA_SASL_PASSWORD", Some(&*sasl.password)));
    }
    for (what, secret) in secrets {
        if let Some(why) = secret.and_then(placeholder) {
            return Err(format!(
                "{what}: {why}: with real stores every secret must be one you chose (e.g. `openssl rand -hex 32`)"
            ));
        }
    }
    Ok(())
}

/// `seckill serve`: settings, stores, then the API until SIGTERM or Ctrl-C.
pub fn serve(
    config: Option<std::path::PathBuf>,
    listen: Option<std::net::SocketAddr>,
    admin_listen: Option<std::net::SocketAddr>,
    roles: Option<crate::roles::Roles>,
    check_config: bool,
) -> ExitCode {
    use crate::adapters::redis::RedisRateLimiter;
    use crate::api::config::ServeConfig;
    use crate::api::nonce::RedisNonces;
    use crate::api::serve::{self, Secrets, Stores};
    use crate::clock::Clock;
    use rand::SeedableRng;

    let text = match &config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: --config: cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let flags = crate::api::config::Flags {
        listen,
        admin_listen,
        roles,
    };
    let env = match crate::backend::lookup() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = match ServeConfig::load(text.as_deref(), &env, &flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SECKILL_LOG").unwrap_or_else(|_| "info".into()),
        )
        .try_init();
    let runtime = match runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    run_on(runtime, async move {
        let settings = RealSettings::from_lookup(|k| env(k).filter(|v| !v.trim().is_empty()))
            .map_err(|e| e.to_string())?;
        let mut rng = rand::rngs::StdRng::from_entropy();
        // What is allowed but said loudly: printed by --check-config, logged at warn at start.
        let mut warnings = Vec::new();
        if settings.is_some() {
            // Many processes share one sale: each must verify what another issued, and no
            // process may invent its own keys.
            for (missing, what) in [
                (cfg.token_secret.is_none(), "token_secret (SECKILL_TOKEN_SECRET)"),
                (cfg.admin_token.is_none(), "admin_token (SECKILL_ADMIN_TOKEN)"),
                (
                    cfg.jwt.is_none(),
                    "jwt_secret or jwt_jwks_file (SECKILL_JWT_SECRET / SECKILL_JWT_JWKS_FILE)",
                ),
                // Without it, a JWT the login service issued for another of the shop's services
                // (signed with the same key) buys here as its user.
                (
                    cfg.jwt_audience.is_none(),
                    "jwt_audience (SECKILL_JWT_AUDIENCE), the `aud` the login service puts in this engine's JWTs",
                ),
            ] {
                if missing {
                    return Err(format!("{what}: required with real stores"));
                }
            }
            if let Some(s) = &settings {
                refuse_placeholders(&cfg, s)?;
                if let Some(why) = crate::backend::ledger_tls_unverified(&s.mysql.url) {
                    let var = crate::backend::ALLOW_UNVERIFIED_LEDGER;
                    match env(var).as_deref().map(str::trim) {
                        Some("1") => warnings.push(format!(
                            "DATABASE_URL: {why}; accepted because {var}=1: whoever is on the path to \
                             the ledger can read and rewrite it"
                        )),
                        None | Some("0") => {
                            return Err(format!(
                                "DATABASE_URL: {why}: anyone on the path could read and rewrite the ledger \
                                 (an order set to paid). Add ssl-mode=verify_identity (and ssl-ca=<the CA's \
                                 PEM file> unless the system's roots sign the server's certificate), or set \
                                 {var}=1 to accept an unverified connection (logged at every start)"
                            ))
                        }
                        Some(other) => return Err(format!("{var}: must be 1 or 0, got {other:?}")),
                    }
                }
            }
            let delivery = settings
                .as_ref()
                .map_or(Duration::ZERO, |s| s.kafka.message_timeout);
            if cfg.request_timeout <= delivery {
                return Err(format!(
                    "request_timeout_ms: {} ms is not longer than the order bus's delivery timeout ({} ms): \
                     a slow bus would answer \"outcome unknown\" instead of \"queued\"",
                    cfg.request_timeout.as_millis(),
                    delivery.as_millis()
                ));
            }
        }
        warnings.extend(cfg.warnings());
        for warning in warnings {
            if check_config {
                println!("warning: {warning}");
            } else {
                tracing::warn!("{warning}");
            }
        }
        if check_config {
            println!(
                "configuration ok: roles {}, listen {}, admin listen {}, stores {}",
                cfg.roles,
                cfg.listen,
                cfg.admin_listen,
                match &settings {
                    Some(s) => format!(
                        "real (redis: {} node(s){}{}, kafka {} ({}) topic {} x{} partitions, replication {}, mysql{})",
                        s.redis.urls.len(),
                        if s.redis.cluster { ", cluster" } else { "" },
                        if s.redis.tls.is_some() { ", tls" } else { "" },
                        s.kafka.brokers,
                        s.kafka.security.protocol(),
                        s.kafka.topic,
                        s.kafka.partitions,
                        s.kafka.replication,
                        if s.mysql.url.contains("ssl-mode=") { " (ssl-mode in its URL)" } else { "" }
                    ),
                    None => "embedded (not durable)".to_string(),
                }
            );
            return Ok(ExitCode::SUCCESS);
        }
        if settings.is_none() && cfg.jwt.is_none() {
            let path = crate::api::identity::dev_secret_path();
            let secret = crate::api::identity::dev_secret(&mut rng)?;
            eprintln!(
                "no jwt_secret: user JWTs are checked with the development key in {} \
                 (mint one with `seckill jwt --user N`; never in production)",
                path.display()
            );
            cfg.jwt = Some(crate::api::config::JwtKeys::Secret(secret.into()));
        }
        let secrets = Secrets::resolve(&cfg, &mut rng);
        if cfg.admin_token.is_none() {
            eprintln!("admin token for this process: {}", secrets.admin_token);
        }
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| format!("listen {}: {e}", cfg.listen))?;
        let admin = tokio::net::TcpListener::bind(cfg.admin_listen)
            .await
            .map_err(|e| format!("admin_listen {}: {e}", cfg.admin_listen))?;
        let clock = Clock::new(wall_now_ms(), tokio::time::Instant::now());
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| e.to_string())?;
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            Ok::<(), String>(())
        };
        match settings {
            None => {
                tracing::warn!("no store settings: serving on the embedded stores (in memory, not durable)");
                let stores = Stores::embedded();
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng)?;
                let running = serve::start(api, listener, admin, &mut rng).await?;
                tracing::info!(addr = %running.addr, admin = %running.admin_addr, "listening");
                shutdown.await?;
                running.shutdown().await.map_err(|e| e.to_string())?;
            }
            Some(s) => {
                let real = RealBackend::connect(&s).await.map_err(|e| e.to_string())?;
                let nonces = RedisNonces::new(real.cache.conn().clone());
                let limiter = RedisRateLimiter::new(real.cache.conn().clone());
                let bus = real.bus.clone();
                let stores = Stores {
                    cache: real.cache,
                    bus: real.bus,
                    ledger: real.ledger,
                    nonces,
                    limiter: Some(limiter),
                };
                let pool = stores.ledger.pool().clone();
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng)?;
                let running = serve::start(api, listener, admin, &mut rng).await?;
                tracing::info!(addr = %running.addr, admin = %running.admin_addr, roles = %cfg.roles, "listening on the real stores");
                let gauges = tokio::spawn(async move {
                    loop {
                        metrics::gauge!("seckill_ledger_pool_connections").set(pool.size() as f64);
                        metrics::gauge!("seckill_ledger_pool_idle").set(pool.num_idle() as f64);
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                });
                shutdown.await?;
                running.shutdown().await.map_err(|e| e.to_string())?;
                gauges.abort();
                bus.flush().await.map_err(|e| e.to_string())?;
            }
        }
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

pub struct BenchOptions {
    pub duration: std::time::Duration,
    pub concurrency: usize,
    pub orders: u64,
    pub only: Option<String>,
    pub json: bool,
    pub csv: Option<std::path::PathBuf>,
    pub plot: Option<std::path::PathBuf>,
}

/// `seckill bench`: every strategy on the real stores, one table.
pub fn bench(opts: BenchOptions) -> ExitCode {
    use crate::adapters::redis::{RedisConfig, RedisConn};
    use crate::cli::bench::{self, MysqlKind, RedisKind, Row, Strategy};
    use std::sync::Arc;

    let runtime = match runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    run_on(runtime, async move {
        let settings = RealSettings::from_env()
            .map_err(|e| e.to_string())?
            .ok_or("bench needs the real stores: set REDIS_URL, KAFKA_BROKERS and DATABASE_URL")?;
        let real = RealBackend::connect(&settings).await.map_err(|e| e.to_string())?;
        let run = wall_now_ms();
        let wanted = |name: &str| opts.only.as_ref().is_none_or(|o| name.contains(o.as_str()));
        let conns = |cfg: RedisConfig, n: usize| async move {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(RedisConn::connect(&cfg).await.map_err(|e| e.to_string())?);
            }
            Ok::<_, String>(v)
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
            rows.push(bench::measure(s, opts.duration, opts.concurrency).await?);
            bar.inc(1);
        }
        // The engine's reserve path against the raw script: fresh activities, ample stock.
        let engine_pair: [Arc<dyn Strategy>; 2] = [
            Arc::new(bench::RawReserve {
                conn: single[0].clone(),
                plan: crate::domain::StockPlan::new(&bench::bench_activity(run, 1_000_000_000)),
                next: std::sync::atomic::AtomicU64::new(1),
            }),
            {
                let activity = bench::bench_activity(run + 1, 1_000_000_000);
                let cache = crate::adapters::script::ScriptedStockCache::new(single[0].clone());
                let bus = crate::adapters::embedded::EmbeddedBus::new(6, usize::MAX >> 1);
                let clock = crate::clock::Clock::new(wall_now_ms(), tokio::time::Instant::now());
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(run);
                let service = crate::service::PurchaseService::new(
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
        for s in engine_pair.into_iter().filter(|s| wanted(&s.name())) {
            bar.set_message(s.name());
            let mut row = bench::measure_throughput(s, opts.duration, opts.concurrency).await?;
            row.oversold = None;
            rows.push(row);
            bar.inc(1);
        }
        // The consumer, batched against one transaction per order, on orders published for it.
        for (max_batch, name) in [
            (
                crate::service::consumer::DEFAULT_MAX_BATCH,
                crate::capacity::BENCH_DB,
            ),
            (1, "engine: consumer Kafka -> MariaDB, one transaction per order"),
        ] {
            if !wanted(name) {
                continue;
            }
            bar.set_message(name);
            let id = run + 2 + max_batch as u64;
            let activity = bench::bench_activity(id, 1_000_000_000);
            let plan = crate::domain::StockPlan::new(&activity);
            real.ledger
                .install(&activity, &plan)
                .await
                .map_err(|e| e.to_string())?;
            for i in 0..opts.orders {
                let user = crate::domain::UserId(i + 1);
                let r = crate::domain::Reservation {
                    id: crate::domain::ReservationId(((id as u128) << 64) | i as u128),
                    activity: activity.id(),
                    user,
                    bucket: plan.route(user),
                    qty: 1,
                    reserved_at_ms: wall_now_ms(),
                    generation: 0,
                };
                real.bus.publish(&r).await.map_err(|e| e.to_string())?;
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
            rows.push(Row {
                name: name.into(),
                ops: opts.orders,
                ops_per_sec: ops,
                p50_us: 0,
                p99_us: p99,
                ratio: 0.0,
                errors: 0,
                oversold: None,
            });
            bar.inc(1);
        }
        bar.finish_and_clear();
        let rows = bench::with_ratios(rows);
        if let Some(path) = &opts.csv {
            bench::write_csv(&rows, path).map_err(|e| format!("--csv {}: {e}", path.display()))?;
        }
        if let Some(path) = &opts.plot {
            bench::plot(&rows, path).map_err(|e| format!("--plot {}: {e}", path.display()))?;
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
            println!(
                "{:<62} {:>11} {:>10} {:>10} {:>8} {:>7} {:>8}",
                "strategy", "ops/s", "p50 us", "p99 us", "ratio", "errors", "oversold"
            );
            for r in &rows {
                println!(
                    "{:<62} {:>11.0} {:>10} {:>10} {:>8.3} {:>7} {:>8}",
                    r.name,
                    r.ops_per_sec,
                    r.p50_us,
                    r.p99_us,
                    r.ratio,
                    r.errors,
                    r.oversold.map_or("-".to_string(), |o| o.to_string())
                );
            }
            let find = |n: &str| rows.iter().find(|r| r.name == n).map(|r| r.ops_per_sec);
            if let (Some(svc), Some(raw)) = (
                find(crate::capacity::BENCH_APP),
                find("engine: raw EVALSHA reserve.lua"),
            ) {
                println!(
                    "engine reserve path / raw EVALSHA: {:.2} (goal >= 0.80)",
                    svc / raw
                );
            }
            if let (Some(b), Some(one)) = (
                find(crate::capacity::BENCH_DB),
                find("engine: consumer Kafka -> MariaDB, one transaction per order"),
            ) {
                println!(
                    "consumer batched / one transaction per order: {:.1}x (goal >= 20x)",
                    b / one
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
