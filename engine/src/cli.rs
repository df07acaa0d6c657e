//! The `seckill` command line. Every flag is range-checked by clap, so a bad value is refused
//! with an error naming the flag before anything runs.

use crate::clock::Clock;
use crate::demo::{self, DemoConfig, DemoReport};
use crate::domain::ActivityId;
pub mod bench;
pub mod load;
pub mod stages;
mod tools;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "seckill",
    version,
    about = "Flash-sale engine and its deterministic testbed"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole flash sale (embedded stores by default, or the real ones) and check the invariants.
    // Negative numbers are values (refused by the range checks, naming the flag), not flags.
    #[command(allow_negative_numbers = true)]
    Demo(DemoArgs),
    /// Serve the HTTP API (embedded stores unless REDIS_URL, KAFKA_BROKERS, DATABASE_URL are set).
    Serve(ServeArgs),
    /// Capacity plan by the seeds' method: nodes per layer, concurrency, bandwidth, the short stave.
    Plan(PlanArgs),
    /// Load a running `seckill serve` on loopback: token + purchase per click; the funnel and latency.
    #[command(allow_negative_numbers = true)]
    Load(LoadArgs),
    /// The seeds' stock-deduction strategies and the engine's paths, side by side on the real stores.
    Bench(BenchArgs),
    /// Apply the ledger schema (migrations/) to DATABASE_URL; idempotent.
    Migrate,
    /// Check one activity's invariants on the real stores; exit 1 if one is violated.
    Audit(ActivityArgs),
    /// Run one reconciler pass over an activity on the real stores and print what it did.
    Reconcile(ActivityArgs),
    /// Mint a user JWT as a login service would (the server's SECKILL_JWT_SECRET, or the
    /// development key of `serve` on the embedded default).
    Jwt(JwtArgs),
}

#[derive(clap::Args)]
struct JwtArgs {
    /// The user id (`sub`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    user: u64,
    /// Seconds until it expires.
    #[arg(long, default_value_t = 3_600, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    ttl: u64,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML settings file (SECKILL_* environment variables override it).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides SECKILL_LISTEN and the file).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Address of the admin listener: admin routes, /metrics, /readyz (overrides
    /// SECKILL_ADMIN_LISTEN and the file; default 127.0.0.1:9090).
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
    /// The roles this process runs: any of api, worker, jobs, comma-separated (overrides
    /// SECKILL_ROLES and the file; default all three).
    #[arg(long, value_parser = crate::roles::Roles::parse)]
    roles: Option<crate::roles::Roles>,
    /// Check the settings (file, environment, flags) as `serve` would, say what would run, and
    /// exit: 0 when they are good, 2 naming the first bad one. Connects to nothing.
    #[arg(long)]
    check_config: bool,
}

#[derive(clap::Args)]
struct LoadArgs {
    /// The server, loopback only.
    #[arg(long, default_value = "http://127.0.0.1:8080", value_parser = crate::cli::load::parse_url)]
    url: std::net::SocketAddr,
    /// The activity to buy from.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), required_unless_present = "stages")]
    activity: Option<u64>,
    /// Distinct users.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    users: u64,
    /// Keep-alive connections (one worker each).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4_096))]
    connections: u32,
    /// Clicks per second over all connections (0: as fast as the server answers).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    rate: u64,
    /// Stop after this many seconds even if clicks are left.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    duration: f64,
    /// Fraction of users crowded onto the hot eighth of the buckets (0 ≤ S < 1).
    #[arg(long, default_value_t = 0.0, value_parser = parse_skew)]
    skew: f64,
    /// Each user clicks 1..=K times.
    #[arg(long = "clicks-per-user", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    clicks_per_user: u32,
    /// Seed of the click order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// What to send: the purchase funnel, or GET /healthz (the hello-world baseline).
    #[arg(long, value_enum, default_value = "purchase")]
    target: LoadTarget,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Run the seeds' three load-test stages instead (one API process at its limit; the same
    /// clicks over 1, 2 and 3 API processes; the full funnel at peak) on the real stores
    /// (REDIS_URL, KAFKA_BROKERS, DATABASE_URL), starting the API, worker and jobs processes
    /// itself. `--users`, `--connections`, `--duration` and `--seed` size it.
    #[arg(long, conflicts_with_all = ["url", "activity", "rate", "skew", "clicks_per_user", "target"])]
    stages: bool,
    /// With --stages: also draw the results as a bar chart (PNG).
    #[arg(long, requires = "stages")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LoadTarget {
    Purchase,
    Healthz,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Seconds each strategy runs (throughput phase).
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Workers running each strategy at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    concurrency: u32,
    /// Orders published for each consumer row.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    orders: u64,
    /// Only the strategies whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Also write the table as CSV.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Also draw the ops/s as a bar chart (PNG).
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table (`seckill plan --from-bench` reads it).
    #[arg(long)]
    json: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.1..=600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be in 0.1..=600, got {v}"))
    }
}

