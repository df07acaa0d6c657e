//! `seckill-sim`: run simulated seeds, one (`run`) or many (`sweep`), and fold sweep results
//! into the soak's summary lines (`summarize`). Built with `--cfg madsim` by `cargo sim-run`
//! (see .cargo/config.toml) and by `ci/soak.sh`.
//!
//! Exit codes: 0 every invariant held; 1 a safety invariant broke; 2 a liveness/reconciliation
//! invariant broke; 3 the world crashed (a panic or the simulated time limit).

/// mimalloc, not glibc's malloc: a simulated run allocates and frees millions of small values
/// (messages, timer events, tasks), and glibc's malloc and free were a fifth of its time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(not(madsim))]
fn main() {
    eprintln!("seckill-sim must be built with --cfg madsim: use `cargo sim-run` or ci/soak.sh");
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    app::main()
}

#[cfg(madsim)]
mod app {
    use clap::{Parser, Subcommand};
    use seckill_core::planted::Bug;
    use seckill_sim::args::{config, parse_bug, RunArgs, Shape};
    use seckill_sim::world::{self, RunReport, Scenario, SimConfig, Verdict, COVERAGE_TARGETS};
    use serde::Deserialize;
    use std::collections::BTreeMap;
    use std::io::BufRead;
    use std::process::ExitCode;
    use std::time::Instant;

