//! Engine and consumer nodes: the real `PurchaseService` and `OrderConsumer`, unchanged, wired
//! to the simulated stores. Each `*_main` is a node's init: it runs again on every restart,
//! with nothing kept from the previous incarnation.

use crate::rpc;
use crate::stores::{SimBus, SimLedger, SimRedis};
use crate::world::Target;
use madsim::net::Endpoint;
use madsim::rand::{thread_rng, Rng};
use rand::SeedableRng;
use seckill_core::adapters::script::ScriptedStockCache;
use seckill_core::clock::Clock;
use seckill_core::domain::{Activity, StockPlan};
use seckill_core::jobs::{RebalanceConfig, ReconcileConfig, Recovery, RecoveryConfig};
use seckill_core::ports::Ledger;
use seckill_core::roles::{self, ActivityPass, JobsConfig};
use seckill_core::service::{order_status, PurchaseConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The consumer group every consumer node joins.
pub const GROUP: &str = "seckill-orders";
/// How often engines re-read the activity state.
pub const REFRESH_EVERY: Duration = Duration::from_millis(200);
/// How often the jobs node runs recovery check, reconciler and payment timeout.
const JOBS_EVERY: Duration = Duration::from_millis(100);

pub type SimCache = ScriptedStockCache<SimRedis>;

pub struct EngineParams {
    pub addr: SocketAddr,
    pub activity: Activity,
    /// Wall-clock origin of this incarnation (the sim epoch, skewed by the nemesis).
    pub wall_ms: u64,
    pub timings: Timings,
    pub faults: Arc<crate::faults::Faults>,
}

/// What production leaves to configuration (its own or Redis's), drawn per seed so that a sweep
/// covers ranges rather than one point. Each range stays where production's rules put it, so a
/// failure comes from a bug and not from a setting production would refuse: the publish window
/// (quiesce) longer than the longest publish — a record whose ack was lost still lands up to
/// `LATE_APPEND_MAX` later (at 500 ms, less than that, a record appended after the drain reached
/// the ledger after the rebuild had read it: chaos, seed 50446) — a pending mark resolved only
/// when older than a fallback attempt with its store timeouts, a lease longer than the
/// quarter-lease renewal step plus one store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Timings {
    /// Redis AOF `appendfsync everysec`: what a restart may lose (real Redis, up to about 1 s).
    pub aof_window_ms: u64,
    /// The recovery's publish window beyond the longest publish.
    pub quiesce_margin_ms: u64,
    /// The recovery gives up a drain whose lag stopped falling for this long.
    pub drain_timeout_ms: u64,
    /// A recovery claim's lease.
    pub lease_ms: u64,
    /// The reconciler republishes an open reservation the ledger lacks once this old.
    pub republish_after_ms: u64,
    /// The reconciler gives up a pending-fallback mark once this old (production: 2 s). Drawn
    /// down to 1 s, so that fallback reserves still queued in a slow Redis meet the give-up's
    /// void (when the give-up went by age alone, rebalancing seed 1019 at 1.3 s left a fallback
    /// unit without its own-bucket mark: S2 in Redis).
    pub pending_after_ms: u64,
    /// How long an API node answers a bucket found empty "sold out" from memory (production's
    /// default is 200 ms; an operator shedding load sets seconds). Only the rebalancer's
    /// announcement makes moved units sellable sooner.
    pub sold_out_recheck_ms: u64,
    /// How far a Redis replica lags its primary at most (a failover loses up to this much): up
    /// to 3 s, past the recovery's quiesce on many seeds.
    pub replica_lag_ms: u64,
}

impl Timings {
    pub fn draw(seed: u64) -> Timings {
        // Their own stream: the draw changes nothing else a seed does.
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x7141_6e55);
        Timings {
            aof_window_ms: rng.gen_range(50..=1_000),
            quiesce_margin_ms: rng.gen_range(100..=500),
            drain_timeout_ms: rng.gen_range(2_000..=6_000),
            lease_ms: rng.gen_range(1_500..=5_000),
            republish_after_ms: rng.gen_range(500..=2_500),
            pending_after_ms: rng.gen_range(1_000..=2_500),
            sold_out_recheck_ms: rng.gen_range(100..=3_000),
            replica_lag_ms: rng.gen_range(10..=3_000),
        }
    }

    /// The recovery of the simulation's jobs (and of warmups through an API node).
    pub fn recovery(&self) -> RecoveryConfig {
        RecoveryConfig {
            quiesce: crate::stores::LATE_APPEND_MAX + Duration::from_millis(self.quiesce_margin_ms),
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            group: GROUP.to_string(),
            lease: Duration::from_millis(self.lease_ms),
        }
    }

    pub fn aof_window(&self) -> Duration {
        Duration::from_millis(self.aof_window_ms)
    }
}

