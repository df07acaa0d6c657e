//! The shared conformance suites against the embedded backend.

use seckill_core::adapters::embedded::{EmbeddedBackend, EmbeddedBus, Fetch};
use seckill_core::ports::{OrderBus, OrderSource};
use seckill_testkit::{ledger_conformance, order_bus_conformance, stock_cache_conformance};
use std::time::Duration;

#[tokio::test]
async fn embedded_stock_cache_conforms() {
    stock_cache_conformance(|| async { EmbeddedBackend::new().cache }, 1).await;
}

#[tokio::test]
async fn embedded_bus_conforms() {
    order_bus_conformance(|| async { EmbeddedBus::new(3, 1_000) }, 1).await;
    // The backend's bus: polls wait for a batch to fill, with the same delivery semantics.
    order_bus_conformance(|| async { EmbeddedBackend::new().bus }, 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_poll_waits_up_to_fetch_max_wait_for_a_batch_to_fill() {
    let fetch = Fetch {
        min_records: 3,
        max_wait: Duration::from_millis(5),
    };
    let bus = EmbeddedBus::new(1, 100).with_fetch(fetch);
    let mut source = bus.subscribe("g").await.unwrap();
    bus.publish_raw("k", b"1").await.unwrap();
    let late = bus.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        late.publish_raw("k", b"2").await.unwrap();
    });
    let started = tokio::time::Instant::now();
    let batch = source.poll(10).await.unwrap();
    assert_eq!(batch.len(), 2, "what came within the wait");
    assert_eq!(started.elapsed(), fetch.max_wait);
    // Enough records: no wait at all.
    for p in [b"3", b"4", b"5"] {
        bus.publish_raw("k", p).await.unwrap();
    }
    let started = tokio::time::Instant::now();
    assert_eq!(source.poll(10).await.unwrap().len(), 3);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn embedded_ledger_conforms() {
    ledger_conformance(|| async { EmbeddedBackend::new().ledger }, 1).await;
}
