//! A batch that fails while the broker is out of reach, on Apache Kafka: the consumer's rewind
//! fails too (the group's committed offsets cannot be read), and librdkafka's position is already
//! past the batch. Before the consumer held back after a failed rewind, its next poll went on
//! from there and the next commit went past the failed batch: those orders never reached the
//! ledger. Now nothing is polled until a rewind succeeds, and no batch is committed that starts
//! past records this member has not applied.

use super::{mysql, redis_single, service, unique_id, until_kafka_answers, OwnKafka};
use seckill_core::domain::{Reservation, ReservationId, StockPlan, UserId};
use seckill_core::ports::{Ledger, OrderBus};
use seckill_core::service::OrderConsumer;
use seckill_stores::kafka::{KafkaBus, KafkaConfig};
use seckill_testkit::activity;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_rewind_failed_is_applied_once_the_broker_is_back() {
    let (Some(libs), Some(cache), Some(ledger)) =
        (service("KAFKA_LIBS"), redis_single().await, mysql().await)
    else {
        return;
    };
    let _heavy = super::HEAVY.lock().await;
    let broker = OwnKafka::start(libs);
    let mut cfg = KafkaConfig::new(&broker.brokers(), &format!("seckill.test.rewind.{}", unique_id()));
    cfg.partitions = 1;
    cfg.message_timeout = Duration::from_secs(2);
    cfg.request_timeout = Duration::from_secs(2);
    let bus = KafkaBus::connect(cfg).unwrap();
    until_kafka_answers(&bus).await;

    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    ledger.install(&a, &plan).await.unwrap();
    let order = |user: u64| {
        let user = UserId(user);
        Reservation {
            id: ReservationId(u128::from(a.id().0) << 32 | u128::from(user.0)),
            activity: a.id(),
            user,
            bucket: plan.route(user),
            qty: 1,
            reserved_at_ms: 1,
            generation: 0,
        }
    };
    // A record that goes to the dead-letter topic (a publish: it fails while the broker is
    // stopped, and with it the batch), then three orders.
    bus.publish_raw("junk", b"not an order").await.unwrap();
    for user in 1..=3 {
        bus.publish(&order(user)).await.unwrap();
    }
    // Joining waits for the first record: the fetcher has the batch before the broker stops.
    let source = bus.subscribe(&format!("rewind-{}", a.id())).await.unwrap();
    let mut consumer = OrderConsumer::new(ledger.clone(), cache.clone(), source, 64);
    broker.signal("STOP");
    let failed = consumer.run_once().await;
    assert!(failed.is_err(), "the dead letter cannot be published: {failed:?}");
    broker.signal("CONT");
    until_kafka_answers(&bus).await;
    // Later orders: what the next poll hands out if the consumer goes on past the failed batch.
    for user in 4..=5 {
        bus.publish(&order(user)).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for user in 1..=5 {
        while ledger.order_of(a.id(), UserId(user)).await.unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the order of user {user} never reached the ledger"
            );
            let _ = consumer.run_once().await;
        }
    }
}

/// A member that holds no partition — the group has more members than partitions, or a rebalance
/// took them — has nothing to rewind: its rewind succeeds. librdkafka refuses to seek an empty
/// list (_INVALID_ARG); before the rewind treated that as nothing to do, a consumer whose batch
/// failed while a rebalance had taken its partitions polled nothing ever again (it polls nothing
/// until a rewind succeeds), so it never got them back: the real-store nemesis saw both workers
/// stop for good after a poll failed during a rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_partitions_rewinds() {
    use seckill_core::ports::OrderSource;
    let Some(brokers) = service("KAFKA_BROKERS") else {
        return;
    };
    // Two members, one partition: whichever joins second and gets it, the first is left with
    // none (its next polls serve the rebalance). If the second gets none (its subscribe says so
    // and it leaves), a fresh group tries again.
    for attempt in 0..10 {
        let mut cfg = KafkaConfig::new(&brokers, &format!("seckill.test.unassigned.{}", unique_id()));
        cfg.partitions = 1;
        let bus = KafkaBus::connect(cfg).unwrap();
        until_kafka_answers(&bus).await;
        let group = format!("unassigned-{}", unique_id());
        let mut first = bus.subscribe(&group).await.unwrap();
        let second = {
            let (bus, group) = (bus.clone(), group.clone());
            tokio::spawn(async move { bus.subscribe(&group).await })
        };
        while !second.is_finished() {
            first.poll(1).await.unwrap();
        }
        let Ok(mut second) = second.await.unwrap() else {
            eprintln!("attempt {attempt}: the first member kept the partition");
            continue;
        };
        for _ in 0..3 {
            first.poll(1).await.unwrap();
        }
        first.rewind().await.expect("a member without partitions rewinds");
        second.rewind().await.unwrap();
        return;
    }
    panic!("the second member never got the partition in 10 groups");
}