/// An API node: the production `api` role (`roles::api_role`), driven over simulated RPC.
pub async fn engine_main(p: EngineParams) {
    let ep = Arc::new(Endpoint::bind(p.addr).await.expect("bind engine"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone(), p.faults.clone()));
    let bus = SimBus::new(ep.clone());
    let ledger = SimLedger::new(ep.clone(), p.faults.clone());
    let clock = Clock::new(p.wall_ms, tokio::time::Instant::now());
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread_rng().gen());
    let role = Arc::new(roles::api_role(
        cache,
        bus,
        ledger,
        clock,
        PurchaseConfig {
            sold_out_recheck_ms: p.timings.sold_out_recheck_ms,
        },
        p.timings.recovery(),
        &mut rng,
    ));
    let activity = p.activity.id();
    // Until the registry and Redis answer, this node serves nothing.
    while role.refresh().await.is_err() || role.service.activity(activity).is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plan = StockPlan::new(&p.activity);
    // Pause / resume / recovery reach this node through its refresher (the gates enforce them
    // whatever the refresher has seen).
    let refresher = role.clone();
    madsim::task::spawn(async move { refresher.run_refresher(REFRESH_EVERY).await });

    let r = role.clone();
    rpc::serve(&ep, move |req: rpc::Purchase| {
        let r = r.clone();
        async move {
            r.service
                .purchase(activity, req.user, 1)
                .await
                .map_err(|e| e.to_string())
        }
    });
    let r = role.clone();
    rpc::serve(&ep, move |req: rpc::Status| {
        let (r, plan) = (r.clone(), plan.clone());
        async move {
            order_status(&r.cache, &r.ledger, &plan, req.user)
                .await
                .map_err(|e| e.to_string())
        }
    });
    let r = role.clone();
    rpc::serve(&ep, move |req: rpc::PayOrder| {
        let r = r.clone();
        // The provider's payment id for the simulated payment of this order.
        async move {
            let payment = format!("sim-{}", req.id);
            r.ledger.pay(req.id, &payment).await.map_err(|e| e.to_string())
        }
    });
    let r = role.clone();
    rpc::serve(&ep, move |_: rpc::Warmup| {
        let r = r.clone();
        async move {
            r.warmup(activity)
                .await
                .map(|w| format!("{w:?}"))
                .map_err(|e| e.to_string())
        }
    });
    let r = role;
    rpc::serve(&ep, move |req: rpc::Operate| {
        let r = r.clone();
        async move {
            r.set_intent(activity, req.state)
                .await
                .map(|(intent, _)| intent)
                .map_err(|e| e.to_string())
        }
    });
    std::future::pending::<()>().await;
}

/// A jobs node: the production `jobs` role (`roles::jobs_role`). Every `JOBS_EVERY` a pass —
/// recovery if needed, a reconciler pass, the payment timeout — and beside it the rebalancer on
/// its own schedule. What they did is traced; a difference the reconciler cannot explain is
/// traced as `reconciler: …`.
pub async fn jobs_main(addr: SocketAddr, index: usize, timings: Timings, faults: Arc<crate::faults::Faults>) {
    let ep = Arc::new(Endpoint::bind(addr).await.expect("bind jobs"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone(), faults.clone()));
    let ledger = SimLedger::new(ep.clone(), faults.clone());
    let bus = SimBus::new(ep);
    let clock = Clock::new(faults.wall_ms(0), tokio::time::Instant::now());
    let config = JobsConfig {
        recovery: timings.recovery(),
        reconcile: ReconcileConfig {
            republish_after_ms: timings.republish_after_ms,
            pending_after_ms: timings.pending_after_ms,
        },
        rebalance: RebalanceConfig::default(),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread_rng().gen());
    let role = Arc::new(roles::jobs_role(cache, bus, ledger, clock, config, &mut rng));
    let name = format!("jobs-{index}");
    // The rebalancer runs on its own schedule, as it would in its own process: the reconciler
    // may meet a transfer mid-flight and finish it concurrently (every step is idempotent).
    let (r, f, n) = (role.clone(), faults.clone(), name.clone());
    madsim::task::spawn(async move {
        loop {
            tokio::time::sleep(JOBS_EVERY).await;
            let since = f.elapsed();
            for (_, t) in r.rebalance().await.unwrap_or_default() {
                f.transfer_done(crate::faults::TransferDone {
                    id: t.id.clone(),
                    from: t.from.0,
                    since,
                });
                f.event(format!(
                    "{n}: rebalanced {} units from bucket {} to {}",
                    t.units, t.from, t.to
                ));
            }
        }
    });
    loop {
        tokio::time::sleep(JOBS_EVERY).await;
        let passes = match role.pass().await {
            Ok(p) => p,
            Err(e) => {
                faults.event(format!("{name}: registry: {e}"));
                continue;
            }
        };
        for pass in passes {
            trace_pass(&faults, &name, pass);
        }
    }
}

