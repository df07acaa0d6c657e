//! The foundation's conformance suites, against every real adapter.

use super::{kafka, mysql, redis_cluster, redis_single, unique_id};
use seckill_core::adapters::embedded::key_slot;
use seckill_core::adapters::script::{stock_key, Reply};
use seckill_core::domain::StockPlan;
use seckill_core::ports::StockCache;
use seckill_stores::redis::RedisConn;
use seckill_testkit::{activity, ledger_conformance, order_bus_conformance, stock_cache_conformance};
use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_single_conforms() {
    let Some(cache) = redis_single().await else { return };
    stock_cache_conformance(|| async { cache.clone() }, unique_id()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let Some(cache) = redis_cluster().await else {
        return;
    };
    stock_cache_conformance(|| async { cache.clone() }, unique_id()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_conforms() {
    if kafka("probe").await.is_none() {
        return;
    }
    order_bus_conformance(
        || async { kafka("conformance").await.expect("checked above") },
        unique_id(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_conforms() {
    let Some(ledger) = mysql().await else { return };
    ledger_conformance(|| async { ledger.clone() }, unique_id()).await;
}

/// The per-bucket hash tags spread one activity over the cluster: its 32 buckets live on every
/// one of the 3 masters, and each bucket's keys on one node (asked of the cluster itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_spreads_one_activity_over_its_nodes() {
    let Some(cache) = redis_cluster().await else {
        return;
    };
    let plan = StockPlan::new(&activity(unique_id(), 1_000, 32, 10));
    cache
        .warmup(
            &plan,
            &seckill_core::ports::Intent::FIRST,
            seckill_core::ports::WarmFrom::Plan,
        )
        .await
        .expect("warmup on the cluster");
    let conn: &RedisConn = cache.conn();
    let mut nodes = BTreeSet::new();
    for b in plan.all_buckets() {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("KEYSLOT").arg(stock_key(plan.activity, b));
        let Reply::Int(slot) = conn.query("keyslot", &cmd).await.unwrap() else {
            panic!("keyslot")
        };
        // The embedded cluster shards by the same slot function.
        assert_eq!(i64::from(key_slot(stock_key(plan.activity, b).as_bytes())), slot);
        nodes.insert(node_of_slot(conn, slot).await);
    }
    assert_eq!(
        nodes.len(),
        3,
        "buckets of one activity on {} of 3 masters: {nodes:?}",
        nodes.len()
    );
    let view = cache.snapshot(&plan).await.unwrap();
    assert_eq!(view.buckets.iter().filter_map(|b| b.stock).sum::<i64>(), 1_000);
}

/// `host:port` of the master serving `slot`, from CLUSTER SLOTS.
async fn node_of_slot(conn: &RedisConn, slot: i64) -> String {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let Reply::Array(ranges) = conn.query("slots", &cmd).await.unwrap() else {
        panic!("slots")
    };
    for range in ranges {
        let Reply::Array(r) = range else { continue };
        if let [Reply::Int(lo), Reply::Int(hi), Reply::Array(master), ..] = r.as_slice() {
            if (*lo..=*hi).contains(&slot) {
                if let [Reply::Bulk(host), Reply::Int(port), ..] = master.as_slice() {
                    return format!("{}:{port}", String::from_utf8_lossy(host));
                }
            }
        }
    }
    panic!("no master serves slot {slot}")
}
