//! A dependency that is down: purchases fail fast and say so, and no stock moves (DESIGN §10).
//!
//! Redis: the test starts a Redis instance of its own (AOF, fsync always), kills it mid-sale and
//! starts it again. Kafka: the producer points at a broker address nobody answers (the shared
//! broker serves the other tests, so it is not stopped); the publish outcome is unknown, the
//! reservation stays open, and once a reachable broker is there the reconciler republishes it and
//! the order appears in MariaDB.

use super::{kafka, mysql, redis_single, service, unique_id};
use rand::SeedableRng;
use seckill_engine::adapters::embedded::EmbeddedBus;
use seckill_engine::adapters::kafka::{KafkaBus, KafkaConfig};
use seckill_engine::adapters::redis::{connect_stock_cache, RedisConfig, RedisStockCache};
use seckill_engine::clock::Clock;
use seckill_engine::conformance::activity;
use seckill_engine::domain::{StockPlan, UserId};
use seckill_engine::jobs::{reconcile, ReconcileConfig};
use seckill_engine::ports::{Ledger, OrderBus, StockCache};
use seckill_engine::service::{audit, OrderConsumer, PurchaseConfig, PurchaseOutcome, PurchaseService};
use seckill_invariants as inv;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_unavailable_fast_and_moves_no_stock() {
    let Some(bin) = service("REDIS_SERVER_BIN") else {
        return;
    };
    let mut redis = OwnRedis::start(bin);
    let mut cfg = RedisConfig::single(&redis.url());
    cfg.timeout = Duration::from_millis(300);
    let cache = connect_stock_cache(&cfg).await.expect("connect");
    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    cache.warmup(&plan).await.unwrap();
    let bus = EmbeddedBus::new(3, 100);
    let svc = service_for(cache.clone(), bus.clone());
    svc.load_activity(a.clone()).await.unwrap();
    assert!(matches!(
        svc.purchase(a.id(), UserId(1), 1).await,
        Ok(PurchaseOutcome::Queued(_))
    ));

    redis.kill();
    let started = Instant::now();
    let outcome = svc.purchase(a.id(), UserId(2), 1).await;
    let took = started.elapsed();
    match &outcome {
        Ok(PurchaseOutcome::Unavailable { reason }) => assert!(!reason.is_empty()),
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
async fn kafka_unreachable_leaves_the_reservation_open_until_it_is_republished() {
    let (Some(cache), Some(live), Some(ledger)) =
        (redis_single().await, kafka("outage").await, mysql().await)
    else {
        return;
    };
    let mut dead_cfg = KafkaConfig::new(&format!("127.0.0.1:{}", free_port()), &live.config().topic);
    dead_cfg.message_timeout = Duration::from_secs(1);
    let dead = KafkaBus::connect(dead_cfg).unwrap();

    let a = activity(unique_id(), 10, 2, 0);
    let plan = StockPlan::new(&a);
    ledger.install(&a, &plan).await.unwrap();
    cache.warmup(&plan).await.unwrap();
    let svc = service_for(cache.clone(), dead);
    svc.load_activity(a.clone()).await.unwrap();
    let started = Instant::now();
    let r = match svc.purchase(a.id(), UserId(7), 1).await {
        Ok(PurchaseOutcome::Queued(r)) => r,
        other => panic!("an unknown publish outcome answers queued: {other:?}"),
    };
    eprintln!("queued after {:?} with the broker unreachable", started.elapsed());
    let view = cache.snapshot(&plan).await.unwrap();
    let open: Vec<_> = view
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(|o| o.id))
        .collect();
    assert_eq!(open, vec![r.id], "the reservation stays open in Redis");
    assert!(ledger.order_of(a.id(), UserId(7)).await.unwrap().is_none());
    let snap = audit::snapshot(&cache, &ledger, &plan).await.unwrap();
    assert!(inv::check_safety(&snap).is_empty());
    assert!(
        inv::r1_reconciled(&snap).is_empty(),
        "open, not lost: {:?}",
        inv::r1_reconciled(&snap)
    );

    // A broker is reachable again: the reconciler republishes, the consumer applies.
    let later = r.reserved_at_ms + ReconcileConfig::default().republish_after_ms + 1;
    let report = reconcile(&cache, &ledger, &live, &plan, later, &ReconcileConfig::default())
        .await
        .unwrap();
    assert_eq!(report.republished, 1, "{report:?}");
    let source = live.subscribe(&format!("outage-{}", a.id())).await.unwrap();
    let mut consumer = OrderConsumer::new(ledger.clone(), cache.clone(), source, 64);
    let deadline = Instant::now() + Duration::from_secs(20);
    while ledger.order_of(a.id(), UserId(7)).await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the republished order never reached the ledger"
        );
        consumer.run_once().await.unwrap();
    }
    let snap = audit::snapshot(&cache, &ledger, &plan).await.unwrap();
    let mut v = audit::check(&snap, true);
    v.extend(inv::l1_queued_resolved(&snap, &[r.id.to_string()]));
    assert!(v.is_empty(), "{v:?}");
}