fn trace_pass(faults: &crate::faults::Faults, name: &str, pass: ActivityPass) {
    match pass.recovery {
        Ok(Recovery::Recovered(r)) => {
            faults.cover(Target::Recovered);
            if faults.under_load() {
                faults.cover(Target::RecoveryUnderLoad);
            }
            if r.rescued > 0 {
                faults.cover(Target::OutboxRescued);
            }
            faults.event(format!(
                "{name}: recovered ({}): {} units, {} buyer marks, {} rescued, generation {}",
                r.cause, r.stock, r.buyers, r.rescued, r.generation
            ))
        }
        Ok(Recovery::Busy(b)) => {
            faults.cover(Target::RecoveryContended);
            faults.event(format!("{name}: recovery busy: claim {} holds", b.fence))
        }
        Ok(Recovery::NotNeeded) => {}
        // The other jobs check the gates themselves: they go on.
        Err(e) => faults.event(format!("{name}: recovery: {e}")),
    }
    match pass.reconcile {
        Err(e) => faults.event(format!("{name}: reconciler: {e}")),
        Ok(r) => {
            for (what, n) in [
                (Target::ReconcilerRepublished, r.republished),
                (Target::FailedUserFreedByReconciler, r.failed_freed),
                (Target::PendingMarkResolved, r.pending_kept + r.pending_cleared),
                (Target::CancelReleaseFinished, r.cancels_released),
                (Target::TransferFinishedByReconciler, r.transfers_finished),
                (Target::GatesResyncedByReconciler, r.gates_resynced),
            ] {
                if n > 0 {
                    faults.cover(what);
                }
            }
            let acted = r.settled + r.failed_freed + r.republished + r.pending_kept + r.pending_cleared;
            if acted + r.cancels_released + r.transfers_finished + r.gates_resynced > 0 {
                faults.event(format!(
                    "{name}: reconciler: settled {} freed {} republished {} pending {}/{} cancels {} transfers {} gates {}",
                    r.settled,
                    r.failed_freed,
                    r.republished,
                    r.pending_kept,
                    r.pending_cleared,
                    r.cancels_released,
                    r.transfers_finished,
                    r.gates_resynced
                ));
            }
            for d in &r.differences {
                faults.event(format!("{name}: reconciler: {d}"));
            }
        }
    }
    match pass.cancelled {
        Ok(c) if c.cancelled == 0 => {}
        Ok(c) => {
            if c.released > 0 {
                faults.cover(Target::CancelReleasedAtTimeout);
            }
            faults.event(format!(
                "{name}: payment timeout: {} orders cancelled, {} released, {} releases failed",
                c.cancelled, c.released, c.release_failures
            ))
        }
        Err(e) => faults.event(format!("{name}: payment timeout: {e}")),
    }
}

/// A worker node: the production `worker` role (`roles::worker_role`), batch after batch; a
/// failed batch is traced (it is redelivered: nothing was committed) and retried after a pause.
pub async fn consumer_main(addr: SocketAddr, index: u32, batch: usize, faults: Arc<crate::faults::Faults>) {
    let ep = Arc::new(Endpoint::bind(addr).await.expect("bind consumer"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone(), faults.clone()));
    let bus = SimBus::new(ep.clone());
    let mut consumer = roles::worker_role(cache, &bus, SimLedger::new(ep, faults.clone()), GROUP, batch)
        .await
        .expect("static membership cannot fail");
    loop {
        match consumer.run_once().await {
            Ok(r) => {
                for (what, n) in [
                    (Target::RedeliveryDeduped, r.redelivered),
                    (Target::StaleGenerationRefused, r.stale_generation),
                    (Target::DuplicateBuyerRefused, r.duplicate_buyers),
                    (Target::OutOfStockRefused, r.out_of_stock),
                ] {
                    if n > 0 {
                        faults.cover(what);
                    }
                }
            }
            Err(e) => {
                faults.event(format!("consumer-{index}: batch failed: {e}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
