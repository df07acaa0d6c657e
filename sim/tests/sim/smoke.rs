//! The purchase pipeline on embedded ports inside a madsim runtime, on a simulated node.

use seckill_core::demo::DemoConfig;
use seckill_sim::sale_on_embedded_ports;
use std::time::Duration;

#[madsim::test]
async fn purchase_pipeline_runs_in_simulated_time() {
    let handle = madsim::runtime::Handle::current();
    let node = handle
        .create_node()
        .name("engine-1")
        .ip("10.0.1.1".parse().unwrap())
        .build();
    let cfg = DemoConfig {
        seed: handle.seed(),
        users: 3_000,
        stock: 200,
        buckets: 8,
        clicks_per_user: 3,
        ..DemoConfig::default()
    };
    let started = madsim::time::Instant::now();
    let report = node
        .spawn(async move { sale_on_embedded_ports(&cfg).await })
        .await
        .unwrap();
    assert_eq!(report.verdict, "ok", "{:?}", report.violations);
    assert_eq!(report.units_sold, 200);
    assert_eq!(report.queued, 200);
    assert_eq!(report.orders_created, 200);
    // The consumer's final empty poll waited in simulated time, not on the wall clock.
    assert!(madsim::time::Instant::now() - started >= Duration::from_millis(50));
}
