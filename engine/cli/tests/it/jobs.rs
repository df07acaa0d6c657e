//! The self-healing jobs on the embedded backend: reconciler, payment timeout, recovery.

use crate::purchase::{rig, Rig, A};
use crate::support::Mode;
use seckill_core::adapters::embedded::exec;
use seckill_core::adapters::script::{buyers_key, gate_key, resv_key, stock_key, Script};
use seckill_core::domain::{Activity, ActivityId, Reservation, ReservationId, StockPlan};
use seckill_core::domain::{ActivityState, BucketNo, UserId};
use seckill_core::jobs::{
    cancel_unpaid, reconcile, recover_if_needed, PayTimeoutReport, ReconcileConfig, Recovery, RecoveryConfig,
    RecoveryReport,
};
use seckill_core::ports::{
    ApplyOutcome, CancelOutcome, Intent, Ledger, LedgerView, OrderBus, OrderRow, OrderStatus, PayOutcome,
    PortResult, ReconcileView, Registered, ReserveOutcome, StockCache, Transfer,
};
use seckill_core::service::{OrderConsumer, OrderState, PurchaseOutcome};
use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

const LATER: u64 = 1_500 + 3_000;

async fn reconcile_at(rig: &Rig, now_ms: u64) -> seckill_core::jobs::ReconcileReport {
    reconcile(
        &rig.cache,
        &rig.ledger,
        &rig.bus,
        &rig.plan,
        now_ms,
        &ReconcileConfig::default(),
    )
    .await
    .unwrap()
}

/// `seckill audit` of the rig's stores.
async fn audit(rig: &Rig) -> seckill_core::service::audit::Audit {
    seckill_core::service::audit::audit(&rig.cache, &rig.ledger, &rig.bus, &rig.plan)
        .await
        .unwrap()
}

fn redis(rig: &Rig, argv: &[&str]) {
    let argv: Vec<Vec<u8>> = argv.iter().map(|a| a.as_bytes().to_vec()).collect();
    rig.cache.conn().inner.command(&argv);
}

fn recovery() -> RecoveryConfig {
    RecoveryConfig {
        quiesce: Duration::ZERO,
        drain_timeout: Duration::from_secs(1),
        group: "test".into(),
        lease: Duration::from_secs(10),
    }
}

/// One recovery check under `fence`.
async fn recover(rig: &Rig, fence: &str) -> seckill_core::ports::PortResult<Recovery> {
    recover_if_needed(&rig.cache, &rig.ledger, &rig.bus, &rig.plan, &recovery(), fence).await
}

