//! `seckill admin` against a running server's admin listener, as an operator's script runs it:
//! each call's answer and exit code (0 done, 1 refused by the server, 2 not sent).

use serde_json::{json, Value};

const TOKEN: &str = crate::support::ADMIN_TOKEN;

/// `seckill admin ARGS` with the token in the environment (or `token: None`, without it).
async fn admin(token: Option<&'static str>, args: Vec<String>) -> (Option<i32>, String, String) {
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"));
        cmd.arg("admin").args(&args).env_remove("SECKILL_ADMIN_URL");
        match token {
            Some(t) => cmd.env("SECKILL_ADMIN_TOKEN", t),
            None => cmd.env_remove("SECKILL_ADMIN_TOKEN"),
        };
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_runs_the_operators_calls_with_exit_codes_a_script_can_use() {
    let running = crate::support::embedded_server(&"j".repeat(32), 5, None).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let url = format!("http://{}", running.admin_addr);
    let call = |token: Option<&'static str>, args: &[&str]| {
        let args: Vec<String> = ["--url", url.as_str()]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        admin(token, args)
    };
    let dir = std::env::temp_dir().join(format!("seckill-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, stock: u64| {
        let path = dir.join(name);
        let spec = serde_json::json!({
            "id": 42, "total_stock": stock, "buckets": 4, "fallback_pct": 10,
            "start_ms": now - 1_000, "end_ms": now + 3_600_000, "pay_timeout_ms": 900_000,
        });
        std::fs::write(&path, spec.to_string()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (spec, other) = (write("sale.json", 100), write("other.json", 200));
    let spec = spec.as_str();
    let (code, out, err) = call(Some(TOKEN), &["--json", "create", spec]).await;
    assert_eq!(code, Some(0), "{err}");
    let created: Value = serde_json::from_str(&out).expect("--json prints the answer as JSON");
    assert_eq!(created["id"], 42, "{out}");
    let (code, _, err) = call(Some(TOKEN), &["create", spec]).await;
    assert_eq!(
        code,
        Some(0),
        "creating again with the same plan is idempotent: {err}"
    );
    let (code, _, err) = call(Some(TOKEN), &["create", &other]).await;
    assert_eq!(
        code,
        Some(1),
        "the same id with another plan is refused by the server: {err}"
    );
    assert!(err.contains("409"), "{err}");

    let (code, out, err) = call(Some(TOKEN), &["list"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().take(2).eq(["42", "open"])),
        "{out}"
    );
    let (code, out, err) = call(Some(TOKEN), &["show", "42"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("activity 42: open (version 1, generation 0)\n100 units in 4 buckets"),
        "{out}"
    );
    assert_eq!(
        out.lines().nth(2),
        Some("funnel: 100 units: 100 in Redis, 0 queued, 0 sold (0 cancelled orders); consumer lag 0"),
        "{out}"
    );
    assert_eq!(
        out.lines().count(),
        4 + 5,
        "the header lines (no recovery) and 4 buckets + the fallback: {out}"
    );
    let (code, out, err) = call(Some(TOKEN), &["--json", "show", "42"]).await;
    assert_eq!(code, Some(0), "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    let stock: i64 = (shown["buckets"].as_array().unwrap().iter())
        .map(|b| b["stock"].as_i64().unwrap())
        .sum();
    assert_eq!(stock, 100, "every unit in Redis before a sale: {out}");
    for step in ["pause", "resume", "reconcile"] {
        let (code, _, err) = call(Some(TOKEN), &[step, "42"]).await;
        assert_eq!(code, Some(0), "{step}: {err}");
    }
    let (code, out, err) = call(Some(TOKEN), &["audit", "42"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().any(|l| l == "verdict: ok"), "{out}");
    let (code, out, err) = call(Some(TOKEN), &["order", "42", "7"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines().any(|l| l == "state: none"),
        "user 7 holds no order: {out}"
    );

    // Refused by the server: a wrong token, an activity it does not know.
    let (code, _, err) = call(Some("not-the-admin-token"), &["pause", "42"]).await;
    assert_eq!(
        (
            code,
            err.contains("403 forbidden: authorization: wrong admin token")
        ),
        (Some(1), true),
        "{err}"
    );
    let (code, _, err) = call(Some(TOKEN), &["pause", "43"]).await;
    assert_eq!((code, err.contains("404")), (Some(1), true), "{err}");
    // Not sent, naming what is wrong.
    let (code, _, err) = call(None, &["pause", "42"]).await;
    assert_eq!(
        (code, err.contains("SECKILL_ADMIN_TOKEN")),
        (Some(2), true),
        "{err}"
    );
    let (code, _, err) = call(Some(TOKEN), &["cancel", "42"]).await;
    assert_eq!((code, err.contains("reservation")), (Some(2), true), "{err}");
    let (code, _, err) = call(Some(TOKEN), &["create", "/nonexistent/sale.json"]).await;
    assert_eq!(
        (code, err.contains("/nonexistent/sale.json")),
        (Some(2), true),
        "{err}"
    );
    let (code, _, err) = call(Some(TOKEN), &["pause", "0"]).await;
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = admin(
        Some(TOKEN),
        vec![
            "--url".into(),
            "http://127.0.0.1:1".into(),
            "pause".into(),
            "42".into(),
        ],
    )
    .await;
    assert_eq!((code, err.contains("127.0.0.1:1")), (Some(2), true), "{err}");

    let _ = std::fs::remove_dir_all(&dir);
    running.shutdown().await.unwrap();
}

/// A record the order consumer could not apply — here a buyer's reservation that a worker of
/// another engine version could not read during a rolling upgrade, and a malformed record — is
/// listed with its reason and shown; a replay turns the reservation into its order once (a second
/// replay publishes nothing) and says the malformed one still does not decode; a purge asks for
/// its confirmation, then empties the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_replayed_into_their_order_once_and_purged() {
    use crate::http_sale::http;
    use seckill_core::domain::{ActivityId, UserId};
    use seckill_core::ports::{Ledger, OrderBus, OrderSource};
    use seckill_core::roles::Roles;
    use seckill_core::service::consumer::ORDER_GROUP;
    let secret = "d".repeat(32);
    let stores = seckill_core::adapters::embedded::EmbeddedBackend::new();
    // The buyers' side alone: no worker yet, and no jobs (whose reconciler would republish the
    // open reservation by itself after two seconds).
    let api_only = Roles {
        api: true,
        worker: false,
        jobs: false,
    };
    let front = crate::support::server_on(&stores, api_only, &secret, 11, Some((8, 10, 2))).await;
    let url = format!("http://{}", front.admin_addr);
    let call = |args: &[&str]| {
        let args: Vec<String> = ["--url", url.as_str()]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        admin(Some(TOKEN), args)
    };
    let me = crate::support::user_jwt(&secret, 5);
    let (s, t) = http(front.addr, "POST", "/api/v1/activities/8/token", None, &me).await;
    assert_eq!(s, 200, "{t}");
    let buy = serde_json::json!({ "token": t["token"] });
    let (s, q) = http(
        front.addr,
        "POST",
        "/api/v1/activities/8/purchase",
        Some(&buy),
        &me,
    )
    .await;
    assert_eq!(s, 202, "{q}");
    let rid = q["reservation_id"].as_str().unwrap().to_string();

    // A worker of another version takes the record, cannot read it, dead-letters it, moves on.
    let mut old = stores.bus.subscribe(ORDER_GROUP).await.unwrap();
    let got = old.poll(10).await.unwrap();
    assert_eq!(got.len(), 1);
    old.dead_letter(&got[0], "unknown variant `v9` (a worker of engine 0.9)")
        .await
        .unwrap();
    old.commit(&got).await.unwrap();
    drop(old);
    // This version's worker, and a record nobody can read.
    let worker = Roles {
        api: false,
        worker: true,
        jobs: false,
    };
    let back = crate::support::server_on(&stores, worker, &secret, 12, None).await;
    stores.bus.publish_raw("8.0", b"{not json").await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stores.bus.all_dead_letters().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the malformed record is dead-lettered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let (code, out, err) = call(&["dead-letters", "list"]).await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "2 of 2 dead letters", "{out}");
    assert!(lines[1].trim_start().starts_with("0/0  orders/"), "{out}");
    assert!(
        lines[1].ends_with("unknown variant `v9` (a worker of engine 0.9)"),
        "{out}"
    );
    assert!(lines[2].contains("malformed order event"), "{out}");
    let (code, out, err) = call(&["--json", "dlq", "show", "0/0"]).await;
    assert_eq!(code, Some(0), "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["reservation"]["id"], rid.as_str(), "{out}");
    let (code, _, err) = call(&["dead-letters", "show", "0/9"]).await;
    assert_eq!((code, err.contains("404")), (Some(1), true), "{err}");
    let (code, _, err) = call(&["dead-letters", "show", "zero"]).await;
    assert_eq!((code, err.contains("PARTITION/OFFSET")), (Some(2), true), "{err}");

    let (code, out, err) = call(&["--json", "dead-letters", "replay", "--all"]).await;
    assert_eq!(code, Some(0), "{err}");
    let replayed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            &replayed["replayed"],
            &replayed["already_orders"],
            &replayed["undecodable"]
        ),
        (&json!(1), &json!(0), &json!(1)),
        "{out}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let order = loop {
        if let Some(o) = stores.ledger.order_of(ActivityId(8), UserId(5)).await.unwrap() {
            break o;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replayed reservation becomes an order"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(order.reservation.id.to_string(), rid);
    // The buyer sees it as their order.
    let (s, mine) = http(front.addr, "GET", "/api/v1/activities/8/orders/5", None, &me).await;
    assert_eq!(
        (s, mine["reservation_id"].as_str()),
        (200, Some(rid.as_str())),
        "{mine}"
    );
    // Again: the ledger holds it, nothing is published.
    let (code, out, err) = call(&["dead-letters", "replay", "0/0"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("replayed 0, already orders 1, undecodable 0\n"),
        "{out}"
    );
    assert_eq!(
        stores.ledger.snapshot(ActivityId(8)).await.unwrap().orders.len(),
        1,
        "one order"
    );
    let (code, out, err) = call(&["audit", "8"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = call(&["show", "8"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "\nfunnel: 10 units: 9 in Redis, 0 queued, 1 sold (0 cancelled orders); consumer lag 0\n"
        ),
        "{out}"
    );

    // A purge is confirmed (no terminal here: only by --yes), then empties the topic.
    let (code, _, err) = call(&["dead-letters", "purge"]).await;
    assert_eq!(
        (code, err.contains("2 dead letters would be deleted")),
        (Some(2), true),
        "{err}"
    );
    assert_eq!(
        stores.bus.all_dead_letters().len(),
        2,
        "nothing deleted unconfirmed"
    );
    let (code, out, err) = call(&["dead-letters", "purge", "--yes"]).await;
    assert_eq!((code, out.trim()), (Some(0), "purged: 2"), "{err}");
    let (code, out, _) = call(&["dead-letters", "list"]).await;
    assert_eq!((code, out.trim()), (Some(0), "0 of 0 dead letters"));

    // A recovery that bumped the generation and stopped before reopening (no jobs role here to
    // take it over): `show` says where it stands.
    stores
        .ledger
        .bump_generation(ActivityId(8), 0)
        .await
        .unwrap()
        .unwrap();
    let (code, out, err) = call(&["show", "8"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("\nrecovery: claim none; 0 of 3 gates recovering, 0 at generation 1, 0 missing\n"),
        "{out}"
    );

    back.shutdown().await.unwrap();
    front.shutdown().await.unwrap();
}

/// The admin listener's metrics name the build and the roles it runs, and the process's CPU,
/// memory and open files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_the_build_and_the_process() {
    let running = crate::support::embedded_server(&"m".repeat(32), 13, None).await;
    let mut stream = tokio::net::TcpStream::connect(running.admin_addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let build = format!(
        "seckill_build_info{{version=\"{}\",revision=\"unknown\",roles=\"api,worker,jobs\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.lines().any(|l| l == build), "{build}: {text}");
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.lines().any(|l| l.starts_with(process)), "{process}: {text}");
    }
    running.shutdown().await.unwrap();
}

/// A list of every installed sale passes a megabyte long before an operator stops selling: the
/// admin command reads it whole (4,600 sales on one database once made it refuse the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_of_sales_is_read_whatever_its_size() {
    use seckill_core::domain::StockPlan;
    use seckill_core::ports::Ledger;
    let stores = seckill_core::adapters::embedded::EmbeddedBackend::new();
    let sales = 6_000u64;
    for id in 1..=sales {
        let activity = seckill_testkit::activity(1_000_000 + id, 100, 4, 10);
        stores
            .ledger
            .install(&activity, &StockPlan::new(&activity))
            .await
            .unwrap();
    }
    let running = crate::support::server_on(
        &stores,
        seckill_core::roles::Roles::ALL,
        &"l".repeat(32),
        14,
        None,
    )
    .await;
    let url = format!("http://{}", running.admin_addr);
    let (code, out, err) = admin(
        Some(TOKEN),
        vec!["--url".into(), url, "--json".into(), "list".into()],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.len() > 1 << 20, "the answer is {} bytes", out.len());
    let listed: Value = serde_json::from_str(&out).expect("--json prints the answer as JSON");
    let n = listed
        .as_array()
        .or_else(|| listed["activities"].as_array())
        .map_or(0, Vec::len);
    assert_eq!(n as u64, sales, "{}", &out[..200]);
}
