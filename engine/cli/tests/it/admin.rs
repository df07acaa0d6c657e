//! `seckill admin` against a running server's admin listener, as an operator's script runs it:
//! each call's answer and exit code (0 done, 1 refused by the server, 2 not sent).

use serde_json::Value;

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
        out.lines().count(),
        3 + 5,
        "the header lines and 4 buckets + the fallback: {out}"
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