    #[derive(Parser)]
    #[command(
        name = "seckill-sim",
        about = "Deterministic simulation runs of the seckill engine"
    )]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Subcommand)]
    enum Command {
        /// Run one seed and print its report (the replay command of a failure).
        Run(RunArgs),
        /// Run seeds `from..from+seeds`, one JSON line each (for ci/soak.sh).
        Sweep {
            #[arg(long, default_value_t = 0)]
            from: u64,
            #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
            seeds: u64,
            /// A scenario, or every scenario in turn (`all`, the default).
            #[arg(long, default_value = "all", value_parser = parse_scenarios)]
            scenario: Scenarios,
            /// With a planted bug: its own scenario, stopping at the first seed that catches it.
            #[arg(long, value_parser = parse_bug)]
            planted: Option<Bug>,
            #[command(flatten)]
            shape: Shape,
            /// Write the full report of every failing seed here.
            #[arg(long = "failures-dir")]
            failures_dir: Option<std::path::PathBuf>,
        },
        /// Run a failing seed, then drop faults from its schedule for as long as it still fails
        /// the same way; print the run with the fewest faults and its replay command.
        Shrink(RunArgs),
        /// Print the names of the planted bugs, one per line.
        Bugs,
        /// Read sweep lines on stdin; print the summary lines.
        Summarize {
            /// The sweeps were planted-bug hunts: report catches instead of failures.
            #[arg(long)]
            planted: bool,
        },
    }

    #[derive(Clone)]
    struct Scenarios(Vec<Scenario>);

    fn parse_scenarios(s: &str) -> Result<Scenarios, String> {
        if s == "all" {
            return Ok(Scenarios(
                <Scenario as clap::ValueEnum>::value_variants().to_vec(),
            ));
        }
        <Scenario as clap::ValueEnum>::from_str(s, false).map(|sc| Scenarios(vec![sc]))
    }

    /// One seed: its report (None if the world crashed) and the wall time it took.
    fn run_one(cfg: &SimConfig) -> (Option<RunReport>, f64) {
        let started = Instant::now();
        let result = std::panic::catch_unwind(|| world::run(cfg));
        (result.ok(), started.elapsed().as_secs_f64() * 1e3)
    }

    fn code(verdict: Option<Verdict>) -> u8 {
        match verdict {
            Some(Verdict::Ok) => 0,
            Some(Verdict::Safety) => 1,
            Some(Verdict::Liveness) => 2,
            None => 3,
        }
    }

    fn human(cfg: &SimConfig, report: Option<&RunReport>, wall_ms: f64) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "seed {} scenario {:?}", cfg.seed, cfg.scenario);
        let _ = writeln!(out, "config {}", serde_json::to_string(cfg).expect("plain data"));
        let Some(r) = report else {
            let _ = writeln!(out, "CRASH: the world panicked or hit the time limit");
            let _ = writeln!(out, "replay: {}", cfg.replay_command());
            return out;
        };
        let _ = writeln!(
            out,
            "timings {}",
            serde_json::to_string(&r.timings).expect("plain data")
        );
        let _ = writeln!(
            out,
            "checks {}",
            serde_json::to_string(&r.checks).expect("plain data")
        );
        let faults: Vec<String> = r.faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "faults {}", faults.join(" "));
        let outcomes: Vec<String> = r.outcomes.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "requests {}", outcomes.join(" "));
        let _ = writeln!(
            out,
            "queued {} units sold {} of {}",
            r.queued, r.units_sold, cfg.stock
        );
        let _ = writeln!(
            out,
            "simulated {} ms in {:.0} ms wall ({:.0}x)",
            r.sim_ms,
            wall_ms,
            r.sim_ms as f64 / wall_ms.max(1e-3)
        );
        if r.verdict == Verdict::Ok {
            let _ = writeln!(out, "verdict: ok");
        } else {
            let _ = writeln!(
                out,
                "verdict: {:?} at {} ms",
                r.verdict,
                r.violated_at_ms.unwrap_or(0)
            );
            for v in &r.violations {
                let _ = writeln!(out, "violated: {v}");
            }
        }
        let _ = writeln!(out, "last events:");
        for e in &r.trace {
            let _ = writeln!(out, "  {e}");
        }
        if r.verdict != Verdict::Ok {
            let _ = writeln!(out, "replay: {}", cfg.replay_command());
        }
        out
    }

    fn line(cfg: &SimConfig, report: Option<&RunReport>, wall_ms: f64) -> serde_json::Value {
        serde_json::json!({
            "seed": cfg.seed,
            "scenario": cfg.scenario,
            "size": cfg.size,
            "planted": cfg.planted.map(|b| b.name()),
            "verdict": report.map_or("crash", |r| match r.verdict {
                Verdict::Ok => "ok",
                Verdict::Safety => "safety",
                Verdict::Liveness => "liveness",
            }),
            "faults": report.map(|r| r.faults.clone()).unwrap_or_default(),
            "coverage": report.map(|r| r.coverage.clone()).unwrap_or_default(),
            "sim_ms": report.map_or(0, |r| r.sim_ms),
            "wall_ms": wall_ms,
            "violations": report.map(|r| r.violations.clone()).unwrap_or_default(),
            "replay": cfg.replay_command(),
        })
    }

    pub fn main() -> ExitCode {
        // A crash is reported by exit code and replay command, not by a panic backtrace per seed.
        std::panic::set_hook(Box::new(|info| eprintln!("world crashed: {info}")));
        match Cli::parse().command {
            Command::Run(args) => {
                let cfg = args.config();
                let json = args.json;
                if !json {
                    println!(
                        "seed {} scenario {:?} planted {:?}",
                        cfg.seed,
                        cfg.scenario,
                        cfg.planted.map(|b| b.name())
                    );
                }
                let (report, wall_ms) = run_one(&cfg);
                if json {
                    println!("{}", serde_json::to_string(&report).expect("plain data"));
                } else {
                    print!("{}", human(&cfg, report.as_ref(), wall_ms));
                }
                ExitCode::from(code(report.map(|r| r.verdict)))
            }
            Command::Sweep {
                from,
                seeds,
                scenario,
                planted,
                shape,
                failures_dir,
            } => {
                let (scenarios, shape) = match planted {
                    Some(bug) => {
                        let (sc, jobs) = Scenario::for_bug(bug);
                        (
                            vec![sc],
                            Shape {
                                no_jobs: !jobs,
                                ..shape
                            },
                        )
                    }
                    None => (scenario.0, shape),
                };
                let mut worst = 0;
                for seed in from..from + seeds {
                    for &sc in &scenarios {
                        let cfg = config(seed, sc, planted, &shape);
                        let (report, wall_ms) = run_one(&cfg);
                        println!("{}", line(&cfg, report.as_ref(), wall_ms));
                        let c = code(report.as_ref().map(|r| r.verdict));
                        if c != 0 {
                            if let Some(dir) = &failures_dir {
                                let _ = std::fs::create_dir_all(dir);
                                let name = format!(
                                    "{:?}-{seed}{}.log",
                                    sc,
                                    planted.map_or(String::new(), |b| format!("-{}", b.name()))
                                );
                                let _ = std::fs::write(dir.join(name), human(&cfg, report.as_ref(), wall_ms));
                            }
                            if planted.is_some() {
                                return ExitCode::SUCCESS; // caught: the hunt for this bug is over
                            }
                            worst = worst.max(c);
                        }
                    }
                }
                ExitCode::from(worst)
            }
            Command::Shrink(args) => {
                let cfg = args.config();
                let started = Instant::now();
                let Some(s) = world::shrink(&cfg) else {
                    println!("seed {} passes: nothing to shrink", cfg.seed);
                    return ExitCode::SUCCESS;
                };
                let wall_ms = started.elapsed().as_secs_f64() * 1e3;
                println!(
                    "shrunk: {} faults to {} in {} runs",
                    s.from,
                    s.report.schedule.len(),
                    s.runs
                );
                print!("{}", human(&s.config, Some(&s.report), wall_ms));
                ExitCode::from(code(Some(s.report.verdict)))
            }
            Command::Bugs => {
                for b in Bug::ALL {
                    println!("{}", b.name());
                }
                ExitCode::SUCCESS
            }
            Command::Summarize { planted } => summarize(planted),
        }
    }

    #[derive(Deserialize)]
    struct Line {
        seed: u64,
        scenario: Scenario,
        size: seckill_sim::world::Size,
        planted: Option<String>,
        verdict: String,
        #[serde(default)]
        faults: BTreeMap<String, u64>,
        #[serde(default)]
        coverage: BTreeMap<String, u64>,
        sim_ms: u64,
        wall_ms: f64,
        #[serde(default)]
        replay: String,
    }

    /// Print in how many runs each coverage target happened (`coverage: name=runs …`), and each
    /// target that never did although the sweep ran enough of the scenarios that reach it; the
    /// number of those.
    fn coverage(lines: &[Line]) -> usize {
        let hit = |name: &str| lines.iter().filter(|l| l.coverage.contains_key(name)).count();
        let c: Vec<String> = COVERAGE_TARGETS
            .iter()
            .map(|(target, _, _)| target.name())
            .map(|name| format!("{name}={}", hit(&name)))
            .collect();
        println!("coverage (runs in which it happened): {}", c.join(" "));
        let mut missed = 0;
        for (target, scenarios, min_runs) in COVERAGE_TARGETS {
            let name = target.name();
            let runs = lines.iter().filter(|l| scenarios.contains(&l.scenario)).count();
            if runs >= *min_runs && hit(&name) == 0 {
                println!("NOT COVERED {name}: never happened in {runs} runs of {scenarios:?}");
                missed += 1;
            }
        }
        missed
    }

    fn summarize(planted: bool) -> ExitCode {
        let mut lines = Vec::new();
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            match serde_json::from_str::<Line>(&l) {
                Ok(parsed) => lines.push(parsed),
                Err(e) => eprintln!("skipping a line that is not a sweep result ({e}): {l}"),
            }
        }
        let failed: Vec<&Line> = lines.iter().filter(|l| l.verdict != "ok").collect();
        let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
        for l in &lines {
            for (k, v) in &l.faults {
                *faults.entry(k).or_insert(0) += v;
            }
        }
        let sim: u64 = lines.iter().map(|l| l.sim_ms).sum();
        let wall: f64 = lines.iter().map(|l| l.wall_ms).sum();
        if planted {
            // Per bug: the number of seeds it took to catch it (its sweep stops at the catch).
            let mut per_bug: BTreeMap<&str, (u64, bool)> = BTreeMap::new();
            for l in &lines {
                let e = per_bug
                    .entry(l.planted.as_deref().unwrap_or("none"))
                    .or_insert((0, false));
                e.0 += 1;
                e.1 |= l.verdict != "ok";
            }
            let caught: Vec<u64> = per_bug.values().filter(|(_, c)| *c).map(|(n, _)| *n).collect();
            let mut sorted = caught.clone();
            sorted.sort_unstable();
            let median = sorted
                .get(sorted.len().saturating_sub(1) / 2)
                .copied()
                .unwrap_or(0);
            for (bug, (n, c)) in &per_bug {
                println!(
                    "  {bug}: {} after {n} seed(s)",
                    if *c { "caught" } else { "NOT caught" }
                );
            }
            println!(
                "planted: caught {}/{} (seeds-to-catch max {} median {})",
                caught.len(),
                Bug::ALL.len(),
                sorted.last().copied().unwrap_or(0),
                median
            );
            return if caught.len() == Bug::ALL.len() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
        }
        for l in &failed {
            println!("FAILED seed {} ({}): {}", l.seed, l.verdict, l.replay);
        }
        println!(
            "seeds: {} passed: {} failed: {}",
            lines.len(),
            lines.len() - failed.len(),
            failed.len()
        );
        let f: Vec<String> = faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("faults: {}", f.join(" "));
        let missed = coverage(&lines);
        // Per scenario and size too: one slow scenario hides in the total.
        let mut per: BTreeMap<(String, &str), (u64, f64)> = BTreeMap::new();
        for l in &lines {
            let e = per.entry((l.scenario.name(), l.size.name())).or_insert((0, 0.0));
            e.0 += l.sim_ms;
            e.1 += l.wall_ms;
        }
        for ((scenario, size), (sim, wall)) in &per {
            println!(
                "time-compression {scenario} {size}: {:.1}x",
                *sim as f64 / wall.max(1e-3)
            );
        }
        println!("time-compression: {:.0}x", sim as f64 / wall.max(1e-3));
        if failed.is_empty() && missed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn line(scenario: Scenario, covered: &[&str]) -> Line {
            Line {
                seed: 0,
                scenario,
                size: seckill_sim::world::Size::Small,
                planted: None,
                verdict: "ok".into(),
                faults: BTreeMap::new(),
                coverage: covered.iter().map(|c| (c.to_string(), 1)).collect(),
                sim_ms: 0,
                wall_ms: 0.0,
                replay: String::new(),
            }
        }

        #[test]
        fn a_sweep_misses_a_target_only_after_enough_runs_of_its_scenarios() {
            // Nothing happened in 19 runs of the skewed scenario: too few to judge anything.
            let few: Vec<Line> = (0..19).map(|_| line(Scenario::Skewed, &[])).collect();
            assert_eq!(coverage(&few), 0);
            // In 20, its target (a transfer the reconciler finished) counts as missed.
            let enough: Vec<Line> = (0..20).map(|_| line(Scenario::Skewed, &[])).collect();
            assert_eq!(coverage(&enough), 1);
            // One run that saw it is enough.
            let mut seen = enough;
            seen[7] = line(Scenario::Skewed, &["transfer_finished_by_reconciler"]);
            assert_eq!(coverage(&seen), 0);
        }
    }
}
