//! `seckill plan`, `seckill load` and `seckill bench` as a user runs them.

use crate::real::service;
use seckill::cli::measure::load::{self, LoadConfig, Target};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

fn seckill(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn plan_reproduces_the_seeds_tables_and_refuses_bad_flags() {
    let (code, out, _) = seckill(&["plan", "--preset", "seed-funnel-500k", "--json"]);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&out).unwrap();
    let nodes: Vec<Value> = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["nodes"].clone())
        .collect();
    assert_eq!(
        nodes,
        serde_json::json!([20, null, 40, 3, null, 1])
            .as_array()
            .unwrap()
            .clone()
    );
    let (code, out, _) = seckill(&["plan", "--preset", "seed-100k"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("gateway") && out.contains("short stave"), "{out}");
    let (code, _, err) = seckill(&["plan", "--preset", "nope"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--preset"), "{err}");
    let (code, _, err) = seckill(&["plan", "--preset", "seed-100k", "--safety", "0.5"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--safety"), "{err}");
}

#[test]
fn load_refuses_a_non_loopback_url() {
    let (code, _, err) = seckill(&["load", "--url", "http://10.1.2.3:80", "--activity", "1"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--url") && err.contains("loopback"), "{err}");
}

/// `seckill load` as a team points it at their servers: several API processes (here one server
/// under two names), the JWT secret from a file; a server that is not on loopback only with
/// `--remote`, and a short secret file named as the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_spreads_over_several_urls_with_the_secret_from_a_file() {
    let secret = "s".repeat(32);
    let running = crate::support::embedded_server(&secret, 4, Some((11, 100, 4))).await;
    let port = running.addr.port();
    let dir = std::env::temp_dir().join(format!("seckill-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (good, short) = (dir.join("jwt.key"), dir.join("short.key"));
    std::fs::write(&good, format!("{secret}\n")).unwrap();
    std::fs::write(&short, "too-short").unwrap();
    let urls = format!("http://127.0.0.1:{port},http://localhost:{port}");
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            seckill(&args)
        })
    };
    let args = |key: &std::path::Path, url: &str| -> Vec<String> {
        [
            "load",
            "--activity",
            "11",
            "--users",
            "300",
            "--connections",
            "4",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--url".into(),
            url.into(),
            "--jwt-secret-file".into(),
            key.display().to_string(),
        ])
        .collect()
    };
    let (code, out, err) = run(args(&good, &urls)).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["config"]["addrs"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(
        v["by_status"]["202"], 100,
        "the stock queued, through both names: {out}"
    );
    assert_eq!(v["errors"], 0, "{out}");

    let (code, _, err) = run(args(&short, &urls)).await.unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--jwt-secret-file") && err.contains("short.key"),
        "{err}"
    );
    let (code, _, err) = run(args(&good, "http://10.255.255.1:8080")).await.unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--remote"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    running.shutdown().await.unwrap();
}

/// `seckill load` with the login service's JWTs from a file instead of a key to mint them: its
/// users are the tokens' subjects; a line that is not a JWT is refused by its number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_buys_with_the_jwts_of_a_file() {
    let secret = "f".repeat(32);
    let running = crate::support::embedded_server(&secret, 6, Some((12, 100, 4))).await;
    let dir = std::env::temp_dir().join(format!("seckill-jwts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (good, bad) = (dir.join("jwts.txt"), dir.join("bad.txt"));
    let tokens: Vec<String> = (1_001..=1_150)
        .map(|u| crate::support::user_jwt(&secret, u))
        .collect();
    std::fs::write(
        &good,
        format!("# issued for the load test\n{}\n", tokens.join("\n")),
    )
    .unwrap();
    std::fs::write(&bad, format!("{}\nnot-a-jwt\n", tokens[0])).unwrap();
    let url = format!("http://{}", running.addr);
    let run = |file: std::path::PathBuf| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let file = file.display().to_string();
            seckill(&[
                "load",
                "--activity",
                "12",
                "--connections",
                "4",
                "--json",
                "--url",
                &url,
                "--jwts-file",
                &file,
            ])
        })
    };
    let (code, out, err) = run(good).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["config"]["users"], 150, "{out}");
    assert_eq!(v["by_status"]["202"], 100, "the stock queued: {out}");
    assert_eq!(v["errors"], 0, "{out}");
    let (code, _, err) = run(bad).await.unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad.txt: line 2"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    running.shutdown().await.unwrap();
}

