//! Scenarios and a run's configuration: which faults each scenario draws, which checks it
//! holds the engine to, the sizes, the schedule a replay carries, and the activity on sale.

use super::fault::{ALL_FAULTS, CONSUMER_FAULTS, PRODUCER_FAULTS};
use super::{Fault, ACTIVITY};
use crate::SIM_EPOCH_MS;
use seckill_core::domain::{Activity, ActivitySpec};
use seckill_core::planted::Bug;
use serde::Serialize;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// No faults: the funnel under contention alone.
    Calm,
    /// Consumer crashes, ledger lock-wait timeouts / unknown commits / lost connections,
    /// duplicated and delayed records.
    ConsumerFaults,
    /// Refused publishes, lost publish acks, delayed and duplicated records.
    ProducerFaults,
    /// Redis restarts that lose the last AOF window, and failovers to a replica that lags.
    RedisLoss,
    /// The whole catalog, including faults only the reconciler can heal (per seed a random
    /// subset of the types: swarm testing).
    Chaos,
    /// Records lost after their ack: only the reconciler's republish gets those orders through.
    LostRecords,
    /// The skewed workload with transfers under fire: jobs crashes and slow Redis cut transfers
    /// between their steps (lost replies, crashes), which the reconciler must finish exactly once.
    Rebalancing,
    /// Demand barely above stock and crowded onto a few buckets, every order paid, the jobs
    /// node crashing now and then: only rebalancing sells the cold buckets' units (L2).
    Skewed,
    /// The operator at work: pause, resume and close through random API nodes while API and
    /// jobs nodes crash and Redis loses everything (so recoveries run during pauses). S5: after
    /// a pause or close returned, no request is answered "queued" until the registry holds a
    /// newer resume.
    Operator,
    /// Redis loses everything, every API node restarts (half the time the job runners are down
    /// until it is done), and the operator calls warmup through one of them — the sequence the
    /// runbook allows (docs/operations.md) — while records go missing.
    FullLossRestart,
    /// Both job runners detect the same losses; runners are paused past their claim's lease
    /// and API nodes past the delivery timeout (they wake up as zombies), and crash.
    CompetingRecoveries,
    /// Redis loss as in `RedisLoss`, the first restart while every job runner is down (a deploy
    /// of the jobs role): the sale goes on, on what Redis kept, with nobody to notice the loss —
    /// orders refused for want of a unit free their users, who buy again — until a runner comes
    /// back and recovers.
    JobsAway,
}

/// Which checks a run holds the engine to.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Checks {
    /// R1 at quiescence.
    pub r1: bool,
    /// L1 at quiescence: every queued request resolved, nothing left open, the bus drained.
    pub l1: bool,
    /// S2 in Redis (one open reservation per user) continuously: only while Redis loses nothing.
    pub s2_redis: bool,
    /// L2 at quiescence: demand ≥ stock, so no unit is left unsold (rebalancing on).
    pub l2: bool,
}

