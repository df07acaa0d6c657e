//! One binary, three roles (DESIGN §11.1), each composed by one function that `seckill serve`
//! and the simulation both call — a simulated node is never assembled differently from a
//! production process.
//!
//! - `api`: the purchase core — `PurchaseService`, its activity refresher (every API process
//!   loads every registered activity and polls the registry), and the operator's operations.
//!   `serve` wraps it in HTTP; the simulation drives it over simulated RPC.
//! - `worker`: the order consumer (poll → apply → settle/release → commit).
//! - `jobs`: recovery, reconciler, payment timeout and rebalancer over every registered activity.
//!   Any number of processes may run it at once (§7).

use crate::clock::Clock;
use crate::domain::{Activity, ActivityId, ActivityState, StockPlan};
use crate::jobs::{self, RebalanceConfig, ReconcileConfig, ReconcileReport, Recovery, RecoveryConfig};
use crate::ports::{GateWrite, Intent, Ledger, OrderBus, PortResult, StockCache, Transfer};
use crate::service::admin::{self, AdminError, Warmed};
use crate::service::{OrderConsumer, PurchaseConfig, PurchaseService};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Which roles a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub api: bool,
    pub worker: bool,
    pub jobs: bool,
}

impl Roles {
    pub const ALL: Roles = Roles {
        api: true,
        worker: true,
        jobs: true,
    };

    /// `api,worker,jobs` or any non-empty subset, each named once.
    pub fn parse(s: &str) -> Result<Roles, String> {
        let mut roles = Roles {
            api: false,
            worker: false,
            jobs: false,
        };
        for name in s.split(',').map(str::trim) {
            let slot = match name {
                "api" => &mut roles.api,
                "worker" => &mut roles.worker,
                "jobs" => &mut roles.jobs,
                "" => return Err("empty role name (expected api, worker, jobs)".into()),
                other => return Err(format!("unknown role {other:?} (expected api, worker, jobs)")),
            };
            if std::mem::replace(slot, true) {
                return Err(format!("role {name:?} named twice"));
            }
        }
        Ok(roles)
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [(self.api, "api"), (self.worker, "worker"), (self.jobs, "jobs")]
            .into_iter()
            .filter_map(|(on, n)| on.then_some(n))
            .collect();
        f.write_str(&names.join(","))
    }
}

// ---------------------------------------------------------------------------------------------
// api

/// The purchase core of an API process.
pub struct ApiRole<C, B, L> {
    pub service: PurchaseService<C, B>,
    pub cache: C,
    pub bus: B,
    pub ledger: L,
    /// How a warmup of an installed activity recovers it.
    pub recovery: RecoveryConfig,
    /// Fences for the recoveries this process runs (seeded: a simulation replays them).
    fences: Mutex<StdRng>,
    /// The registry was loaded at least once (the role's readiness).
    loaded: AtomicBool,
}

/// Compose the `api` role. Nothing runs until `run_refresher` is spawned. The reservation ids
/// are drawn from a generator seeded with 256 bits of `rng` (DESIGN §12: the binary's `rng` is
/// seeded by the OS, the simulation's by its seed), not from a 64-bit seed: an id must not be
/// guessable from the few bits a seed of that size leaves.
pub fn api_role<C: StockCache, B: OrderBus, L: Ledger>(
    cache: C,
    bus: B,
    ledger: L,
    clock: Clock,
    purchase: PurchaseConfig,
    recovery: RecoveryConfig,
    rng: &mut impl RngCore,
) -> ApiRole<C, B, L> {
    ApiRole {
        service: PurchaseService::new(cache.clone(), bus.clone(), clock, purchase, &mut *rng),
        cache,
        bus,
        ledger,
        recovery,
        fences: Mutex::new(StdRng::seed_from_u64(rng.next_u64())),
        loaded: AtomicBool::new(false),
    }
}

impl<C: StockCache, B: OrderBus, L: Ledger> ApiRole<C, B, L> {
    /// Load every registered activity and its state now.
    pub async fn refresh(&self) -> PortResult<()> {
        let r = self.service.refresh(&self.ledger).await;
        if r.is_ok() {
            self.loaded.store(true, Ordering::Release);
        }
        r
    }

    /// Ready to serve: the registry has been loaded.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The refresher: every `every`, forever (spawn it beside the role).
    pub async fn run_refresher(&self, every: std::time::Duration) {
        loop {
            tokio::time::sleep(every).await;
            let (refreshed, _) = tokio::join!(self.refresh(), self.bus.probe());
            if let Err(e) = refreshed {
                metrics::counter!("seckill_refresh_errors_total").increment(1);
                tracing::debug!(error = %e, "activity refresh");
            }
        }
    }