/// A sale driven by `seckill load`'s engine against the API on a socket: the funnel adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_drives_a_sale_and_reports_the_funnel() {
    let running = crate::support::embedded_server(&"j".repeat(32), 3, Some((9, 200, 8))).await;
    let cfg = LoadConfig {
        addrs: vec![running.addr],
        activity: 9,
        users: 1_000,
        connections: 8,
        rate: 0,
        duration: Duration::from_secs(60),
        skew: 0.5,
        clicks_per_user: 2,
        seed: 1,
        target: Target::Purchase,
        jwt_secret: "j".repeat(32),
        jwt_issuer: None,
        jwt_audience: None,
        jwts: None,
    };
    let r = load::run(&cfg, || {}).await.unwrap();
    assert!(r.completed);
    assert_eq!(r.errors, 0);
    assert_eq!(
        r.by_status.get(&202),
        Some(&200),
        "exactly the stock queued: {r:?}"
    );
    let clicks = load::clicks(&cfg, 8).len() as u64;
    let answered: u64 = r.by_status.values().sum::<u64>() + r.tokens_refused.values().sum::<u64>();
    assert_eq!(answered, clicks, "every click answered once: {r:?}");
    assert!(
        r.latency_us_p50 > 0 && r.latency_us_p50 <= r.latency_us_p99 && r.latency_us_p99 <= r.latency_us_max
    );
    running.shutdown().await.unwrap();
}

