//! Engine and consumer nodes: the real `PurchaseService` and `OrderConsumer`, unchanged, wired
//! to the simulated stores. Each `*_main` is a node's init: it runs again on every restart,
//! with nothing kept from the previous incarnation.

use crate::rpc;
use crate::stores::{SimBus, SimLedger, SimRedis};
use madsim::net::Endpoint;
use madsim::rand::{thread_rng, Rng};
use rand::SeedableRng;
use seckill_engine::adapters::script::ScriptedStockCache;
use seckill_engine::clock::Clock;
use seckill_engine::domain::{Activity, StockPlan};
use seckill_engine::ports::Ledger;
use seckill_engine::service::{order_status, OrderConsumer, PurchaseConfig, PurchaseService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The consumer group every consumer node joins.
pub const GROUP: &str = "seckill-orders";
/// How often engines re-read the activity state.
pub const REFRESH_EVERY: Duration = Duration::from_millis(100);
/// How often the jobs node runs recovery check, reconciler and payment timeout.
const JOBS_EVERY: Duration = Duration::from_millis(100);

pub type SimCache = ScriptedStockCache<SimRedis>;

pub struct EngineParams {
    pub addr: SocketAddr,
    pub activity: Activity,
    pub partitions: u32,
    /// Wall-clock origin of this incarnation (the sim epoch, skewed by the nemesis).
    pub wall_ms: u64,
}

pub async fn engine_main(p: EngineParams) {
    let ep = Arc::new(Endpoint::bind(p.addr).await.expect("bind engine"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone()));
    let bus = SimBus::new(ep.clone(), p.partitions);
    let ledger = SimLedger::new(ep.clone());
    let clock = Clock::new(p.wall_ms, tokio::time::Instant::now());
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread_rng().gen());
    let service = PurchaseService::new(cache.clone(), bus, clock, PurchaseConfig::default(), &mut rng);
    // Until Redis answers with the warmed meta, this engine serves nothing.
    while service.load_activity(p.activity.clone()).await.is_err() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let activity = p.activity.id();
    let plan = StockPlan::new(&p.activity);
    // Pause / resume / recovery reach this engine through its state refresher.
    let refresher = service.clone();
    madsim::task::spawn(async move { refresher.run_refresher(REFRESH_EVERY).await });

    let s = service.clone();
    rpc::serve(&ep, move |req: rpc::Purchase| {
        let s = s.clone();
        async move { s.purchase(activity, req.user, 1).await.map_err(|e| e.to_string()) }
    });
    let (c, l) = (cache.clone(), ledger.clone());
    rpc::serve(&ep, move |req: rpc::Status| {
        let (c, l, plan) = (c.clone(), l.clone(), plan.clone());
        async move {
            order_status(&c, &l, &plan, req.user)
                .await
                .map_err(|e| e.to_string())
        }
    });
    rpc::serve(&ep, move |req: rpc::PayOrder| {
        let l = ledger.clone();
        async move { l.pay(req.id).await.map_err(|e| e.to_string()) }
    });
    std::future::pending::<()>().await;
}

