//! `seckill-model`: check the recovery model exhaustively at a bound, and print what it proved
//! or the shortest trace it found that breaks a property.
//!
//! ```text
//! cargo run --release -p seckill-model -- check                    # the CI bound
//! cargo run --release -p seckill-model -- check --runners 3 --dfs --minutes 20
//! cargo run --release -p seckill-model -- check --planted unfenced_bump
//! ```
//! Exit code 0: every property held (or, with `--planted`, the checker broke one); 1: not.

use clap::{Parser, Subcommand};
use seckill_model::{Bound, Bug, Recovery};
use stateright::{Checker, Model};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "seckill-model",
    about = "Check seckill's fenced recovery exhaustively at a bound"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Explore every interleaving within the bound (breadth first: a trace found is short).
    Check {
        #[arg(long, default_value_t = Bound::ci().runners)]
        runners: u8,
        /// Buckets with one unit each (besides the empty fallback bucket).
        #[arg(long, default_value_t = 2)]
        buckets: u8,
        /// Users, routed round robin over the buckets.
        #[arg(long, default_value_t = 2)]
        users: u8,
        #[arg(long, default_value_t = Bound::ci().attempts_per_user)]
        attempts: u8,
        #[arg(long, default_value_t = Bound::ci().claims_per_runner)]
        claims: u8,
        #[arg(long, default_value_t = Bound::ci().losses)]
        losses: u8,
        #[arg(long, default_value_t = Bound::ci().expiries)]
        expiries: u8,
        /// Leave the operator's pause and resume out.
        #[arg(long)]
        no_operator: bool,
        /// Plant one of the model's bugs (the engine's name for it); the check must then fail.
        #[arg(long, value_parser = parse_bug)]
        planted: Option<Bug>,
        /// Stop after this long and report how far the search got (0: no limit).
        #[arg(long, default_value_t = 0)]
        minutes: u64,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Depth first: memory for the path, not the frontier (for bounds whose breadth-first
        /// frontier outgrows the machine, such as 3 runners); a trace found is not the shortest.
        #[arg(long)]
        dfs: bool,
    },
}

fn parse_bug(name: &str) -> Result<Bug, String> {
    Bug::parse(name).ok_or_else(|| {
        let names: Vec<_> = Bug::ALL.iter().map(|b| b.name()).collect();
        format!("--planted: unknown bug {name:?} (one of {})", names.join(", "))
    })
}

fn main() -> ExitCode {
    let Command::Check {
        runners,
        buckets,
        users,
        attempts,
        claims,
        losses,
        expiries,
        no_operator,
        planted,
        minutes,
        threads,
        dfs,
    } = Cli::parse().command;
    let (stock, routes) = Bound::plan(buckets, users);
    let bound = Bound {
        runners,
        stock,
        routes,
        attempts_per_user: attempts,
        claims_per_runner: claims,
        losses,
        expiries,
        operator: !no_operator,
    };
    println!("bound: {bound:?}");
    println!("planted: {}", planted.map_or("none", Bug::name));
    let model = Recovery::new(bound, planted);
    let mut builder = model.checker().threads(threads);
    if minutes > 0 {
        builder = builder.timeout(Duration::from_secs(minutes * 60));
    }
    let started = Instant::now();
    let limit = (minutes > 0).then(|| Duration::from_secs(minutes * 60));
    if dfs {
        report(builder.spawn_dfs().join(), started, limit, planted.is_some())
    } else {
        report(builder.spawn_bfs().join(), started, limit, planted.is_some())
    }
}

/// Print what the search covered and each property's fate; the exit code says whether that is
/// what was asked for (everything held, or — with a bug planted — something broke).
fn report(
    checker: impl Checker<Recovery>,
    started: Instant,
    limit: Option<Duration>,
    planted: bool,
) -> ExitCode {
    // A timeout ends the search as done too: whether it covered the bound is whether it ended
    // before the limit.
    let done = checker.is_done() && limit.is_none_or(|l| started.elapsed() < l);
    println!(
        "{}: {} states ({} unique), depth {}, {:.1} s",
        if done {
            "explored the whole bound"
        } else {
            "stopped at the time limit"
        },
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    let model = checker.model();
    let mut broken = 0;
    for name in seckill_model::checked_properties(model) {
        match checker.discovery(name) {
            Some(path) => {
                broken += 1;
                println!("BROKEN: {name}");
                println!("  trace ({} steps):", path.clone().into_actions().len());
                let end = path.last_state().clone();
                for action in path.into_actions() {
                    println!("    {action:?}");
                }
                if !model.settles(&end) {
                    let mut fair = vec![];
                    model.fair_run(&end, Some(&mut fair));
                    println!("  and from there, the fair run without faults that never settles:");
                    for action in fair.iter().take(60) {
                        println!("    {action:?}");
                    }
                }
            }
            None if done => println!("holds:  {name}"),
            None => println!("holds so far: {name}"),
        }
    }
    match (planted, broken) {
        (false, 0) => {
            if !done {
                println!("(not a proof: the search stopped before it covered the bound)");
            }
            ExitCode::SUCCESS
        }
        (true, n) if n > 0 => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
