//! A dependency that is down: purchases fail fast and say so, and no stock moves (DESIGN §10).
//! Each test stops and restarts a server of its own (the shared ones serve the other tests).
//!
//! Redis (AOF, fsync always) killed mid-sale: purchases answer Unavailable, nothing moves, and
//! after the restart the stock is what it was. Kafka (one KRaft node) stopped mid-sale (SIGSTOP: a
//! slow bus): the publish outcome is unknown, the purchase answers Queued and the reservation stays
//! open in Redis; once it goes on the reconciler republishes it and the order appears in MariaDB.
//! Kafka killed (its connections refused: the bus known down): the purchase answers Unavailable
//! before reserving, and queues again once a probe reached the restarted broker.

use super::{free_port, mysql, redis_single, service, unique_id, until_kafka_answers, OwnKafka};
use rand::SeedableRng;
use seckill_core::adapters::embedded::EmbeddedBus;
use seckill_core::clock::Clock;
use seckill_core::domain::{StockPlan, UserId};
use seckill_core::jobs::{reconcile, ReconcileConfig};
use seckill_core::ports::{Intent, Registered};
use seckill_core::ports::{Ledger, OrderBus, StockCache};
use seckill_core::service::{audit, OrderConsumer, PurchaseConfig, PurchaseOutcome, PurchaseService};
use seckill_invariants as inv;
use seckill_stores::kafka::{KafkaBus, KafkaConfig};
use seckill_stores::redis::{connect_stock_cache, RedisConfig, RedisStockCache};
use seckill_testkit::activity;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A redis-server of this test's own, durable across its restarts (AOF, fsync always).
struct OwnRedis {
    bin: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl OwnRedis {
    fn start(bin: String) -> OwnRedis {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("seckill-outage-redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = OwnRedis {
            bin,
            port,
            dir,
            child: None,
        };
        r.up();
        r
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn up(&mut self) {
        let child = Command::new(&self.bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn service_for<B: OrderBus>(cache: RedisStockCache, bus: B) -> PurchaseService<RedisStockCache, B> {
    let clock = Clock::new(wall_ms(), tokio::time::Instant::now());
    PurchaseService::new(
        cache,
        bus,
        clock,
        PurchaseConfig::default(),
        &mut rand::rngs::StdRng::seed_from_u64(unique_id()),
    )
}

impl OwnRedis {
    /// A server of the test's own, and a stock cache on it whose calls give up after 300 ms.
    async fn with_cache(bin: String) -> (OwnRedis, RedisStockCache) {
        let redis = OwnRedis::start(bin);
        let mut cfg = RedisConfig::single(&redis.url());
        cfg.timeout = Duration::from_millis(300);
        let cache = connect_stock_cache(&cfg).await.expect("connect");
        (redis, cache)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_unavailable_fast_and_moves_no_stock() {
    let Some(bin) = service("REDIS_SERVER_BIN") else {
        return;
    };
    let (mut redis, cache) = OwnRedis::with_cache(bin).await;
    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    cache
        .warmup(&plan, &Intent::FIRST, seckill_core::ports::WarmFrom::Plan)
        .await
        .unwrap();
    let bus = EmbeddedBus::new(3, 100);
    let svc = service_for(cache.clone(), bus.clone());
    svc.load_activity(&Registered {
        activity: a.clone(),
        intent: Intent::FIRST,
    });
    assert!(matches!(
        svc.purchase(a.id(), UserId(1), 1).await,
        Ok(PurchaseOutcome::Queued(_))
    ));

    redis.kill();
    let started = Instant::now();
    let outcome = svc.purchase(a.id(), UserId(2), 1).await;
    let took = started.elapsed();
    match &outcome {
        Ok(PurchaseOutcome::Unavailable { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("with Redis down: {other:?}"),
    }
    eprintln!("answer with Redis down: {outcome:?} after {took:?} (configured timeout 300 ms)");
    // Fail fast: bounded by the configured timeout with a wide margin for a loaded machine, not
    // by TCP retries or reconnect loops.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(bus.backlog(), 1, "nothing was published");

    redis.up();
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        match cache.snapshot(&plan).await {
            Ok(v) => break v,
            Err(e) => {
                assert!(Instant::now() < deadline, "no reconnect: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let stock: i64 = view.buckets.iter().filter_map(|b| b.stock).sum();
    assert_eq!(stock, 9, "only the purchase before the outage took a unit");
    assert!(view.buckets.iter().all(|b| !b.buyers.contains(&UserId(2))));
    assert!(
        matches!(
            svc.purchase(a.id(), UserId(2), 1).await,
            Ok(PurchaseOutcome::Queued(_))
        ),
        "back in service"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_stopped_leaves_reservations_open_and_orders_appear_after_it_returns() {
    let (Some(libs), Some(cache), Some(ledger)) =
        (service("KAFKA_LIBS"), redis_single().await, mysql().await)
    else {
        return;
    };
    let _heavy = super::HEAVY.lock().await;
    let mut broker = OwnKafka::start(libs);
    let mut cfg = KafkaConfig::new(&broker.brokers(), &format!("seckill.test.outage.{}", unique_id()));
    cfg.partitions = 3;
    cfg.message_timeout = Duration::from_secs(2);
    let bus = KafkaBus::connect(cfg).unwrap();
    until_kafka_answers(&bus).await;

    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    ledger.install(&a, &plan).await.unwrap();
    cache
        .warmup(&plan, &Intent::FIRST, seckill_core::ports::WarmFrom::Plan)
        .await
        .unwrap();
    let svc = service_for(cache.clone(), bus.clone());
    svc.load_activity(&Registered {
        activity: a.clone(),
        intent: Intent::FIRST,
    });
    let queued = |o: Result<PurchaseOutcome, _>| match o {
        Ok(PurchaseOutcome::Queued(r)) => r,
        other => panic!("expected queued: {other:?}"),
    };
    let before = queued(svc.purchase(a.id(), UserId(1), 1).await);

    broker.signal("STOP");
    let started = Instant::now();
    let during = queued(svc.purchase(a.id(), UserId(2), 1).await);
    eprintln!("queued after {:?} with the broker stopped", started.elapsed());
    assert_eq!(bus.known_down(), None, "slow, not down");
    let view = cache.snapshot(&plan).await.unwrap();
    let open: BTreeSet<_> = view
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(|o| o.id))
        .collect();
    assert!(
        open.contains(&during.id),
        "the unpublished reservation stays open in Redis"
    );
    let snap = audit::snapshot(&cache, &ledger, &plan).await.unwrap();
    assert!(inv::check_safety(&snap).is_empty());
    assert!(
        inv::r1_reconciled(&snap).is_empty(),
        "open, never lost: {:?}",
        inv::r1_reconciled(&snap)
    );

    broker.signal("CONT");
    until_kafka_answers(&bus).await;
    let later = during.reserved_at_ms + ReconcileConfig::default().republish_after_ms + 1;
    let report = reconcile(&cache, &ledger, &bus, &plan, later, &ReconcileConfig::default())
        .await
        .unwrap();
    assert!(report.republished >= 1, "{report:?}");
    let source = bus.subscribe(&format!("outage-{}", a.id())).await.unwrap();
    let mut consumer = OrderConsumer::new(ledger.clone(), cache.clone(), source, 64);
    let deadline = Instant::now() + Duration::from_secs(30);
    for user in [UserId(1), UserId(2)] {
        while ledger.order_of(a.id(), user).await.unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the order of {user} never reached the ledger"
            );
            let _ = consumer.run_once().await;
        }
    }
    let snap = audit::snapshot(&cache, &ledger, &plan).await.unwrap();
    let mut v = audit::check(&snap, true);
    v.extend(inv::l1_queued_resolved(
        &snap,
        &[before.id.to_string(), during.id.to_string()],
    ));
    assert!(v.is_empty(), "{v:?}");

    // Killed: the client sees every broker connection refused and knows the bus is down.
    broker.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while bus.known_down().is_none() {
        assert!(
            Instant::now() < deadline,
            "the bus never knew the broker was gone"
        );
        let _ = bus.probe().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stock = cache.snapshot(&plan).await.unwrap();
    match svc.purchase(a.id(), UserId(3), 1).await {
        Ok(PurchaseOutcome::Unavailable { reason, .. }) => {
            assert!(reason.contains("order bus is down"), "{reason}")
        }
        other => panic!("expected unavailable: {other:?}"),
    }
    assert_eq!(cache.snapshot(&plan).await.unwrap(), stock, "nothing reserved");
    broker.up();
    until_kafka_answers(&bus).await;
    assert_eq!(bus.known_down(), None, "the probe saw it back");
    queued(svc.purchase(a.id(), UserId(3), 1).await);
}

/// The rate limits every API process shares fail open while Redis is down (counted; each
/// process's own limits still hold), and stand aside for a while rather than make every request
/// wait for the store first: the purchase that follows answers 503 itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_limits_admit_while_redis_is_down() {
    use seckill_api::config::RateLimits;
    use seckill_api::limits::Limits;
    use seckill_stores::redis::RedisRateLimiter;
    let Some(bin) = service("REDIS_SERVER_BIN") else {
        return;
    };
    let (mut redis, cache) = OwnRedis::with_cache(bin).await;
    let rates = RateLimits {
        global_per_sec: 1_000,
        per_user_per_sec: 1,
        per_ip_per_sec: 1_000,
        ramp_ms: 0,
    };
    let limits = Limits::new(&rates, Some(RedisRateLimiter::new(cache.conn().clone())));
    let user = unique_id();
    assert_eq!(limits.check_shared(user, true).await, Ok(()));
    assert_eq!(
        limits.check_shared(user, true).await.map_err(|l| l.scope),
        Err("user"),
        "the shared limit holds while Redis answers"
    );
    redis.kill();
    assert_eq!(
        limits.check_shared(user, true).await,
        Ok(()),
        "Redis down: admitted"
    );
    assert_eq!(
        limits.check_shared(user, true).await,
        Ok(()),
        "and the limits stand aside"
    );
}
