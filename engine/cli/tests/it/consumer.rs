//! The order consumer: dead letters, duplicate buyers, crashes between apply and commit.

use crate::purchase::{rig, A};
use seckill_core::adapters::script::buyers_key;
use seckill_core::domain::{Reservation, UserId};
use seckill_core::ports::{Ledger, OrderBus, OrderSource, OrderStatus};
use seckill_core::service::{OrderConsumer, PurchaseOutcome};

#[tokio::test(start_paused = true)]
async fn malformed_messages_go_to_the_dead_letters_and_do_not_block() {
    let rig = rig(4, 1, 0, 1_500).await;
    rig.bus
        .publish_raw("1.0", br#"{"v":1,"reservation_id":"zz"}"#)
        .await
        .unwrap();
    let PurchaseOutcome::Queued(r) = rig.buy(UserId(3)).await else {
        panic!()
    };
    rig.drain().await;
    let dead = rig.bus.inner.all_dead_letters();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].reason.contains("reservation_id"), "{}", dead[0].reason);
    assert_eq!(
        rig.ledger
            .order_of(A, UserId(3))
            .await
            .unwrap()
            .unwrap()
            .reservation,
        r
    );
    assert_eq!(rig.bus.inner.backlog(), 0, "both committed");
}

#[tokio::test(start_paused = true)]
async fn a_second_reservation_of_one_user_is_released_to_its_bucket() {
    let rig = rig(4, 1, 0, 1_500).await;
    let u = UserId(3);
    let PurchaseOutcome::Queued(first) = rig.buy(u).await else {
        panic!()
    };
    // Redis forgets the buyer mark (a lost write): the same user reserves again.
    let key = buyers_key(A, first.bucket);
    rig.cache
        .conn()
        .inner
        .command(&[b"SREM".to_vec(), key.into_bytes(), u.to_string().into_bytes()]);
    let PurchaseOutcome::Queued(second) = rig.buy(u).await else {
        panic!()
    };
    assert_ne!(first.id, second.id);
    assert_eq!(rig.stocks().await[0], Some(2));
    rig.drain().await;
    assert_eq!(rig.stocks().await[0], Some(3), "the duplicate's unit came back");
    let order = rig.ledger.order_of(A, u).await.unwrap().unwrap();
    assert_eq!(
        (order.reservation.id, order.status),
        (first.id, OrderStatus::Created)
    );
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_apply_and_commit_redelivers_without_double_counting() {
    let rig = rig(10, 2, 0, 1_500).await;
    for u in 1..=6 {
        assert!(matches!(rig.buy(UserId(u)).await, PurchaseOutcome::Queued(_)));
    }
    // A consumer applies a batch to the ledger, then dies before settling and committing.
    let mut source = rig.bus.subscribe("test").await.unwrap();
    let batch = source.poll(100).await.unwrap();
    let events: Vec<Reservation> = batch
        .iter()
        .map(|d| Reservation::decode(&d.payload).unwrap())
        .collect();
    rig.ledger.apply(&events).await.unwrap();
    drop(source);
    assert!(
        !rig.violations(false).await.iter().any(|v| v.starts_with('S')),
        "safe mid-crash"
    );

    let source = rig.bus.subscribe("test").await.unwrap();
    let mut c = OrderConsumer::new(rig.ledger.clone(), rig.cache.clone(), source, 100);
    let report = c.run_once().await.unwrap();
    assert_eq!((report.delivered, report.redelivered, report.created), (6, 6, 0));
    assert_eq!(rig.ledger.snapshot(A).await.unwrap().orders.len(), 6);
    assert_eq!(rig.violations(true).await, Vec::<String>::new());
}
