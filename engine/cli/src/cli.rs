//! The `seckill` command line. Every flag is range-checked by clap, so a bad value is refused
//! with an error naming the flag before anything runs.

use seckill_core::clock::Clock;
use seckill_core::demo::{self, DemoConfig, DemoReport};
use seckill_core::domain::ActivityId;
mod admin;
mod client;
#[cfg(feature = "tools")]
pub mod measure;
mod serve;
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
    #[cfg(feature = "tools")]
    #[command(flatten)]
    Measure(measure::Command),
    /// Apply the ledger schema (migrations/) to DATABASE_URL; idempotent.
    Migrate,
    /// Check one activity's invariants on the real stores; exit 1 if one is violated.
    Audit(ActivityArgs),
    /// Run one reconciler pass over an activity on the real stores and print what it did.
    Reconcile(ActivityArgs),
    /// The operator's calls to a running server's admin listener (list, show, create, warmup,
    /// pause, resume, close, reconcile, audit, an order, a cancel), with exit codes a script can use.
    Admin(admin::AdminArgs),
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
    #[arg(long, value_parser = seckill_core::roles::Roles::parse)]
    roles: Option<seckill_core::roles::Roles>,
    /// Check the settings (file, environment, flags) as `serve` would, say what would run, and
    /// exit: 0 when they are good, 2 naming the first bad one. Connects to nothing.
    #[arg(long)]
    check_config: bool,
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

pub(crate) fn parse_skew(s: &str) -> Result<f64, String> {
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
        Command::Serve(args) => serve::serve(
            args.config,
            args.listen,
            args.admin_listen,
            args.roles,
            args.check_config,
        ),
        #[cfg(feature = "tools")]
        Command::Measure(m) => measure::run(m),
        Command::Migrate => tools::migrate(),
        Command::Admin(args) => admin::run(args),
        Command::Audit(args) => tools::audit(args.activity, args.json),
        Command::Reconcile(args) => tools::reconcile(args.activity, args.json),
        Command::Jwt(args) => {
            let env = |k: &str| std::env::var(k).ok();
            match seckill_api::identity::minting_secret(env) {
                Ok(secret) => {
                    let exp = tools::wall_now_ms() / 1_000 + args.ttl;
                    let (iss, aud) = (env("SECKILL_JWT_ISSUER"), env("SECKILL_JWT_AUDIENCE"));
                    let jwt = seckill_api::identity::mint(
                        secret.as_bytes(),
                        seckill_core::domain::UserId(args.user),
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
                let real = tools::connect()
                    .await
                    .map_err(|e| demo::DemoError::Setup(format!("{e:#}")))?;
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
