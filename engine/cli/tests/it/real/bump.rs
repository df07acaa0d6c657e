//! The recovery's generation bump is fenced on MariaDB and Redis (DESIGN §11.3). Runner J1 passed
//! its last lease renewal and sent the bump; its connection stalled (a partition: TCP
//! retransmits, and sqlx has no statement timeout) while its lease ran out. Runner J2 took over,
//! recovered and reopened every gate at the next generation. Then J1's UPDATE arrives. Before the
//! bump was a compare-and-set it moved the registry one generation past every gate, and the
//! ledger refused every later order of the sale as stale (tried on the unconditional `UPDATE
//! activity SET generation = generation + 1` of 2698f91: the order below came back
//! `StaleGeneration`).

use super::{mysql, redis_single, unique_id};
use seckill_core::adapters::embedded::EmbeddedBus;
use seckill_core::adapters::script::meta_key;
use seckill_core::domain::{ReservationId, StockPlan, UserId};
use seckill_core::jobs::{recover_if_needed, Recovery, RecoveryConfig};
use seckill_core::ports::{ApplyOutcome, Ledger, ReserveOutcome, StockCache, WarmFrom};
use seckill_testkit::activity;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runners_late_bump_after_its_successor_reopened_changes_nothing() {
    let (Some(ledger), Some(cache), Some(redis_url)) =
        (mysql().await, redis_single().await, super::service("REDIS_URL"))
    else {
        return;
    };
    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    ledger.install(&a, &plan).await.unwrap();
    let before = ledger.registry(a.id()).await.unwrap().unwrap().intent;
    cache.warmup(&plan, &before, WarmFrom::Plan).await.unwrap();

    // Redis loses the activity (its meta: what a restart without it looks like to the jobs).
    // J1 read the registry at `before.generation` and is about to bump it: its UPDATE is late.
    let mut conn = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: i64 = redis::cmd("DEL").arg(meta_key(a.id())).query(&mut conn).unwrap();

    // J2 takes over and recovers to the next generation; every gate reopens at it.
    let cfg = RecoveryConfig {
        quiesce: Duration::ZERO,
        drain_timeout: Duration::from_secs(5),
        group: format!("bump-{}", a.id()),
        lease: Duration::from_secs(10),
    };
    let bus = EmbeddedBus::new(2, 100);
    let report = match recover_if_needed(&cache, &ledger, &bus, &plan, &cfg, "j2")
        .await
        .unwrap()
    {
        Recovery::Recovered(r) => r,
        other => panic!("J2 should have recovered: {other:?}"),
    };
    assert_eq!(report.generation, before.generation + 1);

    // J1's bump lands now, on the generation it read: taken over, it changes nothing.
    assert_eq!(
        ledger.bump_generation(a.id(), before.generation).await.unwrap(),
        None,
        "a late bump moved the registry past the gates J2 reopened"
    );
    assert_eq!(
        ledger.registry(a.id()).await.unwrap().unwrap().intent.generation,
        report.generation
    );

    // The sale goes on: an order reserved at the reopened gates' generation is created.
    let id = ReservationId(u128::from(unique_id()) << 64 | 1);
    let r = match cache.reserve(&plan, UserId(7), 1, id, 1).await.unwrap() {
        ReserveOutcome::Reserved(r) => r,
        other => panic!("the reopened sale refused a purchase: {other:?}"),
    };
    assert_eq!(r.generation, report.generation);
    assert_eq!(ledger.apply(&[r]).await.unwrap(), vec![ApplyOutcome::Created]);
}
