//! The measuring commands (`plan`, `load`, `load --stages`, `bench`): built with the `tools`
//! feature (on by default), so that a server built without it (`--no-default-features`) carries
//! none of their plotting, CSV and histogram code.

pub mod bench;
pub mod capacity;
pub mod http;
pub mod load;
mod procs;
pub mod stages;

use super::{parse_skew, tools};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum Command {
    /// Capacity plan by the seeds' method: nodes per layer, concurrency, bandwidth, the short stave.
    Plan(PlanArgs),
    /// Load a running `seckill serve` on loopback: token + purchase per click; the funnel and latency.
    #[command(allow_negative_numbers = true)]
    Load(LoadArgs),
    /// The seeds' stock-deduction strategies and the engine's paths, side by side on the real stores.
    Bench(BenchArgs),
}

pub fn run(command: Command) -> ExitCode {
    match command {
        Command::Plan(args) => run_plan(args),
        Command::Load(args) => run_load(args),
        Command::Bench(a) => bench::run(bench::BenchOptions {
            duration: std::time::Duration::from_secs_f64(a.seconds),
            concurrency: a.concurrency as usize,
            orders: a.orders,
            only: a.only,
            json: a.json,
            csv: a.csv,
            plot: a.plot,
            instructions: a.instructions,
        }),
    }
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// An API process to load, http://HOST:PORT; repeat it (or separate with commas) for several:
    /// the connections are spread over them. Loopback only, unless --remote.
    #[arg(long, default_value = "http://127.0.0.1:8080", value_delimiter = ',')]
    url: Vec<String>,
    /// Allow --url to name servers that are not on this machine (a staging cluster you run).
    #[arg(long)]
    remote: bool,
    /// A file holding the HS256 secret the servers check buyers' JWTs with (default:
    /// SECKILL_JWT_SECRET or SECKILL_JWT_SECRET_FILE as `serve` reads them, or the development
    /// key of `serve` on the embedded default).
    #[arg(long = "jwt-secret-file")]
    jwt_secret_file: Option<std::path::PathBuf>,
    /// Instead of minting JWTs: a file of the login service's, one a line (`#` comments); its
    /// users are the tokens' subjects, each clicking 1..=--clicks-per-user times.
    #[arg(long = "jwts-file", conflicts_with_all = ["jwt_secret_file", "users", "skew"])]
    jwts_file: Option<std::path::PathBuf>,
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
    #[arg(long, conflicts_with_all = ["url", "remote", "jwt_secret_file", "jwts_file", "activity", "rate", "skew", "clicks_per_user", "target"])]
    stages: bool,
    /// With --stages: also draw the results as a bar chart (PNG).
    #[arg(long, requires = "stages")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadTarget {
    Purchase,
    Healthz,
}

#[derive(clap::Args)]
pub struct BenchArgs {
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
    /// Count instead of time, for the HTTP rows alone: each row's server runs under valgrind's
    /// callgrind and the row reports its instructions per request over this many clicks — a
    /// figure the noise of a shared box does not move (needs valgrind).
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    instructions: Option<u64>,
}

#[derive(clap::Args)]
pub struct PlanArgs {
    /// A worked scenario from the seeds.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(capacity::PRESETS))]
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

fn run_plan(args: PlanArgs) -> ExitCode {
    let Some(mut scenario) = capacity::preset(&args.preset) else {
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
            .and_then(|t| capacity::capacities_from_bench(&t))
        {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: --from-bench {}: {e}", path.display());
                return ExitCode::from(2);
            }
        };
        capacity::apply_measured(&mut scenario, &measured);
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
    use load::{self, LoadConfig, Target};
    if args.stages {
        return run_stages(args);
    }
    let addrs: Result<Vec<_>, String> = args.url.iter().map(|u| load::parse_url(u, args.remote)).collect();
    let addrs = match addrs {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = LoadConfig {
        addrs,
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
        jwts: None,
    };
    let cfg = if let Some(path) = &args.jwts_file {
        match jwts_of(path) {
            Ok(jwts) => LoadConfig {
                users: jwts.len() as u64,
                jwts: Some(std::sync::Arc::new(jwts)),
                ..cfg
            },
            Err(e) => {
                eprintln!("error: --jwts-file {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    } else if cfg.target == Target::Purchase {
        // The secret from the file, or as `serve` reads it (SECKILL_JWT_SECRET, its _FILE, the
        // credentials directory), or the development key.
        use seckill_api::identity::{minting_secret, MIN_SECRET_LEN};
        let secret = match &args.jwt_secret_file {
            Some(path) => {
                let named = |e: String| format!("--jwt-secret-file {}: {e}", path.display());
                seckill_stores::backend::read_secret_file(path)
                    .map_err(|e| named(e.to_string()))
                    .and_then(|s| match s.len() < MIN_SECRET_LEN {
                        true => Err(named(format!("must be at least {MIN_SECRET_LEN} bytes"))),
                        false => Ok(s),
                    })
            }
            None => seckill_stores::backend::lookup()
                .map_err(|e| e.to_string())
                .and_then(minting_secret),
        };
        match secret {
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
            eprintln!("error: {}", tools::chain(&e));
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

/// The JWTs of a `--jwts-file`, by the user each names (read, not verified: the servers do that).
fn jwts_of(path: &std::path::Path) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut jwts = std::collections::BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() || token.starts_with('#') {
            continue;
        }
        let user =
            seckill_api::identity::subject_unverified(token).map_err(|e| format!("line {}: {e}", i + 1))?;
        if jwts.insert(user.0, token.to_string()).is_some() {
            return Err(format!("line {}: a second JWT of user {}", i + 1, user.0));
        }
    }
    if jwts.is_empty() {
        return Err("no JWT in it".into());
    }
    Ok(jwts)
}

/// `seckill load --stages`: the three stages on the real stores (see `cli::stages`).
fn run_stages(args: LoadArgs) -> ExitCode {
    let stores = procs::stores_from_env();
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
    let result = runtime.block_on(async move {
        // The ledger read directly for the wait from 202 to order (the stages' measure).
        let settings = seckill_stores::backend::RealSettings::from_env()?
            .ok_or_else(|| anyhow::anyhow!("--stages needs the real stores"))?;
        let ledger = seckill_stores::mysql::MysqlLedger::connect_lazy(&settings.mysql)?;
        stages::run(&opts, stores, &ledger, move |msg| {
            tick.inc(1);
            tick.set_message(msg.to_string());
        })
        .await
    });
    bar.finish_and_clear();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {}", tools::chain(&e));
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &args.plot {
        let title =
            "seckill load --stages: purchases per API CPU-second (stages 1, 2); the funnel at peak (3)";
        if let Err(e) = bench::bar_chart(path, title, &stages::bars(&report), false) {
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

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.1..=600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be in 0.1..=600, got {v}"))
    }
}