/// The jobs node: every `JOBS_EVERY`, recovery if Redis restarted, then a reconciler pass and
/// the payment timeout; beside them, the rebalancer on its own schedule. What they did is traced; a difference the reconciler cannot explain is
/// counted as `reconciler_difference`.
pub async fn jobs_main(
    addr: SocketAddr,
    activity: Activity,
    partitions: u32,
    faults: Arc<crate::faults::Faults>,
) {
    use seckill_engine::jobs::{
        cancel_unpaid, rebalance, reconcile, recover_if_needed, RebalanceConfig, ReconcileConfig,
        RecoveryConfig,
    };
    let ep = Arc::new(Endpoint::bind(addr).await.expect("bind jobs"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone()));
    let ledger = SimLedger::new(ep.clone());
    let bus = SimBus::new(ep, partitions);
    let plan = StockPlan::new(&activity);
    let clock = Clock::new(crate::SIM_EPOCH_MS, tokio::time::Instant::now());
    let recovery = RecoveryConfig {
        // Longer than the whole publish window: engines see `recovering` within a refresh, and
        // a record whose ack was lost still lands up to LATE_APPEND_MAX later. At 500 ms (less
        // than that window) a record appended after the drain reached the ledger after the
        // rebuild had read it, and Redis stayed a unit over for good (chaos, seed 50446).
        quiesce: REFRESH_EVERY + crate::stores::LATE_APPEND_MAX + Duration::from_millis(100),
        drain_timeout: Duration::from_secs(5),
        group: GROUP.to_string(),
    };
    let reconcile_cfg = ReconcileConfig {
        republish_after_ms: 1_000,
        pending_after_ms: 1_000,
    };
    // The rebalancer runs on its own schedule, as it would in its own process: the reconciler
    // may meet a transfer mid-flight and finish it concurrently (every step is idempotent).
    let (c, l, p, f) = (cache.clone(), ledger.clone(), plan.clone(), faults.clone());
    madsim::task::spawn(async move {
        loop {
            tokio::time::sleep(JOBS_EVERY).await;
            let moved = rebalance(&c, &l, &p, clock.now_ms(), &RebalanceConfig::default()).await;
            for t in moved.unwrap_or_default() {
                f.event(format!(
                    "rebalanced {} units from bucket {} to {}",
                    t.units, t.from, t.to
                ));
            }
        }
    });
    loop {
        tokio::time::sleep(JOBS_EVERY).await;
        match recover_if_needed(&cache, &ledger, &bus, &plan, &recovery).await {
            Ok(Some(r)) => faults.event(format!(
                "recovered: {} units, {} buyer marks rebuilt",
                r.stock, r.buyers
            )),
            Ok(None) => {}
            // The other jobs check the activity state themselves: they go on.
            Err(e) => faults.event(format!("recovery: {e}")),
        }
        let pass = reconcile(&cache, &ledger, &bus, &plan, clock.now_ms(), &reconcile_cfg).await;
        if let Err(e) = &pass {
            faults.event(format!("reconciler: {e}"));
        }
        if let Ok(r) = pass {
            let acted = r.settled + r.republished + r.pending_kept + r.pending_cleared;
            if acted + r.cancels_released + r.transfers_finished > 0 {
                faults.event(format!(
                    "reconciler: settled {} republished {} pending {}/{} cancels {} transfers {}",
                    r.settled,
                    r.republished,
                    r.pending_kept,
                    r.pending_cleared,
                    r.cancels_released,
                    r.transfers_finished
                ));
            }
            for d in &r.differences {
                faults.event(format!("reconciler: {d}"));
            }
        }
        match cancel_unpaid(&cache, &ledger, &plan, clock.now_ms()).await {
            Ok(0) => {}
            Ok(n) => faults.event(format!("payment timeout: {n} orders cancelled")),
            Err(e) => faults.event(format!("payment timeout: {e}")),
        }
    }
}

/// A consumer node: the real `OrderConsumer`, batch after batch; a failed batch is traced
/// (it is redelivered: nothing was committed) and retried after a short pause.
pub async fn consumer_main(
    addr: SocketAddr,
    index: u32,
    of: u32,
    partitions: u32,
    batch: usize,
    faults: Arc<crate::faults::Faults>,
) {
    let ep = Arc::new(Endpoint::bind(addr).await.expect("bind consumer"));
    let cache = ScriptedStockCache::new(SimRedis::new(ep.clone()));
    let bus = SimBus::new(ep.clone(), partitions).member(index, of);
    let source = seckill_engine::ports::OrderBus::subscribe(&bus, GROUP)
        .await
        .expect("static membership cannot fail");
    let mut consumer = OrderConsumer::new(SimLedger::new(ep), cache, source, batch);
    loop {
        if let Err(e) = consumer.run_once().await {
            faults.event(format!("consumer-{index}: batch failed: {e}"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
