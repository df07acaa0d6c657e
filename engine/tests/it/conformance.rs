//! The shared conformance suites against the embedded backend.

use seckill_engine::adapters::embedded::{EmbeddedBackend, EmbeddedBus};
use seckill_engine::conformance::{ledger_conformance, order_bus_conformance, stock_cache_conformance};

#[tokio::test]
async fn embedded_stock_cache_conforms() {
    stock_cache_conformance(|| async { EmbeddedBackend::new().cache }, 1).await;
}

#[tokio::test]
async fn embedded_bus_conforms() {
    order_bus_conformance(|| async { EmbeddedBus::new(3, 1_000) }, 1).await;
}

#[tokio::test]
async fn embedded_ledger_conforms() {
    ledger_conformance(|| async { EmbeddedBackend::new().ledger }, 1).await;
}