    fn fence(&self) -> String {
        jobs::new_fence(&mut *self.fences.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Create (install and warm) an activity; idempotent with the same plan.
    pub async fn create(&self, activity: &Activity) -> Result<(bool, Warmed), AdminError> {
        let fence = self.fence();
        let out = admin::install_and_warm(
            &self.cache,
            &self.ledger,
            &self.bus,
            activity,
            &self.recovery,
            &fence,
        )
        .await?;
        let _ = self.refresh().await;
        Ok(out)
    }

    /// Warm an installed activity (recovering it if it may have orders, §11.2).
    pub async fn warmup(&self, id: ActivityId) -> Result<Warmed, AdminError> {
        let fence = self.fence();
        let out = admin::warmup(&self.cache, &self.ledger, &self.bus, id, &self.recovery, &fence).await?;
        let _ = self.refresh().await;
        Ok(out)
    }

    /// Pause, resume or close, for every process (see `admin::set_intent`).
    pub async fn set_intent(
        &self,
        id: ActivityId,
        state: ActivityState,
    ) -> Result<(Intent, Vec<GateWrite>), AdminError> {
        let out = admin::set_intent(&self.cache, &self.ledger, id, state).await?;
        let _ = self.refresh().await;
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// worker

/// Compose the `worker` role: join the consumer group. Run it with `OrderConsumer::run`.
pub async fn worker_role<C: StockCache, B: OrderBus, L: Ledger>(
    cache: C,
    bus: &B,
    ledger: L,
    group: &str,
    max_batch: usize,
) -> PortResult<OrderConsumer<L, C, B::Source>> {
    let source = bus.subscribe(group).await?;
    // Exported at zero: the alert on it reads a series that exists before the first failure.
    metrics::counter!("seckill_consumer_rewind_failures_total").increment(0);
    Ok(OrderConsumer::new(ledger, cache, source, max_batch))
}

// ---------------------------------------------------------------------------------------------
// jobs

#[derive(Debug, Clone)]
pub struct JobsConfig {
    pub recovery: RecoveryConfig,
    pub reconcile: ReconcileConfig,
    pub rebalance: RebalanceConfig,
}

/// The self-healing jobs of one process.
pub struct JobsRole<C, B, L> {
    pub cache: C,
    pub bus: B,
    pub ledger: L,
    pub clock: Clock,
    pub config: JobsConfig,
    /// This runner's random id: part of every transfer id it makes.
    runner: String,
    fences: Mutex<StdRng>,
}

/// What one pass over one activity did; each job's error is kept (and counted), not dropped.
#[derive(Debug)]
pub struct ActivityPass {
    pub activity: ActivityId,
    pub recovery: PortResult<Recovery>,
    pub reconcile: PortResult<ReconcileReport>,
    pub cancelled: PortResult<jobs::PayTimeoutReport>,
}

/// Compose the `jobs` role.
pub fn jobs_role<C: StockCache, B: OrderBus, L: Ledger>(
    cache: C,
    bus: B,
    ledger: L,
    clock: Clock,
    config: JobsConfig,
    rng: &mut impl RngCore,
) -> JobsRole<C, B, L> {
    JobsRole {
        cache,
        bus,
        ledger,
        clock,
        config,
        runner: format!("{:08x}", rng.next_u32()),
        fences: Mutex::new(StdRng::seed_from_u64(rng.next_u64())),
    }
}

/// Count and log a job's failure with its activity.
fn failed<T>(job: &'static str, activity: ActivityId, r: &PortResult<T>) {
    if let Err(e) = r {
        metrics::counter!("seckill_job_failures_total", "job_name" => job, "activity" => activity.to_string())
            .increment(1);
        tracing::warn!(job, activity = %activity, error = %e, "job failed");
    }
}

/// The jobs keep an activity this long after its last payment could have timed out (its window's
/// end plus the payment timeout): late settles, republishes and releases still happen; after
/// that nothing of it can change and the jobs leave it alone.
pub const FINISHED_AFTER_MS: u64 = 10 * 60 * 1000;

/// Activities worked on at once by one pass (one slow recovery must not hold the others).
const ACTIVITIES_IN_FLIGHT: usize = 8;

impl<C: StockCache, B: OrderBus, L: Ledger> JobsRole<C, B, L> {
    /// Every registered activity that is not finished (closed ones too: their payments still
    /// time out and Redis still reconciles).
    async fn plans(&self) -> PortResult<Vec<StockPlan>> {
        let rows = self.ledger.registered().await;
        failed("registry", ActivityId(0), &rows);
        let now = self.clock.now_ms();
        Ok(rows?
            .iter()
            .filter(|r| {
                let s = r.activity.spec();
                now < s
                    .end_ms
                    .saturating_add(s.pay_timeout_ms)
                    .saturating_add(FINISHED_AFTER_MS)
            })
            .map(|r| StockPlan::new(&r.activity))
            .collect())
    }

    /// Recovery if needed, a reconciler pass and the payment timeout, for every activity.
    pub async fn pass(&self) -> PortResult<Vec<ActivityPass>> {
        use futures::StreamExt;
        let plans = self.plans().await?;
        Ok(futures::stream::iter(plans)
            .map(|plan| {
                let span = tracing::debug_span!("jobs.pass", activity = %plan.activity);
                tracing::Instrument::instrument(self.activity_pass(plan), span)
            })
            .buffered(ACTIVITIES_IN_FLIGHT)
            .collect()
            .await)
    }

    async fn activity_pass(&self, plan: StockPlan) -> ActivityPass {
        let a = plan.activity;
        // The activity's counters exist from the first pass on, at zero until something happens.
        for job in ["recovery", "reconcile", "payment_timeout", "rebalance"] {
            metrics::counter!("seckill_job_failures_total", "job_name" => job, "activity" => a.to_string())
                .increment(0);
        }
        metrics::counter!("seckill_recovery_runs_total", "activity" => a.to_string()).increment(0);
        let fence = jobs::new_fence(&mut *self.fences.lock().unwrap_or_else(|p| p.into_inner()));
        let recovery = jobs::recover_if_needed(
            &self.cache,
            &self.ledger,
            &self.bus,
            &plan,
            &self.config.recovery,
            &fence,
        )
        .await;
        failed("recovery", a, &recovery);
        if let Ok(Recovery::Recovered(r)) = &recovery {
            tracing::warn!(activity = %a, cause = %r.cause, generation = r.generation, rescued = r.rescued,
                "recovered the activity from the ledger");
        }
        let now = self.clock.now_ms();
        let reconcile = jobs::reconcile(
            &self.cache,
            &self.ledger,
            &self.bus,
            &plan,
            now,
            &self.config.reconcile,
        )
        .await;
        failed("reconcile", a, &reconcile);
        if let Ok(r) = &reconcile {
            if !r.skipped {
                metrics::gauge!("seckill_reconcile_differences", "activity" => a.to_string())
                    .set(r.differences.len() as f64);
                metrics::gauge!("seckill_open_reservations", "activity" => a.to_string()).set(r.open as f64);
                metrics::gauge!("seckill_stock_remaining", "activity" => a.to_string()).set(r.stock as f64);
            }
        }
        let cancelled = jobs::cancel_unpaid(&self.cache, &self.ledger, &plan, self.clock.now_ms()).await;
        failed("payment_timeout", a, &cancelled);
        if let Ok(c) = &cancelled {
            if c.release_failures > 0 {
                tracing::warn!(activity = %a, cancelled = c.cancelled, failed = c.release_failures,
                    "cancelled orders' units not given back yet; the reconciler retries");
            }
        }
        ActivityPass {
            activity: a,
            recovery,
            reconcile,
            cancelled,
        }
    }

    /// One rebalancing round over every registered activity: the transfers it completed.
    pub async fn rebalance(&self) -> PortResult<Vec<(ActivityId, Transfer)>> {
        let mut moved = Vec::new();
        for plan in self.plans().await? {
            let r = jobs::rebalance(
                &self.cache,
                &self.ledger,
                &plan,
                self.clock.now_ms(),
                &self.runner,
                &self.config.rebalance,
            )
            .await;
            failed("rebalance", plan.activity, &r);
            moved.extend(r.unwrap_or_default().into_iter().map(|t| (plan.activity, t)));
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_any_subset_once_and_name_what_is_wrong() {
        assert_eq!(Roles::parse("api,worker,jobs"), Ok(Roles::ALL));
        let api = Roles::parse("api").unwrap();
        assert!(api.api && !api.worker && !api.jobs);
        assert_eq!(Roles::parse(" jobs , api ").unwrap().to_string(), "api,jobs");
        assert!(Roles::parse("api,api").unwrap_err().contains("twice"));
        assert!(Roles::parse("api,web").unwrap_err().contains("\"web\""));
        assert!(Roles::parse("").unwrap_err().contains("empty"));
    }
}
