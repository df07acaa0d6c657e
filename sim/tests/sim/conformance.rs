//! The models kept honest (DESIGN §9 v2): the simulation's stores — Redis, the ledger and the
//! Kafka log, each behind its network front on a node of its own — pass the same conformance
//! suites as the embedded and the real adapters (`seckill_testkit`), no fault on.

use madsim::net::Endpoint;
use madsim::runtime::Handle;
use seckill_core::adapters::embedded::EmbeddedLedger;
use seckill_core::adapters::script::ScriptedStockCache;
use seckill_sim::faults::Faults;
use seckill_sim::rpc;
use seckill_sim::stores::{
    serve_kafka, serve_ledger, serve_redis, KafkaLog, LedgerLog, Persistence, RedisStore, SimBus, SimLedger,
    SimRedis,
};
use seckill_testkit::{ledger_conformance, order_bus_conformance, stock_cache_conformance};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The ip of a store's fixed address (`rpc::REDIS`, …).
fn ip_of(addr: &str) -> std::net::IpAddr {
    addr.parse::<std::net::SocketAddr>()
        .expect("a store address")
        .ip()
}

/// Run `suite` on a client node, with an endpoint of its own.
async fn on_client<F, Fut>(suite: F)
where
    F: FnOnce(Arc<Endpoint>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let client = Handle::current()
        .create_node()
        .name("client")
        .ip("10.0.9.1".parse().expect("an ip"))
        .build();
    client
        .spawn(async move {
            let ep = Arc::new(Endpoint::bind("10.0.9.1:0").await.expect("bind the client"));
            suite(ep).await
        })
        .await
        .expect("the suite passes");
}

#[madsim::test]
async fn the_simulated_redis_conforms() {
    let store = Arc::new(RedisStore::new(Persistence::Aof, Duration::from_millis(200)));
    Handle::current()
        .create_node()
        .name("redis")
        .ip(ip_of(rpc::REDIS))
        .init(move || serve_redis(store.clone(), Arc::new(Faults::new())))
        .build();
    on_client(|ep| async move {
        stock_cache_conformance(
            || {
                std::future::ready(ScriptedStockCache::new(SimRedis::new(
                    ep.clone(),
                    Arc::new(Faults::new()),
                )))
            },
            1,
        )
        .await
    })
    .await;
}

#[madsim::test]
async fn the_simulated_ledger_conforms() {
    Handle::current()
        .create_node()
        .name("mysql")
        .ip(ip_of(rpc::MYSQL))
        .init(|| {
            serve_ledger(
                EmbeddedLedger::new(),
                Arc::new(Faults::new()),
                Arc::new(LedgerLog::default()),
            )
        })
        .build();
    on_client(|ep| async move {
        ledger_conformance(
            || std::future::ready(SimLedger::new(ep.clone(), Arc::new(Faults::new()))),
            1,
        )
        .await
    })
    .await;
}

/// Every bus the suite asks for is a fresh topic, as the real adapter's suite gets one: the
/// broker node restarts with an empty log.
#[madsim::test]
async fn the_simulated_kafka_conforms() {
    let broker = Handle::current()
        .create_node()
        .name("kafka")
        .ip(ip_of(rpc::KAFKA))
        .init(|| serve_kafka(Arc::new(KafkaLog::new(3)), Arc::new(Faults::new())))
        .build()
        .id();
    on_client(move |ep| async move {
        order_bus_conformance(
            || {
                let ep = ep.clone();
                async move {
                    Handle::current().kill(broker);
                    Handle::current().restart(broker);
                    // The restarted broker binds its address again before the first call.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    SimBus::new(ep)
                }
            },
            1,
        )
        .await
    })
    .await;
}
