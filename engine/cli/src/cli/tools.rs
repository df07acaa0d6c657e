//! The operator commands that work on the real stores: `migrate`, `audit`, `reconcile`.
//! Exit codes: 0 all good, 1 an invariant is violated (or the reconciler found a difference it
//! cannot explain), 2 the command could not run (bad settings, a store unreachable).

use anyhow::Context;
use seckill_core::domain::{ActivityId, StockPlan};
use seckill_core::jobs::{self, ReconcileConfig};
use seckill_core::ports::Ledger;
use seckill_core::service::audit;
use seckill_invariants::Invariant;
use seckill_stores::backend::{RealBackend, RealSettings};
use seckill_stores::mysql::{MysqlConfig, MysqlLedger};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

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
pub async fn connect() -> anyhow::Result<RealBackend> {
    let settings = RealSettings::from_env()?.context(
        "no stores configured: set REDIS_URL, KAFKA_BROKERS and DATABASE_URL (ci/services.sh writes them)",
    )?;
    Ok(RealBackend::connect(&settings).await?)
}

/// Run `f` on a fresh current-thread runtime; an `Err` is printed and exits 2.
fn run(f: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    match runtime() {
        Ok(rt) => run_on(rt, f),
        Err(code) => code,
    }
}

pub fn run_on(
    runtime: tokio::runtime::Runtime,
    f: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> ExitCode {
    match runtime.block_on(f) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}

/// An error and its causes on one line, as `{:#}` prints them, but for a cause whose text the
/// line already ends with (a store's error keeps its client's error as its source and quotes it).
pub fn chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

pub fn migrate() -> ExitCode {
    run(async {
        let url = std::env::var("DATABASE_URL").context("DATABASE_URL: not set")?;
        let ledger = MysqlLedger::connect_lazy(&MysqlConfig::new(&url))?;
        ledger.migrate().await?;
        println!("migrations applied");
        Ok(ExitCode::SUCCESS)
    })
}

async fn load(real: &RealBackend, id: ActivityId) -> anyhow::Result<StockPlan> {
    let activity = real
        .ledger
        .activity(id)
        .await?
        .with_context(|| format!("--activity: activity {id} is not installed in the ledger"))?;
    Ok(StockPlan::new(&activity))
}

pub fn audit(id: u64, json: bool) -> ExitCode {
    run(async move {
        let real = connect().await?;
        let plan = load(&real, ActivityId(id)).await?;
        let audit = audit::audit(&real.cache, &real.ledger, &real.bus, &plan).await?;
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
        .await?;
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

#[cfg(test)]
mod tests {
    use super::chain;
    use anyhow::Context;
    use seckill_core::ports::PortError;

    #[test]
    fn an_error_prints_with_its_causes_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = Err::<(), _>(PortError::determinate_from("redis connect", refused))
            .context("audit")
            .unwrap_err();
        assert_eq!(
            chain(&e),
            "audit: redis connect did not happen: connection refused"
        );
        let e = Err::<(), _>(std::io::Error::other("address in use"))
            .context("listen 127.0.0.1:8080")
            .unwrap_err();
        assert_eq!(chain(&e), "listen 127.0.0.1:8080: address in use");
    }
}
