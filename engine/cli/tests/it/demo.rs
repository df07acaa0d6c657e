//! `seckill demo`: the library run (sells exactly the stock, or one unit per user when users
//! are fewer) and the binary's flags and output.

use seckill_core::clock::Clock;
use seckill_core::demo::{self, DemoConfig};
use std::process::Command;

async fn sale(users: u64, stock: u64) -> demo::DemoReport {
    let cfg = DemoConfig {
        users,
        stock,
        seed: 7,
        ..DemoConfig::default()
    };
    let clock = Clock::new(1_767_225_600_000, tokio::time::Instant::now());
    demo::run(&cfg, clock, || {}).await.unwrap()
}

#[tokio::test]
async fn sells_exactly_the_stock_when_demand_exceeds_it() {
    let r = sale(20_000, 1_000).await;
    assert_eq!(r.verdict, "ok", "{:?}", r.violations);
    assert_eq!(
        (r.units_sold, r.queued, r.orders_created, r.orders_failed),
        (1_000, 1_000, 1_000, 0)
    );
    assert_eq!(r.units_left_in_redis, 0);
    assert_eq!(r.requests, r.duplicate + r.sold_out + r.unavailable + r.queued);
    assert_eq!(r.unavailable, 0);
}

#[tokio::test]
async fn sells_one_unit_per_user_when_users_are_fewer() {
    let r = sale(300, 1_000).await;
    assert_eq!(r.verdict, "ok", "{:?}", r.violations);
    assert_eq!(r.units_sold, 300);
    assert_eq!(r.units_left_in_redis, 700);
}

fn seckill(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_output_has_the_funnel_and_replays_by_seed() {
    let run = || {
        let out = seckill(&[
            "demo", "--seed", "3", "--users", "2000", "--stock", "100", "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object_mut().unwrap().remove("elapsed_ms");
        v
    };
    let v = run();
    for key in [
        "requests",
        "queued",
        "duplicate",
        "sold_out",
        "orders_created",
        "units_sold",
        "violations",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["units_sold"], 100);
    assert_eq!(v["violations"], serde_json::json!([]));
    assert_eq!(run(), v, "the same seed replays the same sale");
}

#[test]
fn the_table_ends_with_the_verdict() {
    let out = seckill(&["demo", "--users", "500", "--stock", "50", "--buckets", "4"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().last(), Some("invariants: ok"), "{stdout}");
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    for (args, flag) in [
        (vec!["--buckets", "0"], "--buckets"),
        (vec!["--buckets", "1025"], "--buckets"),
        (vec!["--fallback-pct", "51"], "--fallback-pct"),
        (vec!["--stock", "0"], "--stock"),
        (vec!["--users", "-5"], "--users"),
        (vec!["--skew", "1"], "--skew"),
        (vec!["--skew", "abc"], "--skew"),
        (vec!["--clicks-per-user", "0"], "--clicks-per-user"),
        (vec!["--seed", "x"], "--seed"),
        (vec!["--bogus"], "--bogus"),
    ] {
        let mut argv = vec!["demo"];
        argv.extend(&args);
        let out = seckill(&argv);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} ran anyway");
    }
}
