//! The operator commands that work on the real stores: `migrate`, `audit`, `reconcile`.
//! Exit codes: 0 all good, 1 an invariant is violated (or the reconciler found a difference it
//! cannot explain), 2 the command could not run (bad settings, a store unreachable).

use crate::adapters::mysql::{MysqlConfig, MysqlLedger};
use crate::backend::{RealBackend, RealSettings, ORDER_GROUP};
use crate::domain::{ActivityId, StockPlan};
use crate::jobs::{self, ReconcileConfig};
use crate::ports::{Ledger, OrderBus};
use crate::service::audit;
use seckill_invariants::{self as inv, Invariant};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    // One thread: the embedded stores serialize on their locks anyway (as Redis does), and a
    // current-thread scheduler makes a demo seed replay the same interleaving.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
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
        let lag = real.bus.lag(ORDER_GROUP).await.map_err(|e| e.to_string())?;
        let snap = audit::snapshot(&real.cache, &real.ledger, &plan)
            .await
            .map_err(|e| e.to_string())?;
        // R1 only holds at rest: while the consumer group has records to apply, Redis is ahead.
        let quiescent = lag == 0;
        let violations = audit::check(&snap, quiescent);
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
                "checked": checked.iter().map(|i| i.code()).collect::<Vec<_>>(),
                "violations": violations,
                "verdict": inv::verdict(&violations),
            });
            println!("{value}");
        } else {
            println!(
                "activity {id}: {} units in {} buckets + fallback, {} orders, consumer lag {lag}",
                plan.total_stock,
                plan.buckets(),
                snap.orders.len()
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
                    "{:<34} not checked: {lag} records not yet applied",
                    Invariant::R1Reconciled.to_string()
                );
            }
            println!("invariants: {}", inv::verdict(&violations));
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
            let value = serde_json::json!({
                "activity": id,
                "skipped": r.skipped,
                "settled": r.settled,
                "republished": r.republished,
                "pending_kept": r.pending_kept,
                "pending_cleared": r.pending_cleared,
                "cancels_released": r.cancels_released,
                "transfers_finished": r.transfers_finished,
                "failed": r.failed,
                "differences": r.differences.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            });
            println!("{value}");
        } else if r.skipped {
            println!(
                "activity {id}: skipped (Redis lost the activity or it is recovering: the recovery job's)"
            );
        } else {
            println!(
                "activity {id}: settled {}, republished {}, pending marks kept {} / cleared {}, cancels released {}, transfers finished {}, failed {}",
                r.settled, r.republished, r.pending_kept, r.pending_cleared, r.cancels_released, r.transfers_finished, r.failed
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

/// `seckill serve`: settings, stores, then the API until SIGTERM or Ctrl-C.
pub fn serve(config: Option<std::path::PathBuf>, listen: Option<std::net::SocketAddr>) -> ExitCode {
    use crate::api::config::ServeConfig;
    use crate::api::nonce::{EmbeddedNonces, RedisNonces};
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
    let mut cfg = match ServeConfig::load(text.as_deref(), |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = listen {
        cfg.listen = addr;
    }
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SECKILL_LOG").unwrap_or_else(|_| "info".into()),
        )
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    run_on(runtime, async move {
        let settings = RealSettings::from_env().map_err(|e| e.to_string())?;
        if settings.is_some() && cfg.token_secret.is_none() {
            return Err(
                "token_secret (SECKILL_TOKEN_SECRET): required with real stores, so that every engine \
                        verifies every token"
                    .into(),
            );
        }
        let mut rng = rand::rngs::StdRng::from_entropy();
        let secrets = Secrets::resolve(&cfg, &mut rng);
        if cfg.admin_token.is_none() {
            eprintln!("admin token for this process: {}", secrets.admin_token);
        }
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| format!("listen {}: {e}", cfg.listen))?;
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
                let b = crate::adapters::embedded::EmbeddedBackend::new();
                let stores = Stores {
                    cache: b.cache,
                    bus: b.bus,
                    ledger: b.ledger,
                    nonces: EmbeddedNonces::default(),
                };
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng)?;
                let running = serve::start(api, listener, cfg.run_consumer).await?;
                tracing::info!(addr = %running.addr, "listening");
                shutdown.await?;
                running.shutdown().await.map_err(|e| e.to_string())?;
            }
            Some(s) => {
                let real = RealBackend::connect(&s).await.map_err(|e| e.to_string())?;
                let nonces = RedisNonces::new(real.cache.conn().clone());
                let bus = real.bus.clone();
                let stores = Stores {
                    cache: real.cache,
                    bus: real.bus,
                    ledger: real.ledger,
                    nonces,
                };
                let pool = stores.ledger.pool().clone();
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng)?;
                let running = serve::start(api, listener, cfg.run_consumer).await?;
                tracing::info!(addr = %running.addr, "listening on the real stores");
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