#[derive(clap::Args)]
struct PlanArgs {
    /// A worked scenario from the seeds.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::capacity::PRESETS))]
    preset: String,
    /// Peak QPS at the door (overrides the preset's).
    #[arg(long = "entry-qps", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    entry_qps: Option<u64>,
    /// Size nodes for qps × SAFETY (2.0 = run at 50% of measured capacity).
    #[arg(long, value_parser = parse_safety)]
    safety: Option<f64>,
    /// Take per-node capacities from a `seckill bench --json` file instead of the preset's.
    #[arg(long = "from-bench")]
    from_bench: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_safety(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (1.0..=10.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be in 1..=10, got {v}"))
    }
}

#[derive(clap::Args)]
struct ActivityArgs {
    /// The activity id.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    activity: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Backend {
    /// In-process stores (nothing to install; not durable).
    Embedded,
    /// Redis, Kafka and MySQL from REDIS_URL (or SECKILL_REDIS_CLUSTER=1 with
    /// REDIS_CLUSTER_NODES), KAFKA_BROKERS and DATABASE_URL.
    Real,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Seed of every random choice (users, clicks, arrival order): a seed replays the sale.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct users taking part.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    users: u64,
    /// Units on sale.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    stock: u64,
    /// Business stock buckets (plus one fallback bucket).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    buckets: u32,
    /// Percent of the stock held back in the fallback bucket.
    #[arg(long = "fallback-pct", default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=50))]
    fallback_pct: u8,
    /// Fraction of users whose ids crowd onto the hot eighth of the buckets (0 ≤ S < 1).
    #[arg(long, default_value_t = 0.0, value_parser = parse_skew)]
    skew: f64,
    /// Each user clicks "buy" between 1 and K times.
    #[arg(long = "clicks-per-user", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    clicks_per_user: u32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    concurrency: u32,
    /// Do not rebalance stock between buckets during the sale.
    #[arg(long = "no-rebalance")]
    no_rebalance: bool,
    /// Where the sale runs.
    #[arg(long, value_enum, default_value = "embedded")]
    backend: Backend,
    /// Activity id (real backend: must be new; default: the current time in ms).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    activity: Option<u64>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_skew(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be at least 0 and below 1, got {v}"))
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => run_demo(args),
        Command::Serve(args) => tools::serve(
            args.config,
            args.listen,
            args.admin_listen,
            args.roles,
            args.check_config,
        ),
        Command::Plan(args) => run_plan(args),
        Command::Load(args) => run_load(args),
        Command::Bench(a) => tools::bench(tools::BenchOptions {
            duration: std::time::Duration::from_secs_f64(a.seconds),
            concurrency: a.concurrency as usize,
            orders: a.orders,
            only: a.only,
            json: a.json,
            csv: a.csv,
            plot: a.plot,
        }),
        Command::Migrate => tools::migrate(),
        Command::Audit(args) => tools::audit(args.activity, args.json),
        Command::Reconcile(args) => tools::reconcile(args.activity, args.json),
        Command::Jwt(args) => {
            let env = |k: &str| std::env::var(k).ok();
            match crate::api::identity::minting_secret(env) {
                Ok(secret) => {
                    let exp = tools::wall_now_ms() / 1_000 + args.ttl;
                    let (iss, aud) = (env("SECKILL_JWT_ISSUER"), env("SECKILL_JWT_AUDIENCE"));
                    let jwt = crate::api::identity::mint(
                        secret.as_bytes(),
                        crate::domain::UserId(args.user),
                        exp,
                        iss.as_deref(),
                        aud.as_deref(),
                    );
                    println!("{jwt}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

fn run_demo(args: DemoArgs) -> ExitCode {
    let cfg = DemoConfig {
        seed: args.seed,
        users: args.users,
        stock: args.stock,
        buckets: args.buckets,
        fallback_pct: args.fallback_pct,
        skew: args.skew,
        clicks_per_user: args.clicks_per_user,
        concurrency: args.concurrency as usize,
        rebalance: !args.no_rebalance,
    };
    let wall_now_ms = tools::wall_now_ms();
    let expected = args.users * (1 + args.clicks_per_user as u64) / 2;
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(expected);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {pos:>8} requests answered  {per_sec}  {elapsed}")
                .expect("the template is fixed"),
        );
        bar
    };
    // One thread: the embedded stores serialize on their locks anyway (as Redis does), and a
    // current-thread scheduler makes a seed replay the same interleaving.
    let runtime = match tools::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let started = Instant::now();
    let tick = bar.clone();
    let result = runtime.block_on(async {
        let clock = Clock::new(wall_now_ms, tokio::time::Instant::now());
        match args.backend {
            Backend::Embedded => demo::run(&cfg, clock, move || tick.inc(1)).await,
            Backend::Real => {
                let real = tools::connect().await.map_err(demo::DemoError::Setup)?;
                let id = ActivityId(args.activity.unwrap_or(wall_now_ms));
                tick.println(format!("activity {id} on the real stores"));
                demo::run_on(
                    &cfg,
                    clock,
                    (&real.cache, &real.bus, &real.ledger),
                    id,
                    move || tick.inc(1),
                )
                .await
            }
        }
    });
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        let mut value = serde_json::to_value(&report).expect("the report is plain data");
        value["config"] = serde_json::to_value(&cfg).expect("the config is plain data");
        value["elapsed_ms"] = serde_json::json!(elapsed.as_millis() as u64);
        println!("{value}");
    } else {
        print_table(&cfg, &report, elapsed.as_secs_f64());
    }
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_table(cfg: &DemoConfig, r: &DemoReport, secs: f64) {
    println!(
        "seckill demo: seed {}, {} users (skew {:.2}, 1-{} clicks each), {} units in {} buckets + fallback {}%",
        cfg.seed, cfg.users, cfg.skew, cfg.clicks_per_user, cfg.stock, cfg.buckets, cfg.fallback_pct
    );
    println!("requests          {:>9}", r.requests);
    println!("  duplicate       {:>9}", r.duplicate);
    println!("  sold out        {:>9}", r.sold_out);
    println!("  unavailable     {:>9}", r.unavailable);
    println!("  queued          {:>9}", r.queued);
    println!("orders created    {:>9}", r.orders_created);
    println!("orders failed     {:>9}", r.orders_failed);
    println!(
        "units sold        {:>9} of {} ({} left in redis)",
        r.units_sold, cfg.stock, r.units_left_in_redis
    );
    println!(
        "consumer: {} redelivered, {} duplicate buyers released, {} dead-lettered",
        r.redelivered, r.duplicate_buyers, r.dead_lettered
    );
    if cfg.rebalance {
        println!(
            "rebalancer: {} transfers, {} units moved",
            r.transfers, r.units_moved
        );
    } else {
        println!("rebalancer: off");
    }
    println!(
        "elapsed {:.2} s ({:.0} requests/s)",
        secs,
        r.requests as f64 / secs.max(1e-9)
    );
    for v in &r.violations {
        println!("violation: {v}");
    }
    println!("invariants: {}", r.verdict);
}

fn run_plan(args: PlanArgs) -> ExitCode {
    let Some(mut scenario) = crate::capacity::preset(&args.preset) else {
        eprintln!("error: --preset: unknown preset {:?}", args.preset);
        return ExitCode::from(2);
    };
    if let Some(q) = args.entry_qps {
        scenario.entry_qps = q;
    }
    if let Some(f) = args.safety {
        scenario.safety = f;
    }
    if let Some(path) = &args.from_bench {
        let measured = match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| crate::capacity::capacities_from_bench(&t))
        {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: --from-bench {}: {e}", path.display());
                return ExitCode::from(2);
            }
        };
        crate::capacity::apply_measured(&mut scenario, &measured);
    }
    let report = scenario.plan();
    if args.json {
        println!("{}", serde_json::to_string(&report).expect("plain data"));
        return ExitCode::SUCCESS;
    }
    println!(
        "seckill plan: {} (entry {} QPS, nodes sized for qps x {})",
        report.scenario, scenario.entry_qps, scenario.safety
    );
    println!(
        "{:<24} {:>10} {:>10} {:>9} {:>6} {:>12} {:>10}",
        "layer", "qps in", "qps out", "per node", "nodes", "concurrency", "Gbps"
    );
    for (l, spec) in report.layers.iter().zip(&scenario.layers) {
        let per_node = spec.per_node_qps.map_or("-".to_string(), |c| c.to_string());
        let nodes = l.nodes.map_or("-".to_string(), |n| n.to_string());
        println!(
            "{:<24} {:>10} {:>10} {:>9} {:>6} {:>12.1} {:>10.2}",
            l.name, l.qps_in, l.qps_out, per_node, nodes, l.concurrency, l.bandwidth_gbps
        );
    }
    if let Some(w) = &report.weakest {
        let h = report
            .layers
            .iter()
            .find(|l| &l.name == w)
            .and_then(|l| l.headroom)
            .unwrap_or(0.0);
        println!("short stave: {w} (capacity {h:.2}x its load)");
    }
    if let Some((total, max)) = report.db_connections {
        println!("database connections from the application layer: {total} (max_connections {max})");
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    ExitCode::SUCCESS
}

fn run_load(args: LoadArgs) -> ExitCode {
    use crate::cli::load::{self, LoadConfig, Target};
    if args.stages {
        return run_stages(args);
    }
    let cfg = LoadConfig {
        addrs: vec![args.url],
        activity: args.activity.expect("clap requires --activity without --stages"),
        users: args.users,
        connections: args.connections as usize,
        rate: args.rate,
        duration: std::time::Duration::from_secs_f64(args.duration),
        skew: args.skew,
        clicks_per_user: args.clicks_per_user,
        seed: args.seed,
        target: match args.target {
            LoadTarget::Purchase => Target::Purchase,
            LoadTarget::Healthz => Target::Healthz,
        },
        jwt_secret: String::new(),
        jwt_issuer: std::env::var("SECKILL_JWT_ISSUER").ok(),
        jwt_audience: std::env::var("SECKILL_JWT_AUDIENCE").ok(),
    };
    let cfg = if cfg.target == Target::Purchase {
        match crate::api::identity::minting_secret(|k| std::env::var(k).ok()) {
            Ok(jwt_secret) => LoadConfig { jwt_secret, ..cfg },
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        cfg
    };
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(args.users * (1 + args.clicks_per_user as u64) / 2);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {pos:>8} clicks answered  {per_sec}  {elapsed}")
                .expect("the template is fixed"),
        );
        bar
    };
    let runtime = match tools::runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let tick = bar.clone();
    let result = runtime.block_on(load::run(&cfg, move || tick.inc(1)));
    bar.finish_and_clear();
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        let mut v = serde_json::to_value(&r).expect("plain data");
        v["config"] = serde_json::to_value(&cfg).expect("plain data");
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    let what = if cfg.target == Target::Healthz {
        "GET /healthz"
    } else {
        "purchases"
    };
    println!(
        "seckill load: {} users x 1-{} clicks, {} connections, rate {}, {:.1} s max -> {what}",
        cfg.users,
        cfg.clicks_per_user,
        cfg.connections,
        if cfg.rate == 0 {
            "unlimited".to_string()
        } else {
            format!("{}/s", cfg.rate)
        },
        cfg.duration.as_secs_f64()
    );
    let label = |s: u16| match s {
        200 => "ok",
        202 => "queued",
        409 => "duplicate / token used",
        410 => "sold out / ended",
        425 => "not started",
        429 => "rate limited",
        503 => "unavailable",
        _ => "other",
    };
    let sent: u64 = r.by_status.values().sum();
    println!("{what} answered {:>9}", sent);
    for (s, n) in &r.by_status {
        println!("  {s} {:<22} {n:>9}", label(*s));
    }
    for (s, n) in &r.tokens_refused {
        println!("  token refused {s} {:<8} {n:>9}", label(*s));
    }
    println!("  connection errors {:>15}", r.errors);
    println!(
        "latency us: p50 {} p99 {} p999 {} max {}",
        r.latency_us_p50, r.latency_us_p99, r.latency_us_p999, r.latency_us_max
    );
    println!(
        "throughput: {:.0} requests/s ({} requests in {:.2} s){}",
        r.requests_per_sec,
        r.requests,
        r.elapsed_s,
        if r.completed {
            ""
        } else {
            ", stopped by --duration"
        }
    );
    ExitCode::SUCCESS
}

/// `seckill load --stages`: the three stages on the real stores (see `cli::stages`).
fn run_stages(args: LoadArgs) -> ExitCode {
    use crate::cli::stages;
    let stores: Vec<(String, String)> = ["REDIS_URL", "KAFKA_BROKERS", "DATABASE_URL"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    if stores.len() != 3 {
        eprintln!("error: --stages needs the real stores: set REDIS_URL, KAFKA_BROKERS and DATABASE_URL");
        return ExitCode::from(2);
    }
    let opts = stages::StagesOptions {
        users: args.users,
        connections: args.connections as usize,
        duration: std::time::Duration::from_secs_f64(args.duration),
        seed: args.seed,
    };
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(stages::RUNS);
        bar.set_style(
            ProgressStyle::with_template("{spinner} stage runs {pos}/{len}  {msg}  {elapsed}")
                .expect("the template is fixed"),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    };
    let runtime = match tools::runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let tick = bar.clone();
    let result = runtime.block_on(stages::run(&opts, stores, move |msg| {
        tick.inc(1);
        tick.set_message(msg.to_string());
    }));
    bar.finish_and_clear();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &args.plot {
        let title =
            "seckill load --stages: purchases per API CPU-second (stages 1, 2); the funnel at peak (3)";
        if let Err(e) = crate::cli::bench::bar_chart(path, title, &stages::bars(&report), false) {
            eprintln!("error: --plot: {e}");
            return ExitCode::from(2);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&report).expect("plain data"));
    } else {
        print!("{}", stages::table(&report));
    }
    ExitCode::SUCCESS
}