/// `load --stages` starts its own API, worker and jobs processes on the real stores and runs the
/// seeds' three stages: every purchase of stages 1 and 2 is queued (two units per user), and the
/// funnel at peak ends at rest with the ledger holding exactly what was queued, audited clean.
#[test]
fn load_stages_runs_the_three_stages_on_the_real_stores() {
    let (code, _, err) = seckill(&["load", "--stages", "--activity", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--activity"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["load", "--stages"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("REDIS_URL"));
    if service("REDIS_URL").is_none()
        || service("KAFKA_BROKERS").is_none()
        || service("DATABASE_URL").is_none()
    {
        return;
    }
    let png = std::env::temp_dir().join(format!("seckill-stages-{}.png", std::process::id()));
    let (code, out, err) = seckill(&[
        "load",
        "--stages",
        "--users",
        "600",
        "--connections",
        "8",
        "--json",
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(std::fs::metadata(&png).unwrap().len() > 1000, "a PNG chart");
    let _ = std::fs::remove_file(&png);
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let apis: Vec<u64> = rows
        .iter()
        .map(|r| r["api_processes"].as_u64().unwrap())
        .collect();
    assert_eq!(apis, [1, 1, 2, 3]);
    for r in rows {
        assert_eq!(r["queued"], 600, "two units for every user: {r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["api_cpu_s"].as_f64().unwrap() > 0.0, "{r}");
        let q = &r["queued_to_order"];
        assert_eq!(q["orders"], 600, "the wait measured over every order: {r}");
        let (p50, p99) = (q["p50_ms"].as_i64().unwrap(), q["p99_ms"].as_i64().unwrap());
        assert!(
            0 <= p50 && p50 <= p99 && p99 <= q["max_ms"].as_i64().unwrap(),
            "{r}"
        );
    }
    let f = &v["funnel"];
    assert_eq!(f["audit"], "ok", "{f}");
    assert_eq!(
        f["purchases"]["202"], f["units_sold"],
        "every queued purchase is an order: {f}"
    );
    assert_eq!(f["queued_to_order"]["orders"], f["units_sold"], "{f}");
    assert!(
        f["units_sold"].as_u64().unwrap() <= f["stock"].as_u64().unwrap(),
        "{f}"
    );
    let answered: u64 = ["tokens_refused", "purchases"]
        .iter()
        .flat_map(|k| f[k].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        answered + f["errors"].as_u64().unwrap(),
        f["clicks"].as_u64().unwrap(),
        "{f}"
    );
}

#[test]
fn bench_runs_the_strategies_side_by_side_and_counts_oversells() {
    if service("REDIS_URL").is_none()
        || service("KAFKA_BROKERS").is_none()
        || service("DATABASE_URL").is_none()
    {
        return;
    }
    let png = std::env::temp_dir().join(format!("seckill-bench-{}.png", std::process::id()));
    let png_arg = png.to_str().unwrap();
    let args = [
        "bench",
        "--seconds",
        "0.3",
        "--concurrency",
        "4",
        "--orders",
        "50",
        "--only",
        "Lua",
    ];
    let (code, out, err) = seckill(&[&args[..], &["--json", "--plot", png_arg]].concat());
    assert_eq!(code, Some(0), "{err}");
    let chart = std::fs::read(&png).unwrap();
    let _ = std::fs::remove_file(&png);
    assert!(
        chart.starts_with(b"\x89PNG") && chart.len() > 1_000,
        "a PNG chart"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"redis: Lua, one key") && names.contains(&"redis: Lua, 32 buckets"),
        "{names:?}"
    );
    for r in rows {
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["oversold"], 0, "an atomic script never oversells: {r}");
    }
    assert_eq!(rows[0]["ratio"], 1.0);
    // The output feeds the planner.
    let path = std::env::temp_dir().join(format!("seckill-bench-{}.json", std::process::id()));
    std::fs::write(&path, &out).unwrap();
    let (code, plan, err) = seckill(&[
        "plan",
        "--preset",
        "seed-100k",
        "--from-bench",
        path.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(plan.contains("redis (32 buckets)"), "{plan}");
}

/// `seckill bench --seconds 0.3 ARGS --json` on the real stores (`None` without them): its rows
/// and their names.
fn bench_rows(args: &[&str]) -> Option<(Vec<Value>, Vec<String>)> {
    if service("REDIS_URL").is_none()
        || service("KAFKA_BROKERS").is_none()
        || service("DATABASE_URL").is_none()
    {
        return None;
    }
    let (code, out, err) = seckill(&[&["bench", "--seconds", "0.3", "--json"], args].concat());
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap().clone();
    let names = rows
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    Some((rows, names))
}

/// The limits the engine is compared with run in the same `bench`: one Redis core's pipelined
/// scripts and the ledger's batched apply alone.
#[test]
fn bench_measures_the_limits_beside_the_engine() {
    let args = ["--concurrency", "4", "--orders", "600", "--only", "limit"];
    let Some((rows, names)) = bench_rows(&args) else {
        return;
    };
    assert_eq!(
        names,
        [
            "limit: Redis, EVALSHA reserve.lua pipelined 16 deep",
            "limit: MariaDB, the ledger's batched apply alone"
        ]
    );
    for r in rows {
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ops"].as_u64().unwrap() >= 16, "{r}");
    }
}

/// The HTTP rows run in the same `bench`: hello world, then the purchase route, on a server of
/// this binary per backend (started and stopped by the bench), every answer the route's success.
#[test]
fn bench_measures_the_http_route_beside_hello_world() {
    let Some((rows, names)) = bench_rows(&["--only", "http:"]) else {
        return;
    };
    assert_eq!(
        names,
        [
            "http: GET /healthz, embedded stores",
            "http: token, sold out, embedded stores",
            "http: token + purchase, embedded stores",
            "http: GET /healthz, Redis + Kafka + MariaDB",
            "http: token + purchase, Redis + Kafka + MariaDB",
        ]
    );
    for r in rows {
        assert!(r["ops"].as_u64().unwrap() > 64, "{r}");
        assert_eq!(r["errors"], 0, "every answer the route's success: {r}");
        assert!(
            r["p99_us"].as_u64().unwrap() >= r["p50_us"].as_u64().unwrap(),
            "{r}"
        );
    }
}

/// Counted instead of timed: the real stores' HTTP rows under valgrind's callgrind, the API and
/// the worker each in a process of its own, report instructions per request and per order
/// applied.
#[test]
fn bench_counts_the_http_routes_instructions() {
    let Some((rows, names)) = bench_rows(&["--only", "Redis + Kafka", "--instructions", "1000"]) else {
        return;
    };
    assert_eq!(
        names,
        [
            "http: GET /healthz, Redis + Kafka + MariaDB",
            "http: token + purchase, Redis + Kafka + MariaDB",
            "http: worker, order applied, Redis + Kafka + MariaDB",
        ]
    );
    let count = |r: &Value| r["instructions"].as_u64().unwrap_or_else(|| panic!("{r}"));
    // A purchase request (a JWT checked, a token made or checked, a script, a publish) is tens
    // of thousands of the API process's instructions, and far from a million (which would be
    // its idle upkeep counted in); an order applied, thousands of the worker's. (Hello world on
    // the real stores is counted too, but its figure is mostly the estimate of the API
    // process's upkeep, which it is taken less of: not asserted.)
    assert!(rows[0]["instructions"].is_u64(), "{}", rows[0]);
    assert!((10_000..1_000_000).contains(&count(&rows[1])), "{}", rows[1]);
    assert!((1_000..1_000_000).contains(&count(&rows[2])), "{}", rows[2]);
    // Under valgrind a slowed server may leave a purchase unanswered on a busy box: the row
    // counts what was asked; the worker's, the orders queued.
    let (requests, applied) = (rows[1]["ops"].as_u64().unwrap(), rows[2]["ops"].as_u64().unwrap());
    assert!(
        applied > 0 && applied <= requests / 2,
        "a click is two requests, one order at most: {rows:?}"
    );
}

/// Every systemd unit of `deploy/systemd/`, run as the unit runs it (its `ExecStart` arguments)
/// with only the settings file's environment, passes `serve --check-config` for its role once
/// its placeholders are replaced — and is refused as shipped, naming the first placeholder
/// secret; a bad value in that file is refused by name.
#[test]
fn the_systemd_units_and_their_settings_pass_check_config() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
    let env_text = std::fs::read_to_string(dir.join("seckill.env.example")).unwrap();
    let example: Vec<(String, String)> = env_text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=value");
            (k.to_string(), v.to_string())
        })
        .collect();
    // As an operator fills it in: every CHANGE-ME replaced by a secret of their own.
    let env: Vec<(String, String)> = example
        .iter()
        .map(|(k, v)| (k.clone(), v.replace("CHANGE-ME", "q7Fh2kLx9TzW")))
        .collect();
    let check = |args: &[String], env: &[(String, String)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(args)
            .arg("--check-config")
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut roles = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        let unit = std::fs::read_to_string(&path).unwrap();
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("an ExecStart line");
        let args: Vec<String> = exec.split_whitespace().skip(1).map(String::from).collect();
        let role = args.last().unwrap().clone();
        let (code, out, err) = check(&args, &env);
        assert_eq!(code, Some(0), "{}: {out}{err}", path.display());
        assert!(out.contains(&format!("roles {role}")), "{out}");
        assert!(
            out.contains("stores real") && out.contains("x24 partitions, replication 3"),
            "{out}"
        );
        roles.push(role);
    }
    roles.sort();
    assert_eq!(roles, ["api", "jobs", "worker"]);
    // A ledger connection that does not verify its server is refused by name, unless accepted
    // explicitly (then said loudly); on loopback nobody is on the path.
    let with_db = |url: &str, allow: Option<&str>| {
        let mut e: Vec<(String, String)> = (env.iter())
            .filter(|(k, _)| k != "DATABASE_URL")
            .cloned()
            .collect();
        e.push(("DATABASE_URL".into(), url.into()));
        e.extend(allow.map(|a| ("SECKILL_MYSQL_ALLOW_UNVERIFIED".to_string(), a.to_string())));
        check(&["serve".into()], &e)
    };
    let plain = "mysql://seckill:q7Fh2kLx9TzW@mysql.internal:3306/seckill";
    let (code, _, err) = with_db(plain, None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("DATABASE_URL: no ssl-mode") && err.contains("SECKILL_MYSQL_ALLOW_UNVERIFIED=1"),
        "{err}"
    );
    let (code, _, err) = with_db(&format!("{plain}?ssl-mode=required"), None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ssl-mode=required does not verify"), "{err}");
    let (code, out, err) = with_db(plain, Some("1"));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("warning: DATABASE_URL: no ssl-mode"), "{out}");
    let (code, _, err) = with_db(plain, Some("yes"));
    assert_eq!(
        (
            code,
            err.contains("SECKILL_MYSQL_ALLOW_UNVERIFIED: must be 1 or 0")
        ),
        (Some(2), true),
        "{err}"
    );
    let (code, out, err) = with_db("mysql://seckill:q7Fh2kLx9TzW@127.0.0.1:3306/seckill", None);
    assert_eq!(code, Some(0), "{out}{err}");
    // A public listener that believes no proxy is allowed, and said loudly.
    let mut direct: Vec<(String, String)> = (env.iter())
        .filter(|(k, _)| k != "SECKILL_TRUSTED_PROXIES" && k != "SECKILL_LISTEN")
        .cloned()
        .collect();
    direct.push(("SECKILL_LISTEN".into(), "0.0.0.0:8080".into()));
    let (code, out, err) = check(&["serve".into()], &direct);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("warning: listen 0.0.0.0:8080 is off loopback and trusted_proxies is empty"),
        "{out}"
    );

    let (code, _, err) = check(&["serve".into()], &example);
    assert_eq!(code, Some(2), "the example's placeholders must be refused: {err}");
    assert!(
        err.contains("SECKILL_ADMIN_TOKEN") && err.contains("placeholder"),
        "{err}"
    );
    let mut bad = env.clone();
    bad.push(("SECKILL_TOPIC_PARTITIONS".into(), "0".into()));
    let (code, _, err) = check(&["serve".into()], &bad);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("SECKILL_TOPIC_PARTITIONS"), "{err}");
    let short: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| k != "SECKILL_JWT_SECRET")
        .cloned()
        .collect();
    let (code, _, err) = check(&["serve".into()], &short);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("jwt_secret"), "{err}");
    // The same secret from a file (a mounted Secret), or from systemd's credentials directory.
    let dir = std::env::temp_dir().join(format!("seckill-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwt = env
        .iter()
        .find(|(k, _)| k == "SECKILL_JWT_SECRET")
        .unwrap()
        .1
        .clone();
    std::fs::write(dir.join("SECKILL_JWT_SECRET"), format!("{jwt}\n")).unwrap();
    for (var, value) in [
        ("SECKILL_JWT_SECRET_FILE", dir.join("SECKILL_JWT_SECRET")),
        ("CREDENTIALS_DIRECTORY", dir.clone()),
    ] {
        let mut from_file = short.clone();
        from_file.push((var.into(), value.display().to_string()));
        let (code, out, err) = check(&["serve".into()], &from_file);
        assert_eq!(code, Some(0), "{var}: {out}{err}");
    }
    let mut missing = short.clone();
    missing.push(("SECKILL_JWT_SECRET_FILE".into(), "/nonexistent/jwt".into()));
    let (code, _, err) = check(&["serve".into()], &missing);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SECKILL_JWT_SECRET_FILE") && err.contains("/nonexistent/jwt"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Flags are a source like the others, validated with them: a --listen on the admin
    // listener's address is refused, naming both.
    let admin = env
        .iter()
        .find(|(k, _)| k == "SECKILL_ADMIN_LISTEN")
        .map_or("127.0.0.1:9090".to_string(), |(_, v)| v.clone());
    let (code, _, err) = check(&["serve".into(), "--listen".into(), admin], &env);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SECKILL_ADMIN_LISTEN") || err.contains("admin_listen"),
        "{err}"
    );
    assert!(err.contains("(--listen)"), "{err}");
}