fn recovered(r: Recovery) -> RecoveryReport {
    match r {
        Recovery::Recovered(report) => report,
        other => panic!("expected a recovery, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn reconciler_settles_what_the_ledger_holds_and_republishes_what_it_lacks() {
    let rig = rig(10, 2, 0, 1_500).await;
    // u1's publish is lost on the way: queued, open in Redis, nowhere on the bus.
    rig.bus.knob.set(Mode::LostBefore);
    let PurchaseOutcome::Queued(lost) = rig.buy(UserId(1)).await else {
        panic!()
    };
    rig.bus.knob.set(Mode::Pass);
    // u2's order reached the ledger but its settle never ran.
    let PurchaseOutcome::Queued(unsettled) = rig.buy(UserId(2)).await else {
        panic!()
    };
    rig.ledger.apply(std::slice::from_ref(&unsettled)).await.unwrap();

    let early = reconcile_at(&rig, 1_600).await;
    assert_eq!(
        (early.settled, early.republished),
        (1, 0),
        "too young to republish: {early:?}"
    );
    let report = reconcile_at(&rig, LATER).await;
    assert_eq!(
        (report.settled, report.republished),
        (0, 1),
        "u1 only: {report:?}"
    );
    assert!(report.differences.is_empty(), "{report:?}");
    rig.drain().await;
    assert_eq!(rig.status(UserId(1)).await, OrderState::Created);
    let again = reconcile_at(&rig, LATER).await;
    assert_eq!((again.settled, again.republished), (0, 0), "{again:?}");
    assert_eq!(
        rig.ledger
            .order_of(A, UserId(1))
            .await
            .unwrap()
            .unwrap()
            .reservation,
        lost
    );
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_stale_pending_mark_is_cleared_and_a_winning_one_kept() {
    let rig = rig(10, 1, 20, 1_500).await; // bucket 0: 8, fallback: 2
    let own = BucketNo(0);
    redis(&rig, &["SET", &stock_key(A, own), "0"]); // empty the own bucket by hand
                                                    // An engine died between the own-bucket "pending" and its fallback attempt.
    let keys = [
        stock_key(A, own),
        buyers_key(A, own),
        resv_key(A, own),
        gate_key(A, own),
    ];
    let mut argv = vec!["EVAL", Script::Reserve.source(), "4"];
    argv.extend(keys.iter().map(String::as_str));
    argv.extend([
        "own",
        "7",
        "1",
        "00000000000000000000000000000abc",
        "1500",
        "0",
        "1",
    ]);
    redis(&rig, &argv);
    assert!(
        rig.cache.holds(&rig.plan, UserId(7)).await.unwrap(),
        "pending mark set"
    );
    let report = reconcile_at(&rig, LATER).await;
    assert_eq!(
        (report.pending_cleared, report.pending_kept),
        (1, 0),
        "{report:?}"
    );
    assert!(
        !rig.cache.holds(&rig.plan, UserId(7)).await.unwrap(),
        "the user may try again"
    );
    assert!(
        matches!(rig.buy(UserId(7)).await, PurchaseOutcome::Queued(r) if r.bucket == rig.plan.fallback_bucket())
    );
}

#[tokio::test(start_paused = true)]
async fn payment_timeout_cancels_once_and_gives_the_unit_back_to_its_bucket() {
    let rig = rig(10, 2, 0, 1_500).await;
    let PurchaseOutcome::Queued(r) = rig.buy(UserId(1)).await else {
        panic!()
    };
    let PurchaseOutcome::Queued(paid) = rig.buy(UserId(2)).await else {
        panic!()
    };
    rig.drain().await;
    rig.ledger.pay(paid.id, "p-1").await.unwrap();
    let before = rig.stocks().await;
    // The rig's clock runs in real time: the order was reserved at 1_500 or a little later.
    let due = r.reserved_at_ms + 60_000;
    let pass = |now| cancel_unpaid(&rig.cache, &rig.ledger, &rig.plan, now);
    let report = |cancelled, released| PayTimeoutReport {
        cancelled,
        released,
        release_failures: 0,
    };
    assert_eq!(pass(due - 1).await.unwrap(), report(0, 0));
    assert_eq!(
        pass(due).await.unwrap(),
        report(1, 1),
        "cancelled, and its unit given back"
    );
    assert_eq!(pass(due).await.unwrap(), report(0, 0), "once");
    let mut after = before.clone();
    after[r.bucket.0 as usize] = after[r.bucket.0 as usize].map(|s| s + 1);
    assert_eq!(rig.stocks().await, after, "back to the reservation's own bucket");
    assert_eq!(
        rig.ledger.pay(r.id, "p-1").await.unwrap(),
        PayOutcome::NotPayable(OrderStatus::Cancelled)
    );
    assert_eq!(rig.status(UserId(1)).await, OrderState::Cancelled);
    assert!(reconcile_at(&rig, due).await.differences.is_empty());
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_gives_back_a_cancel_whose_release_was_lost() {
    let rig = rig(10, 1, 0, 1_500).await;
    rig.buy(UserId(1)).await;
    rig.drain().await;
    // The ledger cancelled, then the job died before the Redis release.
    assert_eq!(
        rig.ledger.cancel_unpaid(A, 1_500 + 60_000).await.unwrap().len(),
        1
    );
    assert_eq!(rig.stocks().await[0], Some(9));
    // Half-way, the two stores differ by the unit: the audit says so and does not check R1.
    let half = audit(&rig).await;
    assert_eq!(
        (half.consumer_lag, half.cancels_in_flight, half.r1_checked),
        (0, 1, false),
        "{half:?}"
    );
    assert_eq!(half.verdict(), "ok");
    let report = reconcile_at(&rig, 1_500 + 60_000).await;
    assert_eq!(report.cancels_released, 1);
    assert!(
        report.differences.is_empty(),
        "explained, not a difference: {report:?}"
    );
    assert_eq!(rig.stocks().await[0], Some(10));
    assert_eq!(
        reconcile_at(&rig, 1_500 + 60_000).await.cancels_released,
        0,
        "exactly once"
    );
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
    let done = audit(&rig).await;
    assert_eq!((done.cancels_in_flight, done.r1_checked), (0, true), "{done:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unexplained_difference_is_reported_never_fixed() {
    let rig = rig(10, 2, 0, 1_500).await;
    redis(&rig, &["INCRBY", &stock_key(A, BucketNo(1)), "5"]);
    let report = reconcile_at(&rig, LATER).await;
    assert_eq!(report.differences.len(), 1);
    assert_eq!(
        report.differences[0].to_string(),
        "activity 1 bucket 1: redis and ledger differ by +5 units"
    );
    assert_eq!(rig.stocks().await[1], Some(10), "stock left as it was");
}

/// An intent the registry holds and the gates missed (a warmup that created them at the intent
/// it had read, just before the operator paused) is written to the gates by the reconciler.
#[tokio::test(start_paused = true)]
async fn the_reconciler_writes_the_registrys_intent_to_gates_that_missed_it() {
    let rig = rig(10, 2, 0, 1_500).await;
    rig.ledger
        .set_intent(A, ActivityState::Paused)
        .await
        .unwrap()
        .unwrap();
    let report = reconcile_at(&rig, LATER).await;
    let gates = rig.cache.snapshot(&rig.plan).await.unwrap();
    assert_eq!(report.gates_resynced, gates.buckets.len() as u64, "{report:?}");
    assert!(
        gates
            .buckets
            .iter()
            .all(|b| b.gate.as_ref().is_some_and(|g| g.state == ActivityState::Paused)),
        "every gate paused: {gates:?}"
    );
    assert!(matches!(
        rig.buy(UserId(1)).await,
        PurchaseOutcome::Unavailable { .. }
    ));
    assert_eq!(
        reconcile_at(&rig, LATER).await.gates_resynced,
        0,
        "nothing behind any more"
    );
}

#[tokio::test(start_paused = true)]
async fn recovery_rebuilds_redis_after_it_lost_everything() {
    let rig = rig(10, 2, 0, 1_500).await;
    for u in 1..=3 {
        assert!(matches!(rig.buy(UserId(u)).await, PurchaseOutcome::Queued(_)));
    }
    rig.drain().await;
    assert_eq!(recover(&rig, "f1").await.unwrap(), Recovery::NotNeeded);
    rig.cache.conn().inner.flush_all();
    assert!(matches!(
        rig.buy(UserId(9)).await,
        PurchaseOutcome::Unavailable { .. }
    ));
    rig.refresh().await;
    assert!(
        matches!(rig.buy(UserId(9)).await, PurchaseOutcome::Unavailable { reason, .. } if reason.contains("recovering"))
    );

    let report = recovered(recover(&rig, "f2").await.unwrap());
    assert_eq!((report.stock, report.buyers, report.generation), (7, 3, 1));
    assert!(report.cause.contains("meta is missing"), "{}", report.cause);
    rig.refresh().await;
    assert_eq!(
        rig.buy(UserId(2)).await,
        PurchaseOutcome::Duplicate,
        "buyer marks rebuilt"
    );
    assert!(matches!(rig.buy(UserId(9)).await, PurchaseOutcome::Queued(_)));
    rig.drain().await;
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
    let meta = rig.cache.meta(A).await.unwrap().unwrap();
    assert_eq!(
        (meta.claim, meta.epoch),
        (None, Some(rig.cache.epoch().await.unwrap()))
    );
    let gates = rig.cache.snapshot(&rig.plan).await.unwrap();
    assert!(
        gates.buckets.iter().all(|b| b
            .gate
            .as_ref()
            .is_some_and(|g| g.state == ActivityState::Open && g.generation == 1)),
        "reopened with the new generation: {gates:?}"
    );
}

/// A drain that is slow but moving is waited out; only a stalled one fails the recovery. (With
/// a fixed deadline, a standard-size simulated sale's backlog of eleven thousand records made
/// every attempt give up and start over: the activity never reopened.)
#[tokio::test(start_paused = true)]
async fn recovery_waits_out_a_slow_drain_and_gives_up_on_a_stalled_one() {
    let rig = rig(10, 2, 0, 1_500).await;
    for u in 1..=4 {
        assert!(matches!(rig.buy(UserId(u)).await, PurchaseOutcome::Queued(_)));
    }
    rig.cache.conn().inner.flush_all();
    let stalled = recover(&rig, "f1").await;
    let err = stalled.expect_err("nobody consumes: the lag never falls");
    assert!(err.to_string().contains("did not drain: 4 records"), "{err}");

    // One record every 600 ms: 2.4 s in all, more than the 1 s drain timeout, never 1 s stalled.
    let source = rig.bus.subscribe("test").await.unwrap();
    let mut consumer = OrderConsumer::new(rig.ledger.clone(), rig.cache.clone(), source, 1);
    let slow = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(600)).await;
            if consumer.run_once().await.unwrap().delivered == 0 {
                break;
            }
        }
    });
    let report = recovered(recover(&rig, "f2").await.unwrap());
    assert_eq!((report.stock, report.buyers), (6, 4));
    slow.await.unwrap();
    rig.refresh().await;
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn recovery_repairs_stale_stock_after_an_aof_window_loss() {
    let rig = rig(10, 1, 0, 1_500).await;
    rig.buy(UserId(1)).await;
    rig.drain().await;
    let image = rig.cache.conn().inner.dump(); // the last fsync
    for u in 2..=4 {
        rig.buy(UserId(u)).await;
    }
    rig.drain().await;
    rig.cache.conn().inner.restore(image); // restart: the window after the fsync is lost
    assert_eq!(rig.stocks().await[0], Some(9), "stale: three sold units are back");
    recovered(recover(&rig, "f1").await.unwrap());
    assert_eq!(rig.stocks().await[0], Some(6));
    rig.refresh().await;
    assert_eq!(rig.buy(UserId(3)).await, PurchaseOutcome::Duplicate);
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
    // the `exec` helper stays usable on dumped keyspaces (for differential tests)
    let mut ks = rig.cache.conn().inner.dump();
    assert_eq!(
        exec(&mut ks, &[b"DBSIZE".to_vec()]),
        seckill_core::adapters::script::Reply::Int(ks.len() as i64)
    );
}

#[tokio::test(start_paused = true)]
async fn the_rebalancer_moves_half_of_a_rich_bucket_into_a_drained_one() {
    use seckill_core::jobs::{rebalance, RebalanceConfig};
    use seckill_testkit::users_in;
    let rig = rig(20, 2, 0, 1_500).await; // two buckets of 10
    for u in users_in(&rig.plan, BucketNo(0), 10) {
        assert!(matches!(rig.buy(u).await, PurchaseOutcome::Queued(_)));
    }
    rig.drain().await;
    let moved = rebalance(
        &rig.cache,
        &rig.ledger,
        &rig.plan,
        2_000,
        "t",
        &RebalanceConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        (moved[0].from, moved[0].to, moved[0].units),
        (BucketNo(1), BucketNo(0), 5)
    );
    assert_eq!(rig.stocks().await, vec![Some(5), Some(5), Some(0)]);
    let ledger = rig.ledger.snapshot(A).await.unwrap();
    assert_eq!((ledger.buckets[0].remaining, ledger.buckets[1].remaining), (5, 5));
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
    // nothing drained now: no more transfers
    assert!(rebalance(
        &rig.cache,
        &rig.ledger,
        &rig.plan,
        2_100,
        "t",
        &RebalanceConfig::default()
    )
    .await
    .unwrap()
    .is_empty());
    // the moved units sell to the drained bucket's users
    let more = users_in(&rig.plan, BucketNo(0), 12);
    assert!(matches!(rig.buy(more[11]).await, PurchaseOutcome::Queued(r) if r.bucket == BucketNo(0)));
}

#[tokio::test(start_paused = true)]
async fn a_transfer_cut_after_its_take_is_finished_by_the_reconciler_once() {
    use seckill_core::ports::Transfer;
    let rig = rig(20, 2, 0, 1_500).await;
    let t = Transfer {
        id: "t1".into(),
        from: BucketNo(1),
        to: BucketNo(0),
        units: 4,
        generation: 0,
    };
    assert!(rig.cache.take(&rig.plan, &t).await.unwrap());
    assert!(rig.cache.take(&rig.plan, &t).await.unwrap(), "take is idempotent");
    assert_eq!(rig.stocks().await, vec![Some(10), Some(6), Some(0)]);
    let half = audit(&rig).await;
    assert_eq!(
        (half.transfers_in_flight, half.r1_checked, half.verdict().as_str()),
        (1, false, "ok"),
        "{half:?}"
    );
    let report = reconcile_at(&rig, LATER).await;
    assert_eq!(report.transfers_finished, 1, "{report:?}");
    assert!(report.differences.is_empty(), "{report:?}");
    assert_eq!(rig.stocks().await, vec![Some(14), Some(6), Some(0)]);
    assert_eq!(
        reconcile_at(&rig, LATER).await.transfers_finished,
        0,
        "acknowledged"
    );
    rig.cache.give(&rig.plan, &t).await.unwrap();
    assert_eq!(rig.stocks().await[0], Some(14), "give is idempotent");
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
    let done = audit(&rig).await;
    assert_eq!((done.transfers_in_flight, done.r1_checked), (0, true), "{done:?}");
}

/// The rig's ledger, with one purchase slipped in between the reconciler's Redis read and its
/// first ledger read — reserved, and written to the ledger before that read, as a busy sale
/// does it all the time.
#[derive(Clone)]
struct SlipIn {
    inner: seckill_core::adapters::embedded::EmbeddedLedger,
    cache: crate::support::TestCache,
    plan: seckill_core::domain::StockPlan,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Ledger for SlipIn {
    fn cancel_unpaid(
        &self,
        a: ActivityId,
        now: u64,
    ) -> impl Future<Output = PortResult<Vec<Reservation>>> + Send {
        self.inner.cancel_unpaid(a, now)
    }
    fn install(&self, a: &Activity, p: &StockPlan) -> impl Future<Output = PortResult<bool>> + Send {
        self.inner.install(a, p)
    }
    fn apply(&self, batch: &[Reservation]) -> impl Future<Output = PortResult<Vec<ApplyOutcome>>> + Send {
        self.inner.apply(batch)
    }
    fn pay(&self, id: ReservationId, payment: &str) -> impl Future<Output = PortResult<PayOutcome>> + Send {
        self.inner.pay(id, payment)
    }
    fn order(&self, id: ReservationId) -> impl Future<Output = PortResult<Option<OrderRow>>> + Send {
        self.inner.order(id)
    }
    fn cancel(&self, id: ReservationId) -> impl Future<Output = PortResult<CancelOutcome>> + Send {
        self.inner.cancel(id)
    }
    fn activity(&self, id: ActivityId) -> impl Future<Output = PortResult<Option<Activity>>> + Send {
        self.inner.activity(id)
    }
    fn registry(&self, id: ActivityId) -> impl Future<Output = PortResult<Option<Registered>>> + Send {
        self.inner.registry(id)
    }
    fn registered(&self) -> impl Future<Output = PortResult<Vec<Registered>>> + Send {
        self.inner.registered()
    }
    fn set_intent(
        &self,
        id: ActivityId,
        s: ActivityState,
    ) -> impl Future<Output = PortResult<Option<Intent>>> + Send {
        self.inner.set_intent(id, s)
    }
    fn bump_generation(
        &self,
        id: ActivityId,
        from: u64,
    ) -> impl Future<Output = PortResult<Option<Intent>>> + Send {
        self.inner.bump_generation(id, from)
    }
    fn transfer(&self, a: ActivityId, t: &Transfer) -> impl Future<Output = PortResult<bool>> + Send {
        self.inner.transfer(a, t)
    }
    fn order_of(
        &self,
        a: ActivityId,
        u: UserId,
    ) -> impl Future<Output = PortResult<Option<OrderRow>>> + Send {
        self.inner.order_of(a, u)
    }
    fn snapshot(&self, a: ActivityId) -> impl Future<Output = PortResult<LedgerView>> + Send {
        self.inner.snapshot(a)
    }
    fn reconcile_view(
        &self,
        a: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> impl Future<Output = PortResult<ReconcileView>> + Send {
        let (me, mentioned) = (self.clone(), mentioned.clone());
        async move {
            if me.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                let id = ReservationId(0x5117);
                let reserved = me.cache.reserve(&me.plan, UserId(77), 1, id, 1_500).await?;
                let ReserveOutcome::Reserved(r) = reserved else {
                    panic!("{reserved:?}")
                };
                me.inner.apply(&[r]).await?;
            }
            me.inner.reconcile_view(a, &mentioned).await
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_order_written_between_the_two_reads_is_no_difference() {
    let rig = rig(10, 2, 0, 1_500).await;
    rig.buy(UserId(1)).await;
    rig.drain().await;
    let ledger = SlipIn {
        inner: rig.ledger.clone(),
        cache: rig.cache.clone(),
        plan: rig.plan.clone(),
        armed: Default::default(),
    };
    let cfg = ReconcileConfig::default();
    let pass = || reconcile(&rig.cache, &ledger, &rig.bus, &rig.plan, LATER, &cfg);
    assert!(pass().await.unwrap().differences.is_empty(), "at rest");
    ledger.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let report = pass().await.unwrap();
    assert!(
        !ledger.armed.load(std::sync::atomic::Ordering::SeqCst),
        "the purchase slipped in"
    );
    assert!(
        report.differences.is_empty(),
        "a read between a reserve and its settle is no difference: {report:?}"
    );
    assert_eq!(pass().await.unwrap().settled, 1, "settled the pass after");
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}
