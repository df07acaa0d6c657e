//! Shrinking: minimise a failing run's fault schedule.

use super::{run, RunReport, Scheduled, SimConfig, Verdict};

/// What `shrink` reached: a run that fails like the original, with fewer faults.
pub struct Shrunk {
    pub config: SimConfig,
    pub report: RunReport,
    /// Faults in the original run's schedule.
    pub from: usize,
    /// Runs it took, the original included.
    pub runs: usize,
}

/// Minimise the fault schedule of a failing run: drop chunks of faults (halves first, then
/// quarters, … down to one at a time), keeping a drop whenever the run still fails with the same
/// verdict. A run with fewer faults is another run (the world draws differently after the first
/// dropped fault): what comes back is a run that fails, with the faults it needed. `None`: the
/// run does not fail.
pub fn shrink(cfg: &SimConfig) -> Option<Shrunk> {
    let first = run(cfg);
    if first.verdict == Verdict::Ok {
        return None;
    }
    let verdict = first.verdict;
    let mut runs = 1;
    let from = first.schedule.len();
    let mut best = first.schedule.clone();
    let mut report = first;
    let mut chunk = (best.len() / 2).max(1);
    loop {
        let (mut i, mut dropped) = (0, false);
        while i < best.len() {
            let candidate: Vec<Scheduled> = best[..i]
                .iter()
                .chain(&best[(i + chunk).min(best.len())..])
                .copied()
                .collect();
            runs += 1;
            let given = SimConfig {
                schedule: Some(candidate.clone()),
                ..cfg.clone()
            };
            // A candidate whose world crashes (panics, or hits the time limit) does not fail the
            // same way: its faults stay.
            match std::panic::catch_unwind(|| run(&given)) {
                Ok(r) if r.verdict == verdict => (best, report, dropped) = (candidate, r, true),
                _ => i += chunk,
            }
        }
        if chunk == 1 && !dropped {
            break;
        }
        if !dropped {
            chunk /= 2;
        }
    }
    Some(Shrunk {
        config: SimConfig {
            schedule: Some(best),
            ..cfg.clone()
        },
        report,
        from,
        runs,
    })
}
