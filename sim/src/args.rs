//! The command line of one run (`seckill-sim run`, and the shape flags `sweep` shares), in the
//! library so that a test can parse a failure's replay command back into the configuration it
//! came from: a replay that drops a flag replays a different run.

use crate::world::{Scenario, Scheduled, SimConfig, Size};
use clap::Parser;
use seckill_core::planted::Bug;

#[derive(clap::Args, Clone, Debug)]
pub struct Shape {
    /// Use the standard size (10,000 users, 1,000 units); otherwise the small sweep size.
    #[arg(long)]
    pub standard: bool,
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub users: Option<u64>,
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub stock: Option<u64>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub buckets: Option<u32>,
    #[arg(long = "sale-ms", value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub sale_ms: Option<u64>,
    /// Run without the jobs node (reconciler, recovery, payment timeout).
    #[arg(long = "no-jobs")]
    pub no_jobs: bool,
}

/// `seckill-sim run`'s arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    #[arg(long)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "chaos")]
    pub scenario: Scenario,
    /// Plant one named bug (see `seckill-sim bugs`).
    #[arg(long, value_parser = parse_bug)]
    pub planted: Option<Bug>,
    #[command(flatten)]
    pub shape: Shape,
    /// Inject exactly these faults instead of the scenario's random ones: a run's schedule as
    /// `shrink` prints it (`<at ms>.<ns>:<fault>:<hold ms>`, comma-separated).
    #[arg(long, value_parser = parse_schedule_arg)]
    pub schedule: Option<ScheduleArg>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    pub fn config(&self) -> SimConfig {
        SimConfig {
            schedule: self.schedule.clone().map(|s| s.0),
            ..config(self.seed, self.scenario, self.planted, &self.shape)
        }
    }
}

/// `--schedule`'s value (a newtype: clap would read a bare `Vec` as many values).
#[derive(Clone, Debug)]
pub struct ScheduleArg(pub Vec<Scheduled>);

fn parse_schedule_arg(s: &str) -> Result<ScheduleArg, String> {
    crate::world::parse_schedule(s).map(ScheduleArg)
}

pub fn parse_bug(s: &str) -> Result<Bug, String> {
    Bug::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
        format!("unknown bug {s:?}; planted bugs: {}", names.join(", "))
    })
}

/// A run's configuration: the scenario at the chosen size, with the shape's overrides.
pub fn config(seed: u64, scenario: Scenario, planted: Option<Bug>, shape: &Shape) -> SimConfig {
    let size = if shape.standard {
        Size::Standard
    } else {
        Size::Small
    };
    let base = SimConfig::new(seed, scenario, size);
    SimConfig {
        planted,
        users: shape.users.unwrap_or(base.users),
        stock: shape.stock.unwrap_or(base.stock),
        buckets: shape.buckets.unwrap_or(base.buckets),
        sale_ms: shape.sale_ms.unwrap_or(base.sale_ms),
        jobs: !shape.no_jobs,
        ..base
    }
}

/// The configuration a replay command (`cargo sim-run run …`, as printed on a failure) runs.
pub fn parse_replay(command: &str) -> Result<SimConfig, String> {
    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }
    let words = command
        .strip_prefix("cargo sim-run run ")
        .ok_or_else(|| format!("not a replay command: {command}"))?;
    let argv = std::iter::once("run").chain(words.split_whitespace());
    Run::try_parse_from(argv)
        .map(|r| r.args.config())
        .map_err(|e| e.to_string())
}