/// `SECKILL_PLANTED` and `SECKILL_STALLS` (the real-store nemesis's planted bugs and fault
/// points) are refused by a build without the `planted` feature, naming the variable — a release
/// build, or `-p seckill` alone; a workspace build has it (the simulation asks for it, cargo
/// unifies it) and warns that the bug is on. An unknown bug, or a seed that is no number, is
/// refused by name either way.
#[test]
fn a_planted_bug_is_refused_by_a_build_without_the_feature() {
    let run = |var: &str, value: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(["serve", "--check-config"])
            .env_clear()
            .env(var, value)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let serve = |planted: &str| run("SECKILL_PLANTED", planted);
    let (code, err) = serve("no_generation_check");
    if seckill_core::planted::enabled() {
        assert!(err.contains("planted bug 'no_generation_check' is on"), "{err}");
    } else {
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("SECKILL_PLANTED") && err.contains("without the `planted` feature"),
            "{err}"
        );
    }
    let (code, err) = serve("no_such_bug");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SECKILL_PLANTED: no planted bug named 'no_such_bug'"),
        "{err}"
    );

    let (code, err) = run("SECKILL_STALLS", "7:recovery_bump");
    if seckill_core::planted::enabled() {
        assert!(
            err.contains("fault points are armed (seed 7, long: 'recovery_bump')"),
            "{err}"
        );
    } else {
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("SECKILL_STALLS: this binary was built without the `planted` feature"),
            "{err}"
        );
    }
    let (code, err) = run("SECKILL_STALLS", "soon");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SECKILL_STALLS: expected <seed>[:<site>,...]"),
        "{err}"
    );
    let (code, err) = run("SECKILL_STALLS", "7:recovery_nap");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SECKILL_STALLS: no fault point named 'recovery_nap'"),
        "{err}"
    );
}
