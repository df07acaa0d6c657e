//! The whole pipeline on the real stores, through the `seckill` binary: a demo sale through Redis
//! → Kafka → MariaDB, then `seckill audit` on it — clean, and after a bucket is corrupted by hand.

use super::{service, unique_id};
use serde_json::Value;
use std::process::{Command, Output};

/// `seckill ARGS` with the service settings of this process and a topic of the test's own.
fn seckill(args: &[&str], topic: &str, extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_seckill"));
    cmd.args(args).env("SECKILL_TOPIC", topic);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().expect("run seckill")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn demo_json(activity: u64, args: &[&str], topic: &str, env: &[(&str, &str)]) -> Value {
    let id = activity.to_string();
    let mut all = vec!["demo", "--backend", "real", "--json", "--activity", &id];
    all.extend_from_slice(args);
    let out = seckill(&all, topic, env);
    assert!(out.status.success(), "demo failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("demo --json prints one JSON object")
}

#[test]
fn demo_sells_out_on_real_stores_and_audit_names_a_corrupted_bucket() {
    let (Some(redis_url), Some(_), Some(_)) = (
        service("REDIS_URL"),
        service("KAFKA_BROKERS"),
        service("DATABASE_URL"),
    ) else {
        return;
    };
    let activity = unique_id();
    let topic = format!("seckill.test.e2e.{activity}");
    let report = demo_json(
        activity,
        &["--users", "20000", "--stock", "1000", "--buckets", "32"],
        &topic,
        &[],
    );
    assert_eq!(report["units_sold"], 1000, "{report}");
    assert_eq!(report["orders_created"], 1000, "{report}");
    assert_eq!(report["verdict"], "ok", "{report}");

    let id = activity.to_string();
    let audit = seckill(&["audit", "--activity", &id], &topic, &[]);
    let shown = text(&audit);
    assert!(audit.status.success(), "audit of a clean sale: {shown}");
    assert!(
        shown.contains("R1 reconciliation") && shown.contains("invariants: ok"),
        "{shown}"
    );

    // Corrupt bucket 3 by hand: five units appear in Redis that the ledger never had.
    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let _: i64 = redis::cmd("INCRBY")
        .arg(format!("sk:{{{activity}.3}}:stock"))
        .arg(5)
        .query(&mut conn)
        .unwrap();
    let audit = seckill(&["audit", "--activity", &id], &topic, &[]);
    let shown = text(&audit);
    assert_eq!(audit.status.code(), Some(1), "audit must fail: {shown}");
    assert!(
        shown.contains("R1 reconciliation                  VIOLATED"),
        "{shown}"
    );
    assert!(shown.contains("(bucket 3)"), "the bucket is named: {shown}");
    assert_eq!(shown.matches("(bucket ").count(), 1, "only bucket 3: {shown}");

    // The reconciler reports the difference and does not "fix" it.
    let rec = seckill(&["reconcile", "--activity", &id], &topic, &[]);
    let shown = text(&rec);
    assert_eq!(rec.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains("bucket 3: redis and ledger differ by +5 units"),
        "{shown}"
    );
    let stock: i64 = redis::cmd("GET")
        .arg(format!("sk:{{{activity}.3}}:stock"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(stock, 5, "the reconciler never resets Redis stock");
}

#[test]
fn demo_sells_out_on_the_redis_cluster() {
    let (Some(_), Some(_), Some(_)) = (
        service("REDIS_CLUSTER_NODES"),
        service("KAFKA_BROKERS"),
        service("DATABASE_URL"),
    ) else {
        return;
    };
    let activity = unique_id();
    let topic = format!("seckill.test.e2e.{activity}");
    let report = demo_json(
        activity,
        &["--users", "5000", "--stock", "500", "--buckets", "16"],
        &topic,
        &[("SECKILL_REDIS_CLUSTER", "1")],
    );
    assert_eq!(report["units_sold"], 500, "{report}");
    assert_eq!(report["verdict"], "ok", "{report}");
}

#[test]
fn bad_settings_are_named_and_nothing_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["audit", "--activity", "1"])
        .env("REDIS_URL", "http://127.0.0.1:6379")
        .env("KAFKA_BROKERS", "127.0.0.1:9092")
        .env("DATABASE_URL", "mysql://u@127.0.0.1/d")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("REDIS_URL: \"http://127.0.0.1:6379\" is not a redis:// URL"),
        "{}",
        text(&out)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["audit", "--activity", "1"])
        .env_remove("REDIS_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_CLUSTER_NODES")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("no stores configured"), "{}", text(&out));
}