impl Scenario {
    /// The name the command line knows it by.
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .expect("no scenario is hidden")
            .get_name()
            .to_string()
    }

    pub(super) fn faults(self) -> &'static [Fault] {
        match self {
            Scenario::Calm => &[],
            Scenario::ConsumerFaults => CONSUMER_FAULTS,
            Scenario::ProducerFaults => PRODUCER_FAULTS,
            Scenario::RedisLoss | Scenario::JobsAway => &[
                Fault::RedisRestartAof,
                Fault::RedisRestartAof,
                Fault::RedisFailover,
            ],
            Scenario::Chaos => ALL_FAULTS,
            Scenario::Skewed => &[Fault::JobsCrash],
            Scenario::Rebalancing => &[
                Fault::JobsCrash,
                Fault::RedisSlowScript,
                Fault::RedisLatency,
                Fault::LedgerDeadlock,
            ],
            Scenario::LostRecords => &[Fault::MqLoseAfterAck, Fault::MqAckLost],
            Scenario::Operator => &[
                Fault::OperatorPause,
                Fault::OperatorPause,
                Fault::OperatorPause,
                Fault::PauseInRecovery,
                Fault::OperatorWarmup,
                Fault::RedisKeyLost,
                Fault::EngineCrash,
                Fault::JobsCrash,
                Fault::RedisRestartVolatile,
                Fault::LedgerDeadlock,
            ],
            Scenario::FullLossRestart => &[Fault::FullLossRestart, Fault::EnginePause, Fault::MqAckLost],
            // Records lost after their ack weigh triple: what a recovery must rescue from the
            // outbox (the reconciler, which would republish them, stands aside while it runs).
            Scenario::CompetingRecoveries => &[
                Fault::RedisRestartAof,
                Fault::RedisRestartAof,
                Fault::RedisRestartVolatile,
                Fault::JobsPause,
                Fault::JobsPause,
                Fault::JobsCrash,
                Fault::EnginePause,
                Fault::MqAckLost,
                Fault::MqVisibleLate,
                Fault::RedisResend,
                Fault::DeliveredLate,
                Fault::LedgerStalledTxn,
                Fault::LedgerDeadlock,
                Fault::MqLoseAfterAck,
                Fault::MqLoseAfterAck,
                Fault::MqLoseAfterAck,
            ],
        }
    }

    /// Milliseconds between two faults: a scenario of one rare fault must leave room between them.
    pub(super) fn pace(self) -> std::ops::Range<u64> {
        match self {
            Scenario::Skewed => 300..900,
            Scenario::Rebalancing => 100..300,
            Scenario::FullLossRestart => 100..300,
            Scenario::CompetingRecoveries => 50..200,
            Scenario::Operator => 30..150,
            _ => 20..120,
        }
    }

    /// R1 and L1 hold at quiescence with the jobs node running (reconciler, recovery, payment
    /// timeout) in every scenario, and without it where nothing can strand a reservation.
    pub fn checks(self, jobs: bool) -> Checks {
        let recoverable = matches!(
            self,
            Scenario::Calm | Scenario::ConsumerFaults | Scenario::ProducerFaults | Scenario::Skewed
        );
        let redis_keeps_data = recoverable || matches!(self, Scenario::LostRecords | Scenario::Rebalancing);
        Checks {
            r1: jobs || recoverable,
            l1: jobs || recoverable,
            s2_redis: redis_keeps_data,
            l2: jobs && self == Scenario::Skewed,
        }
    }

    /// The scenario whose faults make a planted bug observable, and whether the jobs node runs.
    /// The engine-path bugs run without the jobs: the reconciler would heal some of them into
    /// slower but correct outcomes (a skipped record is republished), hiding the bug. Except a
    /// unit given back although its order went through: the payment timeout's cancels put
    /// units back on sale, and the ledger's guard meets the extra one twice as often.
    pub fn for_bug(bug: Bug) -> (Scenario, bool) {
        match bug {
            Bug::NonAtomicReserve => (Scenario::Calm, false),
            Bug::AckBeforeCommit | Bug::RedeliveredAsDuplicate | Bug::FailedRewindIgnored => {
                (Scenario::ConsumerFaults, false)
            }
            Bug::ReleaseToRoutedBucket | Bug::FallbackWithoutPendingMark => (Scenario::ProducerFaults, false),
            Bug::ReleaseOnIndeterminatePublish => (Scenario::ProducerFaults, true),
            Bug::NoBuyerUniqueKey | Bug::NoStockGuard => (Scenario::RedisLoss, false),
            Bug::CancelReleaseToRoutedBucket => (Scenario::Calm, true),
            Bug::FailedOrderLocksOut => (Scenario::RedisLoss, true),
            Bug::RebuildWhileInFlight => (Scenario::Chaos, true),
            Bug::RepublishWithFreshId => (Scenario::LostRecords, true),
            Bug::NonIdempotentGive => (Scenario::Rebalancing, true),
            Bug::ReconcilerResetsStock => (Scenario::ConsumerFaults, true),
            Bug::GateNotChecked | Bug::ReopenOverPause => (Scenario::Operator, true),
            Bug::WarmupFromPlan => (Scenario::FullLossRestart, true),
            Bug::RebuildDropsOutbox
            | Bug::NoGenerationCheck
            | Bug::RecoveryWithoutFence
            | Bug::UnfencedBump
            | Bug::RescueRepublished => (Scenario::CompetingRecoveries, true),
        }
    }
}

/// The two sizes a run comes in. Only the size (users, stock, buckets, sale length) differs
/// between them; a scenario's workload (skew, payments, retries) is its own at every size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Size {
    /// A few hundred users: quick seed sweeps in `cargo sim`.
    Small,
    /// The simulation's own size: 10,000 users, 1,000 units, 16 buckets.
    Standard,
}

impl Size {
    /// The name reports print it by (as it serializes).
    pub fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Standard => "standard",
        }
    }
}

/// One fault the nemesis injected: how long it waited after the previous fault ended (its pace),
/// what, and for how long. A run reports its schedule; `--schedule` replays one — its own run
/// exactly, since the waits are the ones drawn (`seckill-sim shrink` drops faults from a failing
/// run's schedule for as long as it still fails: the faults after a dropped one then come earlier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Scheduled {
    pub after_ms: u64,
    pub fault: Fault,
    pub hold_ms: u64,
}

/// A schedule as `--schedule` takes it: `<after ms>:<fault>:<hold ms>`, comma-separated.
pub fn schedule_text(schedule: &[Scheduled]) -> String {
    schedule
        .iter()
        .map(|s| format!("{}:{}:{}", s.after_ms, s.fault.name(), s.hold_ms))
        .collect::<Vec<_>>()
        .join(",")
}

/// `schedule_text` read back; an error names the entry that does not read.
pub fn parse_schedule(text: &str) -> Result<Vec<Scheduled>, String> {
    text.split(',')
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let bad = || format!("schedule entry {entry:?}: expected <after ms>:<fault>:<hold ms>");
            let mut parts = entry.split(':');
            let (Some(after), Some(fault), Some(hold), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let fault = serde_json::from_value(serde_json::Value::String(fault.into()))
                .map_err(|_| format!("schedule entry {entry:?}: unknown fault {fault:?}"))?;
            Ok(Scheduled {
                after_ms: after.parse().map_err(|_| bad())?,
                fault,
                hold_ms: hold.parse().map_err(|_| bad())?,
            })
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    pub seed: u64,
    pub scenario: Scenario,
    /// The size the run's shape started from (`--standard`); the four fields below may
    /// override it.
    pub size: Size,
    pub planted: Option<Bug>,
    /// Run the jobs node (reconciler, recovery, payment timeout).
    pub jobs: bool,
    pub users: u64,
    pub stock: u64,
    pub buckets: u32,
    pub fallback_pct: u8,
    pub clicks_per_user: u32,
    pub skew: f64,
    pub engines: usize,
    pub consumers: usize,
    pub clients: usize,
    pub sale_ms: u64,
    /// Unpaid orders are cancelled after this long (the payment-timeout job).
    pub pay_timeout_ms: u64,
    /// Share of queued users who pay (the rest never do, DESIGN §9 workload).
    pub pay_ratio: f64,
    /// A click answered "sold out" or "unavailable" (or not at all) is retried this many times
    /// while the sale lasts.
    pub retries_when_sold_out: u32,
    /// Deliveries per ledger transaction: small against the sale's record count, so crashes land
    /// mid-stream and records are still in flight when a recovery looks; large enough that two
    /// consumers drain the backlog in seconds, as production's (256) would. A small sale has a
    /// few hundred records (16 a batch); a standard one up to eleven thousand after Redis lost
    /// data, which at 16 took twenty simulated seconds to drain (64, a quarter of production's).
    pub consumer_batch: usize,
    /// Inject exactly these faults (instead of the scenario's random ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<Scheduled>>,
}

impl SimConfig {
    /// A run of `scenario` at `size`: the size decides users, stock, buckets and the sale's
    /// length; the scenario decides the workload, whatever the size.
    pub fn new(seed: u64, scenario: Scenario, size: Size) -> Self {
        // Skewed demand: nine in ten users crowd a few buckets, every order is paid and a buyer
        // told "sold out" keeps trying, so only rebalancing sells the cold buckets' units (L2).
        // The operator's scenario has it too: units go on selling through the whole sale, so a
        // pause always meets buyers who would get one.
        let crowded = matches!(
            scenario,
            Scenario::Skewed | Scenario::Rebalancing | Scenario::Operator
        );
        let (users, stock, buckets, sale_ms) = match (size, crowded) {
            (Size::Standard, _) => (10_000, 1_000, 16, 2_000),
            // 200 users for 120 units at the small size: demand barely above stock.
            (Size::Small, true) => (200, 120, 6, 1_500),
            (Size::Small, false) => (600, 240, 6, 800),
        };
        SimConfig {
            seed,
            scenario,
            size,
            planted: None,
            jobs: true,
            users,
            stock,
            buckets,
            fallback_pct: 20,
            clicks_per_user: 3,
            skew: if crowded { 0.9 } else { 0.3 },
            engines: 3,
            consumers: 2,
            clients: 4,
            sale_ms,
            pay_timeout_ms: 1_500,
            pay_ratio: if crowded { 1.0 } else { 0.7 },
            retries_when_sold_out: if crowded { 16 } else { 0 },
            consumer_batch: match size {
                Size::Small => 16,
                Size::Standard => 64,
            },
            schedule: None,
        }
    }

    /// The standard run: 10,000 users, 1,000 units (DESIGN §9).
    pub fn standard(seed: u64, scenario: Scenario) -> Self {
        Self::new(seed, scenario, Size::Standard)
    }

    /// A small run for quick seed sweeps in `cargo sim`.
    pub fn small(seed: u64, scenario: Scenario) -> Self {
        Self::new(seed, scenario, Size::Small)
    }

    /// The command that replays this run exactly: every field a flag can set, even where it
    /// equals its default (`crate::args` parses it back; a test holds the round trip).
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "cargo sim-run run --seed {} --scenario {}{} --users {} --stock {} --buckets {} --sale-ms {}",
            self.seed,
            self.scenario.name(),
            if self.size == Size::Standard {
                " --standard"
            } else {
                ""
            },
            self.users,
            self.stock,
            self.buckets,
            self.sale_ms
        );
        if let Some(b) = self.planted {
            cmd += &format!(" --planted {}", b.name());
        }
        if !self.jobs {
            cmd += " --no-jobs";
        }
        if let Some(s) = &self.schedule {
            cmd += &format!(" --schedule {}", schedule_text(s));
        }
        cmd
    }
}

pub(super) fn activity(cfg: &SimConfig) -> Activity {
    Activity::new(ActivitySpec {
        id: ACTIVITY,
        total_stock: cfg.stock,
        buckets: cfg.buckets,
        fallback_pct: cfg.fallback_pct,
        per_user_limit: 1,
        // Opens shortly after the clients start, so skewed engine clocks disagree at the edge.
        start_ms: SIM_EPOCH_MS + 20,
        end_ms: SIM_EPOCH_MS + 3_600_000,
        pay_timeout_ms: cfg.pay_timeout_ms,
        unit_price_minor: 0,
    })
    .expect("simulation activities are valid")
}
