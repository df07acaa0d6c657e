//! One simulated run: the world (stores, engines, consumers, clients), the nemesis, the
//! continuous checker, and the report.
//!
//! Phases: warmup → sale under faults → heal → settle → final checks. Safety (S1–S4) is checked
//! every few simulated milliseconds during the sale and settle; R1 and liveness only at the end,
//! and only in scenarios whose faults the engine can recover from without the reconciler (the
//! report lists which checks were active). Everything random comes from madsim's seeded RNG, so
//! a seed replays the run exactly.

use crate::faults::Faults;
use crate::nodes::{consumer_main, engine_main, EngineParams, Timings, GROUP};
use crate::rpc::{self, engine_addr};
use crate::stores::{
    serve_kafka, serve_ledger, serve_redis, KafkaLog, LedgerLog, Persistence, RedisStore, SESSION_TIMEOUT,
};
use crate::SIM_EPOCH_MS;
use madsim::net::{Endpoint, NetSim};
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::{Handle, NodeHandle};
use rand::SeedableRng;
use seckill_engine::adapters::embedded::{EmbeddedLedger, EmbeddedRedis, RedisModel};
use seckill_engine::adapters::script::ScriptedStockCache;
use seckill_engine::domain::{
    Activity, ActivityId, ActivitySpec, ActivityState, BucketNo, BucketRouter, Reservation, StockPlan, UserId,
};
use seckill_engine::planted::{self, Bug};
use seckill_engine::ports::{CacheView, Ledger, OrderStatus, PayOutcome, StockCache};
use seckill_engine::service::{audit, OrderState, PurchaseOutcome};
use seckill_invariants as inv;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const ACTIVITY: ActivityId = ActivityId(1);
const PARTITIONS: u32 = 4;
/// Job runners racing over the activity (each runs recovery, reconciler, payment timeout and
/// rebalancer), as production runs several.
const JOBS_NODES: usize = 2;
/// How often the checker looks during the sale and settle (simulated time).
const CHECK_EVERY: Duration = Duration::from_millis(25);
/// Settle gives up after this long (simulated), not counting the time a process sleeps at a
/// long fault point or an API node is held paused until a bump: then the bus never drained.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// The long fault point (`planted::stall_once` site) before a recovery's bump.
const BUMP_SITE: u32 = 3;
/// The rebalancer's long fault point, between its take and its ledger step.
const REBALANCE_SITE: u32 = 2;
/// The recovery's other long fault points (see `world`), one of which is armed with `BUMP_SITE`.
const RECOVERY_LATE_SITES: [u32; 4] = [5, 0, 1, 4];
/// Every long fault point of the recovery, as a mask of sites.
const RECOVERY_LONG_SITES: u64 = {
    let (mut mask, mut i) = (1 << BUMP_SITE, 0);
    while i < RECOVERY_LATE_SITES.len() {
        mask |= 1 << RECOVERY_LATE_SITES[i];
        i += 1;
    }
    mask
};

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
    /// README prescribes — while records go missing.
    FullLossRestart,
    /// Both job runners detect the same losses; runners are paused past their claim's lease
    /// and API nodes past the delivery timeout (they wake up as zombies), and crash.
    CompetingRecoveries,
}

/// Every fault type the nemesis knows (DESIGN §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    ConsumerCrash,
    JobsCrash,
    LedgerLockWait,
    LedgerCommitUnknown,
    LedgerConnLoss,
    MqDuplicate,
    MqDelay,
    MqRefuse,
    MqAckLost,
    MqLoseAfterAck,
    BrokerDown,
    RedisLatency,
    RedisSlowScript,
    RedisRestartVolatile,
    RedisRestartAof,
    /// The primary dies and a replica that lags it by a random window (up to the seed's
    /// `replica_lag_ms`) is promoted in its place: what the primary acknowledged in that window
    /// is gone, at any moment rather than at an fsync tick, and the run id is the replica's.
    RedisFailover,
    /// One bucket's stock key or gate vanishes alone (evicted under memory pressure, or deleted
    /// by hand): no restart, the run id unchanged — only the detection's "a gate or a bucket is
    /// missing" (DESIGN §11.3) can notice, and the recovery must rebuild it.
    RedisKeyLost,
    RedisPartition,
    /// One link cut, both ways or one way (requests arrive and their replies are lost, or
    /// requests are lost): an API node and Kafka or Redis, a worker and MySQL or Kafka, a job
    /// runner and Redis or MySQL. The rest of the world talks on.
    LinkPartition,
    MysqlUnavailable,
    EngineCrash,
    ClockSkew,
    PacketLoss,
    /// The operator pauses (or closes) through one API node, and later resumes through another.
    OperatorPause,
    /// The operator sees a recovery under way and pauses (or closes) the sale, resuming later:
    /// the recovery's reopen must leave that pause standing.
    PauseInRecovery,
    /// Redis restarts empty, every API node restarts, the operator warms the activity up.
    FullLossRestart,
    /// The operator runs the README's warmup again mid-sale (a deploy job re-running its steps):
    /// on a Redis that lost nothing it must leave every bucket as it is.
    OperatorWarmup,
    /// The broker loses records after their ack for as long as the next recovery runs (its
    /// outbox rescue among them): a rescued record lost leaves its reservation open and not in
    /// the ledger, which the rebuild must refuse to delete (the next attempt rescues it again).
    MqLoseInRecovery,
    /// Records become visible late (`MqVisibleLate`) for as long as the next recovery runs: a
    /// record of its own rescue must not land after its bump, refused as stale.
    MqLateInRecovery,
    /// Redis scripts are re-sent (`RedisResend`, every other one) for as long as the next
    /// recovery runs: its close, rebuild, reopen and finish run twice.
    RedisResendInRecovery,
    /// An API node stops (SIGSTOP-like) past the delivery timeout, then goes on where it was.
    EnginePause,
    /// A jobs node stops past its recovery claim's lease, then goes on where it was.
    JobsPause,
    /// A worker stops past the group's session timeout, then goes on where it was: its
    /// partitions went to another member meanwhile, and its late commit is refused.
    ConsumerPause,
    /// A consumer's rewind fails (the broker cannot give the committed offsets, a seek is
    /// refused): its position stays past the batch that failed.
    MqRewindFail,
    /// Records become visible only after a delay drawn past the recovery's quiesce (a follower
    /// slow to replicate holds the high watermark back), their producers long gone: a record
    /// that lands after a recovery's drain and bump.
    MqVisibleLate,
    /// A script runs, its reply is lost with the connection, and the Redis client sends it again
    /// (as redis-rs's cluster client does): every script must answer its re-run what its first
    /// run did.
    RedisResend,
    /// The network holds requests to Redis and MySQL back past their clients' timeouts and
    /// delivers them seconds later (TCP retransmitting across a partition that heals): the
    /// client heard nothing, the store runs what it was sent — a runner's bump after its
    /// successor recovered, a reserve after its buyer was told "unavailable".
    DeliveredLate,
    /// Ledger transactions are rolled back as deadlock victims, every attempt of them
    /// (determinate): a batch, a transfer, a payment timeout's cancels, an operator's intent
    /// write, a recovery's bump each fail whole and must be run again by their caller.
    LedgerDeadlock,
    /// A worker goes silent inside a batch's transaction, holding the generation's row lock
    /// until the server's idle timeout rolls it back: a recovery's bump waits for it.
    LedgerStalledTxn,
    /// Batches stall inside their transactions (`LedgerStalledTxn`, one in five) while the next
    /// recovery runs: a batch of a record that became visible after the drain holds its bump.
    LedgerStalledInRecovery,
    /// Requests to the ledger delivered late (`DeliveredLate`) while the next recovery runs:
    /// its own writes land after it gave up on them, maybe after another runner took it over.
    DeliveredLateInRecovery,
    /// Ledger transactions rolled back as deadlock victims (`LedgerDeadlock`, three in ten)
    /// while the next recovery runs, for two leases at most: its rescue, its bump and the
    /// batches around them fail whole and run again.
    DeadlockInRecovery,
    /// The broker goes down past the publish timeout, and Redis restarts (AOF) meanwhile:
    /// purchases whose publish timed out find their reservation gone with the restart's window
    /// — an outcome nobody knows, which must not be answered "queued".
    BrokerDownAcrossRestart,
    /// An API node paused until a recovery bumps the generation (and a little past it; at most
    /// its hold), the heal sparing it: it wakes a zombie whose purchases publish orders of the
    /// old generation, their outbox entries gone with the Redis loss the recovery is for.
    EnginePauseAcrossBump,
}

/// A knob's probability while its window is open, else 0.
/// The knob of a window in which the broker loses records after their ack (one in five).
fn lose_after_ack(k: &mut crate::faults::Knobs, on: bool) {
    k.mq_lose_after_ack = prob(0.2, on);
}

/// The knob of a window in which Redis scripts are re-sent (one in five).
fn redis_resend(k: &mut crate::faults::Knobs, on: bool) {
    k.redis_resend = prob(0.2, on);
}

/// The knobs of a window in which requests to Redis and MySQL are delivered late (one in ten).
fn delivered_late(k: &mut crate::faults::Knobs, on: bool) {
    k.redis_delivered_late = prob(0.1, on);
    k.ledger_delivered_late = prob(0.1, on);
}

/// The knob of a window in which records become visible past the quiesce (three in ten).
fn visible_late(k: &mut crate::faults::Knobs, on: bool) {
    k.mq_visible_late = prob(0.3, on);
}

fn prob(p: f64, on: bool) -> f64 {
    if on {
        p
    } else {
        0.0
    }
}

/// A knob's delay while its window is open, else none.
fn delay(ms: u64, on: bool) -> Duration {
    Duration::from_millis(if on { ms } else { 0 })
}

impl Fault {
    /// How long the fault lasts, in ms (a window, a crash's downtime, a pause).
    fn hold_range(self) -> std::ops::Range<u64> {
        let session = SESSION_TIMEOUT.as_millis() as u64;
        match self {
            // Past the delivery timeout: a publish under way goes on after a recovery ran.
            Fault::EnginePause => 1_500..3_000,
            // Past the claim's lease: another runner takes the recovery over meanwhile.
            Fault::JobsPause => 2_000..6_000,
            // Past the session timeout: the group rebalances without it.
            Fault::ConsumerPause => session + 200..session + 1_500,
            // Long enough to meet the ledger's failures: a rewind is asked for only after one.
            Fault::MqRewindFail => 300..1_500,
            _ => 30..300,
        }
    }
}

// Unknown commits and crashes weigh double: they are what redeliver records mid-stream.
const CONSUMER_FAULTS: &[Fault] = &[
    Fault::ConsumerCrash,
    Fault::ConsumerCrash,
    Fault::ConsumerPause,
    Fault::LedgerLockWait,
    Fault::LedgerCommitUnknown,
    Fault::LedgerCommitUnknown,
    Fault::LedgerConnLoss,
    Fault::LedgerStalledTxn,
    Fault::LedgerDeadlock,
    Fault::MqDuplicate,
    Fault::MqDelay,
    Fault::MqRewindFail,
    Fault::MqRewindFail,
];
// No lost records and no Redis slowness here: without the jobs node, L1 must hold (a lost record
// or a timed-out reserve strands a reservation only the reconciler can close).
// Refusals and lost acks weigh triple: they are what exercise the publish-failure paths.
const PRODUCER_FAULTS: &[Fault] = &[
    Fault::MqRefuse,
    Fault::MqRefuse,
    Fault::MqRefuse,
    Fault::MqAckLost,
    Fault::MqAckLost,
    Fault::MqAckLost,
    Fault::MqDelay,
    Fault::MqDuplicate,
    Fault::RedisResend,
];
const ALL_FAULTS: &[Fault] = &[
    Fault::ConsumerCrash,
    Fault::ConsumerPause,
    Fault::JobsCrash,
    Fault::LedgerLockWait,
    Fault::LedgerCommitUnknown,
    Fault::LedgerConnLoss,
    Fault::MqDuplicate,
    Fault::MqDelay,
    Fault::MqRefuse,
    Fault::MqAckLost,
    Fault::MqLoseAfterAck,
    Fault::BrokerDown,
    Fault::RedisLatency,
    Fault::RedisSlowScript,
    Fault::RedisRestartVolatile,
    Fault::RedisRestartAof,
    Fault::RedisFailover,
    Fault::RedisKeyLost,
    Fault::RedisPartition,
    Fault::LinkPartition,
    Fault::MysqlUnavailable,
    Fault::EngineCrash,
    Fault::ClockSkew,
    Fault::PacketLoss,
    Fault::MqRewindFail,
    Fault::MqVisibleLate,
    Fault::RedisResend,
    Fault::DeliveredLate,
    Fault::LedgerStalledTxn,
    Fault::LedgerDeadlock,
];

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

    fn faults(self) -> &'static [Fault] {
        match self {
            Scenario::Calm => &[],
            Scenario::ConsumerFaults => CONSUMER_FAULTS,
            Scenario::ProducerFaults => PRODUCER_FAULTS,
            Scenario::RedisLoss => &[
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
    fn pace(self) -> std::ops::Range<u64> {
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
            Bug::RebuildWhileInFlight | Bug::FailedOrderLocksOut => (Scenario::RedisLoss, true),
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
    let name = |f: Fault| {
        serde_json::to_value(f)
            .expect("a unit variant")
            .as_str()
            .map(str::to_string)
    };
    schedule
        .iter()
        .map(|s| format!("{}:{}:{}", s.after_ms, name(s.fault).expect("a name"), s.hold_ms))
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

/// The interesting states a sweep must have seen (`Faults::cover`): each with the scenarios that
/// reach it and how many runs of those a sweep needs before a target that never happened fails
/// it (most are reached in a few runs; the outbox rescue needs a publish cut at the very moment
/// a recovery closes the gates, about one run in twenty of its two scenarios).
pub const COVERAGE_TARGETS: &[(&str, &[Scenario], usize)] = &[
    ("fallback_won", &[Scenario::Calm, Scenario::Chaos], 20),
    (
        "redelivery_deduped",
        &[Scenario::ConsumerFaults, Scenario::LostRecords],
        20,
    ),
    (
        "reconciler_republished",
        &[Scenario::ConsumerFaults, Scenario::LostRecords],
        20,
    ),
    (
        "cancel_released_at_timeout",
        &[Scenario::Calm, Scenario::RedisLoss],
        20,
    ),
    (
        "cancel_release_finished",
        &[Scenario::Calm, Scenario::RedisLoss],
        20,
    ),
    ("pending_mark_resolved", &[Scenario::Rebalancing], 20),
    (
        "transfer_finished_by_reconciler",
        &[Scenario::Rebalancing, Scenario::Skewed],
        20,
    ),
    ("recovered", &[Scenario::RedisLoss, Scenario::FullLossRestart], 20),
    ("recovery_contended", &[Scenario::CompetingRecoveries], 20),
    (
        "sold_after_recovery",
        &[Scenario::RedisLoss, Scenario::FullLossRestart],
        20,
    ),
    ("recovery_under_load", &[Scenario::Operator, Scenario::Chaos], 20),
    ("stale_generation_refused", &[Scenario::CompetingRecoveries], 20),
    ("duplicate_buyer_refused", &[Scenario::RedisLoss], 20),
    ("rewind_retried", &[Scenario::ConsumerFaults], 20),
    ("out_of_stock_refused", &[Scenario::RedisLoss], 20),
    (
        "failed_user_bought_again",
        &[Scenario::RedisLoss, Scenario::CompetingRecoveries],
        20,
    ),
    ("failed_user_freed_by_reconciler", &[Scenario::RedisLoss], 20),
    (
        "outbox_rescued",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        100,
    ),
    (
        "late_record_after_bump_kept",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        100,
    ),
    // A script run again after its reply was lost (`RedisResend`) takes its "already done"
    // branch and answers what its first run did.
    (
        "rerun_reserve_kept",
        &[Scenario::ProducerFaults, Scenario::Chaos],
        20,
    ),
    (
        "rerun_release_absent",
        &[Scenario::ProducerFaults, Scenario::Chaos],
        100,
    ),
    (
        "rerun_settle_absent",
        &[Scenario::ProducerFaults, Scenario::Chaos],
        20,
    ),
    ("rerun_transfer_exists", &[Scenario::Chaos], 200),
    (
        "rerun_rebuild_again",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    (
        "rerun_reopen_kept",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    (
        "rerun_finish_kept",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // A runner's finish after another runner took its claim over (it stalled between its reopen
    // and its finish past its lease): Redis tells it the claim was lost.
    (
        "finish_after_takeover_lost",
        &[Scenario::CompetingRecoveries],
        100,
    ),
    // A runner's bump that reached the ledger after another runner's (delivered late, or sent
    // by a runner that stalled past its lease): the compare-and-set refuses it.
    (
        "bump_fenced",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // A recovery's bump that waited for a batch holding the generation (`LedgerStalledTxn`).
    (
        "bump_waited_for_a_batch",
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // Ledger transactions rolled back as deadlock victims (`LedgerDeadlock`: every attempt the
    // adapter makes), which their callers must run again: a batch, a transfer, a payment
    // timeout's cancels, an operator's intent write, a recovery's bump.
    (
        "deadlock_victim_apply",
        &[Scenario::ConsumerFaults, Scenario::Rebalancing],
        20,
    ),
    ("deadlock_victim_transfer", &[Scenario::Rebalancing], 20),
    (
        "deadlock_victim_cancel_unpaid",
        &[Scenario::Rebalancing, Scenario::Operator],
        20,
    ),
    ("deadlock_victim_set_intent", &[Scenario::Operator], 300),
    ("deadlock_victim_bump", &[Scenario::CompetingRecoveries], 100),
    // A failover to a replica further behind than the recovery's quiesce.
    (
        "failover_past_quiesce",
        &[Scenario::RedisLoss, Scenario::Chaos],
        100,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Safety,
    Liveness,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub config: SimConfig,
    /// The configured timings this seed drew.
    pub timings: Timings,
    pub checks: Checks,
    pub verdict: Verdict,
    pub violations: Vec<String>,
    /// Simulated time of the first violation.
    pub violated_at_ms: Option<u64>,
    pub faults: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    pub queued: u64,
    pub units_sold: u64,
    pub sim_ms: u64,
    /// The faults the nemesis injected.
    pub schedule: Vec<Scheduled>,
    /// The interesting states that happened, and how often (`Faults::cover`).
    pub coverage: BTreeMap<String, u64>,
    pub trace: Vec<String>,
}

/// What clients were told: the history S4 and L1 are checked against.
#[derive(Default)]
struct History {
    queued: Vec<String>,
    /// Whose each queued reservation is, and when its client heard "queued".
    queued_users: BTreeMap<String, UserId>,
    queued_at: BTreeMap<String, Duration>,
    /// When the request that got each "queued" answer was sent.
    queued_sent_at: BTreeMap<String, Duration>,
    confirmed: Vec<String>,
    outcomes: BTreeMap<String, u64>,
    /// Users with an answer that may hide a reservation: none at all, an error, or
    /// "unavailable" (a reserve or a release whose outcome the engine did not know).
    unsure: BTreeSet<UserId>,
}

/// The god view: reads the stores' state directly (not over the network), as the checker must.
struct GodView {
    cache: ScriptedStockCache<EmbeddedRedis>,
    redis: Arc<RedisModel>,
    ledger: EmbeddedLedger,
    plan: StockPlan,
}

impl GodView {
    async fn snapshot(&self) -> inv::Snapshot {
        self.read().await.0
    }

    /// The snapshot, with the raw view of Redis it was made of (both read at one instant).
    async fn read(&self) -> (inv::Snapshot, CacheView) {
        let db = self.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let raw = self.raw_redis();
        (audit::snapshot_of(&raw, &db, &self.plan), raw)
    }

    /// R1 at every look while Redis loses nothing, from a snapshot (`snap`, through the audit's
    /// mapping) and the raw view it was made of: in each bucket, Redis's stock, the open
    /// reservations the ledger lacks, the ledger's units sold, the cancelled units on their way
    /// back, and the transfers out less the transfers in add up to the bucket's initial stock.
    /// Every step of the protocol moves units within one store at a time, in an order that keeps
    /// this sum (the reconciler's own account, DESIGN R1), and both stores are read at one
    /// instant — so a step that loses or doubles a unit shows at once, before a backstop (the
    /// reconciler, a recovery's rebuild) or the final look could hide it.
    fn units_conserved(snap: &inv::Snapshot, raw: &CacheView) -> Vec<inv::Violation> {
        let open: std::collections::BTreeSet<&str> = snap
            .buckets
            .iter()
            .flat_map(|b| b.open.iter().map(|r| r.reservation.as_str()))
            .collect();
        let held: std::collections::BTreeSet<&str> = snap
            .orders
            .iter()
            .filter(|o| o.status.holds_stock())
            .map(|o| o.reservation.as_str())
            .collect();
        snap.buckets
            .iter()
            .zip(&raw.buckets)
            .filter_map(|(b, r)| {
                let released: std::collections::BTreeSet<String> =
                    r.cancelled_released.iter().map(|id| id.to_string()).collect();
                let unordered: u64 = b
                    .open
                    .iter()
                    .filter(|o| !held.contains(o.reservation.as_str()))
                    .map(|o| o.qty)
                    .sum();
                let orders = || snap.orders.iter().filter(|o| o.bucket == b.bucket);
                let sold: u64 = orders().filter(|o| o.status.holds_stock()).map(|o| o.qty).sum();
                let returning: u64 = orders()
                    .filter(|o| o.status == OrderStatus::Cancelled)
                    .filter(|o| !released.contains(&o.reservation) && !open.contains(o.reservation.as_str()))
                    .map(|o| o.qty)
                    .sum();
                let stock = b.redis_stock?;
                let sum = stock + (unordered + sold + returning + b.transfers_out) as i64 - b.transfers_in as i64;
                (sum != b.initial as i64).then(|| inv::Violation {
                    invariant: inv::Invariant::R1Reconciled,
                    bucket: Some(b.bucket),
                    detail: format!(
                        "redis {stock} + open unordered {unordered} + sold {sold} + cancelled on their way back \
                         {returning} + out {} - in {} = {sum}, initial {}",
                        b.transfers_out, b.transfers_in, b.initial
                    ),
                })
            })
            .collect()
    }

    /// S6 over the gates read raw, against the registry's generation at the same instant (both
    /// in-process: nothing runs between the two reads).
    async fn generation_fenced(&self) -> Vec<inv::Violation> {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::{gate_key, parse_gate};
        let Some(registered) = self.ledger.registry(ACTIVITY).await.expect("in-process") else {
            return Vec::new();
        };
        // A Redis back with an image older than the last recovery (a failover to a replica
        // further behind than that recovery took) holds the gates as they were before it closed
        // them, open at the generation it bumped away from. Until the detection sees the loss
        // (the meta's epoch is not the server's run id) and closes them, the API nodes refuse
        // their reservations by generation, and the ledger any that got through; S6 holds
        // again from the recovery that follows.
        let epoch = self.cache.epoch().await.expect("in-process");
        if self
            .cache
            .meta(ACTIVITY)
            .await
            .expect("in-process")
            .and_then(|m| m.epoch)
            != Some(epoch)
        {
            return Vec::new();
        }
        let gates: Vec<inv::GateState> = self.redis.read(|ks| {
            self.plan
                .all_buckets()
                .filter_map(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(s)) => {
                        let text = std::str::from_utf8(s).expect("the scripts write text");
                        let g = parse_gate(text)
                            .unwrap_or_else(|| panic!("bucket {b}: unreadable gate {text:?}"));
                        Some(inv::GateState {
                            bucket: b.0,
                            open: g.state == ActivityState::Open,
                            generation: g.generation,
                        })
                    }
                    _ => None,
                })
                .collect()
        });
        inv::s6_open_gates_current(&gates, registered.intent.generation)
    }

    /// Every bucket read raw from the Redis model's keyspace — keys and values as DESIGN §4
    /// writes them, not through the engine's `inspect.lua` (a checker that trusts the engine's
    /// own reader cannot catch that reader's bugs; and at the standard size the script's sorted
    /// copies of ten thousand buyers, forty times a simulated second, were most of a run's time).
    fn raw_redis(&self) -> CacheView {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::{
            buyers_key, decode_bucket, gate_key, resv_key, stock_key, xfer_key,
        };
        fn text(b: &[u8]) -> &str {
            std::str::from_utf8(b).expect("the scripts write text")
        }
        let buckets = self.redis.read(|ks| {
            self.plan
                .all_buckets()
                .map(|b| {
                    let get = |key: String| ks.get(key.as_bytes());
                    let stock = match get(stock_key(ACTIVITY, b)) {
                        Some(Value::Str(s)) => Some(text(s).parse().expect("stock is an integer")),
                        None => None,
                        Some(other) => panic!("bucket {b}: stock holds {other:?}"),
                    };
                    let buyers = match get(buyers_key(ACTIVITY, b)) {
                        Some(Value::Set(members)) => members.iter().map(|m| text(m)).collect(),
                        None => Vec::new(),
                        Some(other) => panic!("bucket {b}: buyers holds {other:?}"),
                    };
                    let hash = |key: String| match get(key) {
                        Some(Value::Hash(h)) => h.iter().map(|(k, v)| (text(k), text(v))).collect(),
                        None => Vec::new(),
                        Some(other) => panic!("bucket {b}: a hash holds {other:?}"),
                    };
                    let (resv, xfer) = (hash(resv_key(ACTIVITY, b)), hash(xfer_key(ACTIVITY, b)));
                    let gate = match get(gate_key(ACTIVITY, b)) {
                        Some(Value::Str(s)) => Some(text(s)),
                        None => None,
                        Some(other) => panic!("bucket {b}: gate holds {other:?}"),
                    };
                    decode_bucket(&self.plan, b, stock, buyers, resv, xfer, gate)
                        .unwrap_or_else(|e| panic!("the god view cannot read Redis: {e}"))
                })
                .collect()
        });
        CacheView { meta: None, buckets }
    }
}

struct Violated {
    at: Duration,
    violations: Vec<String>,
    verdict: Verdict,
}

struct World {
    cfg: SimConfig,
    timings: Timings,
    handle: Handle,
    faults: Arc<Faults>,
    redis: Arc<RedisStore>,
    kafka: Arc<KafkaLog>,
    god: GodView,
    history: Arc<Mutex<History>>,
    skews: Arc<Mutex<Vec<i64>>>,
    redis_node: NodeHandle,
    mysql_node: NodeHandle,
    kafka_node: NodeHandle,
    jobs_nodes: Vec<NodeHandle>,
    engines: Vec<NodeHandle>,
    consumers: Vec<NodeHandle>,
    /// The operator's console: the node its admin calls leave from.
    operator: NodeHandle,
    /// When pauses (or closes) returned, and their intents' versions.
    pauses: Mutex<Vec<(Duration, u64)>>,
    ledger_log: Arc<LedgerLog>,
    /// Faults that run beside the nemesis (pauses): stopped with the world.
    background: Mutex<Vec<madsim::task::JoinHandle<()>>>,
    /// The faults injected so far.
    schedule: Mutex<Vec<Scheduled>>,
    /// Recovery claims as the checker first saw them in the meta (at most `CHECK_EVERY` late).
    claims: Mutex<Vec<(Duration, String)>>,
    /// Each gate's version when the checker last looked, since the Redis restart it notes.
    gate_versions: Mutex<(Option<Duration>, BTreeMap<u32, u64>)>,
    violated: Mutex<Option<Violated>>,
    /// The wave of buyers aimed at a recovery runner's long stall (`aim_at_long_stalls`): its
    /// clients once it ran, and whether it is still waiting or running.
    stall_wave: Mutex<Vec<(NodeHandle, madsim::task::JoinHandle<()>)>>,
    stall_wave_pending: std::sync::atomic::AtomicBool,
    /// The API node `EnginePauseAcrossBump` holds paused (the heal leaves it so).
    zombie: Mutex<Option<madsim::task::NodeId>>,
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("fixed simulation ips parse")
}

fn activity(cfg: &SimConfig) -> Activity {
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
    })
    .expect("simulation activities are valid")
}

/// The users and their clicks, shuffled. A `skew` fraction of users have ids that route to a
/// bucket drawn from a Zipf distribution over the buckets (rank k with weight 1/k: a few very hot
/// buckets, a long tail); the rest are sequential ids. Each user clicks 1..=clicks_per_user times.
fn workload(cfg: &SimConfig) -> Vec<UserId> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread_rng().gen());
    let n = cfg.buckets;
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / k as f64).collect();
    let zipf = rand::distributions::WeightedIndex::new(&weights).expect("positive weights");
    let mut next_id = 1u64;
    let mut clicks = Vec::new();
    for _ in 0..cfg.users {
        let user = if rng.gen_bool(cfg.skew) {
            // A far id range per hot user, so the sequential ids below are never reused.
            let target = rng.sample(&zipf) as u32;
            let mut id = 1_000_000_000 + rng.gen_range(0..1_000_000_000u64);
            while BucketRouter::route(UserId(id), n).0 != target {
                id += 1;
            }
            UserId(id)
        } else {
            next_id += 1;
            UserId(next_id)
        };
        for _ in 0..rng.gen_range(1..=cfg.clicks_per_user) {
            clicks.push(user);
        }
    }
    rand::seq::SliceRandom::shuffle(clicks.as_mut_slice(), &mut rng);
    clicks
}

/// A wave of buyers: who clicks, over how long, from which client nodes.
struct Wave {
    name: &'static str,
    /// The clients' addresses are `{net}.1`, `{net}.2`, …
    net: &'static str,
    window_ms: u64,
    clicks: Vec<UserId>,
}

impl Wave {
    /// The sale: the seed's workload over the sale's length.
    fn first(cfg: &SimConfig) -> Self {
        Wave {
            name: "client",
            net: "10.0.3",
            window_ms: cfg.sale_ms,
            clicks: workload(cfg),
        }
    }

    /// Buyers while a recovery runner sleeps at a long fault point after another reopened the
    /// sale: a tenth as many new users (ids neither other wave draws), one click each, over half
    /// the sale's length.
    fn stall(cfg: &SimConfig) -> Self {
        Wave {
            name: "stall-client",
            net: "10.0.7",
            window_ms: cfg.sale_ms / 2,
            clicks: (0..cfg.users / 10).map(|i| UserId(3_500_000_000 + i)).collect(),
        }
    }

    /// Buyers after a recovery: a fifth as many new users (ids the workload never draws), one
    /// click each, over half the sale's length — and every user whose order failed, trying again
    /// (a stale order the ledger refused after the rebuild left its user unmarked in Redis: the
    /// reserve succeeds, the ledger refuses the second order, and its units must go back).
    fn late(cfg: &SimConfig, failed: impl IntoIterator<Item = UserId>) -> Self {
        let mut clicks: Vec<UserId> = (0..cfg.users / 5).map(|i| UserId(3_000_000_000 + i)).collect();
        clicks.extend(failed);
        Wave {
            name: "late-client",
            net: "10.0.6",
            window_ms: cfg.sale_ms / 2,
            clicks,
        }
    }
}

/// Run one seed in its own runtime. Panics (a crash of the world) propagate to the caller.
pub fn run(cfg: &SimConfig) -> RunReport {
    planted::plant(cfg.planted);
    let mut rt = madsim::runtime::Runtime::with_seed_and_config(cfg.seed, madsim::Config::default());
    rt.set_time_limit(Duration::from_secs(600));
    let cfg = cfg.clone();
    let report = rt.block_on(world(cfg));
    planted::plant(None);
    report
}

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

/// The world inside an existing simulation runtime.
pub async fn world(cfg: SimConfig) -> RunReport {
    // The engine's fault points stall where a paused process hurts most (between reserve and
    // publish, between a recovery's snapshot and its rebuild, between the ledger's commit and the
    // settles, between a transfer's take and give, between a release and its answer): always in
    // the scenarios about zombies, on every other seed of the others (a stream of the seed's
    // own, so a seed replays them), never in the calm one nor in the skewed one (whose L2 check
    // holds the rebalancer to selling the cold buckets' units while demand lasts), and never
    // without the jobs (what a stalled process leaves behind is the reconciler's to finish).
    let stalls = cfg.jobs
        && match cfg.scenario {
            Scenario::Calm | Scenario::Skewed => false,
            Scenario::CompetingRecoveries | Scenario::FullLossRestart => true,
            _ => rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x57a11).gen_bool(0.5),
        };
    // The long ones (far past a recovery's lease, once per run) on every other such seed: a
    // runner stalled that long leaves the recovery to another, whose later snapshot heals what
    // the stalled one would have got wrong (a stale order the ledger took shows in both).
    // Of the recovery's long fault points, the one before the bump (site 3, where a stale bump
    // comes from) and one other per run: with all of them armed, the first runner slept at the
    // first one it reached and its successor, as the heal disarmed them, at none — sites 0, 1
    // and 4 fired in none of 200 runs of four scenarios. Site 5 (between the claim and the
    // close) comes before site 3, so the first runner sleeps there; sites 0 (between the
    // snapshot and the rebuild), 1 (before the reopen) and 4 (before the finish) come after it,
    // so the successor of a runner asleep at site 3 sleeps there. The rebalancer's (site 2) is
    // armed beside them.
    let long = {
        let mut draw = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x10e6);
        let recovery_site = RECOVERY_LATE_SITES[draw.gen_range(0..RECOVERY_LATE_SITES.len())];
        match stalls && draw.gen_bool(0.5) {
            true => 1 << REBALANCE_SITE | 1 << BUMP_SITE | 1 << recovery_site,
            false => 0,
        }
    };
    planted::enable_stalls(stalls.then_some(cfg.seed ^ 0x57a11), long);
    let handle = Handle::current();
    let faults = Arc::new(Faults::new());
    if stalls {
        let sites: Vec<u32> = (0..64).filter(|s| long & 1 << s != 0).collect();
        faults.event(format!(
            "engine fault points (stalls): on, the long ones at sites {sites:?}"
        ));
    }
    let act = activity(&cfg);
    let plan = StockPlan::new(&act);
    let timings = Timings::draw(cfg.seed);
    let redis = Arc::new(RedisStore::new(Persistence::Aof, timings.aof_window()));
    let ledger = EmbeddedLedger::new();
    let kafka = Arc::new(KafkaLog::new(PARTITIONS));

    // Warmup, by the operator, before anything serves.
    let god = GodView {
        cache: ScriptedStockCache::new(EmbeddedRedis::from_model(redis.model.clone())),
        redis: redis.model.clone(),
        ledger: ledger.clone(),
        plan: plan.clone(),
    };
    god.ledger.install(&act, &plan).await.expect("install");
    god.cache
        .warmup(
            &plan,
            &seckill_engine::ports::Intent::FIRST,
            seckill_engine::ports::WarmFrom::Plan,
        )
        .await
        .expect("warmup");

    let node = |name: &str, addr: &str| handle.create_node().name(name).ip(ip(addr));
    let (s, f) = (redis.clone(), faults.clone());
    let redis_node = node("redis", "10.0.0.10")
        .init(move || serve_redis(s.clone(), f.clone()))
        .build();
    let ledger_log = Arc::new(LedgerLog::default());
    let (l, f, g) = (ledger.clone(), faults.clone(), ledger_log.clone());
    let mysql_node = node("mysql", "10.0.0.20")
        .init(move || serve_ledger(l.clone(), f.clone(), g.clone()))
        .build();
    let (k, f) = (kafka.clone(), faults.clone());
    let kafka_node = node("kafka", "10.0.0.30")
        .init(move || serve_kafka(k.clone(), f.clone()))
        .build();

    // Several job runners race over the same activity, as in production (DESIGN §11).
    let jobs_nodes = (0..JOBS_NODES)
        .map(|i| {
            let addr: SocketAddr = format!("10.0.4.{}:9100", i + 1).parse().expect("jobs address");
            let jobs_node = node(&format!("jobs-{i}"), &addr.ip().to_string());
            if !cfg.jobs {
                return jobs_node.build();
            }
            let f = faults.clone();
            jobs_node
                .init(move || crate::nodes::jobs_main(addr, i, timings, f.clone()))
                .build()
        })
        .collect();
    let skews = Arc::new(Mutex::new(vec![0i64; cfg.engines]));
    let engines = (0..cfg.engines)
        .map(|i| {
            let (act, skews, f) = (act.clone(), skews.clone(), faults.clone());
            let addr = engine_addr(i);
            node(&format!("engine-{i}"), &addr.ip().to_string())
                .init(move || {
                    let skew = skews.lock().expect("skews")[i];
                    engine_main(EngineParams {
                        addr,
                        activity: act.clone(),
                        wall_ms: f.wall_ms(skew),
                        timings,
                        faults: f.clone(),
                    })
                })
                .build()
        })
        .collect();
    let consumers = (0..cfg.consumers)
        .map(|i| {
            let addr: SocketAddr = format!("10.0.2.{}:9000", i + 1)
                .parse()
                .expect("consumer address");
            let (f, batch) = (faults.clone(), cfg.consumer_batch);
            node(&format!("consumer-{i}"), &addr.ip().to_string())
                .init(move || consumer_main(addr, i as u32, batch, f.clone()))
                .build()
        })
        .collect();

    let w = Arc::new(World {
        cfg: cfg.clone(),
        timings,
        handle: handle.clone(),
        faults: faults.clone(),
        redis,
        kafka,
        god,
        history: Arc::default(),
        skews,
        redis_node,
        mysql_node,
        kafka_node,
        jobs_nodes,
        engines,
        consumers,
        operator: node("operator", "10.0.5.1").build(),
        pauses: Mutex::default(),
        ledger_log,
        background: Mutex::default(),
        schedule: Mutex::default(),
        claims: Mutex::default(),
        gate_versions: Mutex::default(),
        violated: Mutex::new(None),
        stall_wave: Mutex::default(),
        stall_wave_pending: Default::default(),
        zombie: Mutex::default(),
    });
    faults.event(format!(
        "world up: {} engines, {} consumers, {} clients",
        cfg.engines, cfg.consumers, cfg.clients
    ));

    // Sale under faults, watched continuously.
    let mut clients = w.spawn_clients(&Wave::first(&cfg));
    let nemesis = tokio::spawn(w.clone().nemesis());
    let checker = tokio::spawn(w.clone().check_continuously());
    w.aim_at_long_stalls();
    w.wait_for(&mut clients).await;
    // The nemesis goes on a while past the last click (DESIGN §9 v2: faults through recovery and
    // settle): the world must settle from whatever the last faults leave, not from a quiet end.
    if !w.violated() {
        let overtime = Duration::from_millis(thread_rng().gen_range(0..1_500));
        w.faults.event(format!(
            "nemesis goes on {} ms past the sale",
            overtime.as_millis()
        ));
        tokio::time::sleep(overtime).await;
    }
    nemesis.abort();
    w.heal().await;
    let mut drained = if w.violated() { true } else { w.settle().await };
    // The buyers aimed at a stalled runner's window may still be clicking once it woke.
    while w.stall_wave_pending.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stall_wave = std::mem::take(&mut *w.stall_wave.lock().expect("stall wave"));
    if !stall_wave.is_empty() && drained && !w.violated() {
        drained = w.settle().await;
    }
    clients.extend(stall_wave);
    // A second wave of buyers once a recovery is behind the sale (settled: the activity open on
    // the recovery's epoch), for the units the payment timeout gave back: selling under a
    // generation a recovery bumped is otherwise never tried, the recoveries of a run finishing
    // after its clients stopped.
    if drained && !w.violated() && !w.ledger_log.bumps.lock().expect("ledger log").is_empty() {
        w.faults.event("late wave: buyers after the recovery".into());
        let db = w.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let failed = (db.orders.iter())
            .filter(|o| o.status == seckill_engine::ports::OrderStatus::Failed)
            .map(|o| o.reservation.user);
        let mut late = w.spawn_clients(&Wave::late(&cfg, failed));
        w.wait_for(&mut late).await;
        clients.extend(late);
        if !w.violated() {
            drained = w.settle().await;
        }
    }
    checker.abort();
    w.final_checks(drained).await;
    let report = w.report().await;
    w.tear_down(clients.iter().map(|(node, _)| node.id())).await;
    planted::enable_stalls(None, 0);
    report
}

impl World {
    /// A rebalancer stalled long between its take and its ledger step (the long fault point at
    /// site 2): where the scenario restarts Redis, Redis restarts under it, so that a recovery
    /// rebuilds the buckets — the take undone, if Redis lost it or not — before it wakes up and
    /// goes on with a transfer of the old generation. A recovery runner stalled long (any other
    /// site): once another runner has recovered and reopened the sale while it sleeps, a wave of
    /// new buyers sells there, so that what the sleeper writes when it wakes (a bump, a rebuild
    /// from its old snapshot, a reopen, a finish) meets buckets that sold since — the sales the
    /// fences exist for. Without it the sale was over before any successor reopened.
    fn aim_at_long_stalls(self: &Arc<Self>) {
        let (wave_tx, mut wave_rx) = tokio::sync::mpsc::unbounded_channel();
        let w = self.clone();
        tokio::spawn(async move {
            // One wave per run: a second runner asleep (the successor of the first) gets none.
            let mut waved = false;
            while wave_rx.recv().await.is_some() {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while !waved && planted::stalled() > 0 && tokio::time::Instant::now() < deadline {
                    if w.healthy() {
                        w.faults
                            .event("aimed: buyers while a recovery runner sleeps past its lease".into());
                        let mut clients = w.spawn_clients(&Wave::stall(&w.cfg));
                        w.wait_for(&mut clients).await;
                        *w.stall_wave.lock().expect("stall wave") = clients;
                        waved = true;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                w.stall_wave_pending
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
        });

        let restarts: Vec<Fault> = (self.cfg.scenario.faults().iter().copied())
            .filter(|f| {
                matches!(
                    f,
                    Fault::RedisRestartVolatile | Fault::RedisRestartAof | Fault::RedisFailover
                )
            })
            .collect();
        // The stall fires inside the jobs node (whose crash would take a task spawned there
        // with it): the world's own task injects.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let f = self.faults.clone();
        let pending = self.clone();
        planted::on_long_stall(move |site| {
            f.fired(&format!("long_stall_{site}"));
            if site == REBALANCE_SITE {
                let _ = tx.send(());
            } else if !pending
                .stall_wave_pending
                .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let _ = wave_tx.send(());
            }
        });
        if restarts.is_empty() {
            return;
        }
        let w = self.clone();
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..500))).await;
                w.faults
                    .event("aimed: Redis restarts under a rebalancer stalled after its take".into());
                let fault = restarts[thread_rng().gen_range(0..restarts.len())];
                w.inject(fault, Duration::ZERO).await;
            }
        });
    }

    fn violated(&self) -> bool {
        self.violated.lock().expect("violated").is_some()
    }

    fn record(&self, violations: Vec<inv::Violation>, verdict: Verdict) {
        if violations.is_empty() {
            return;
        }
        let mut v = self.violated.lock().expect("violated");
        if v.is_none() {
            for x in &violations {
                self.faults.event(format!("VIOLATION {x}"));
            }
            *v = Some(Violated {
                at: self.faults.elapsed(),
                violations: violations.iter().map(|x| x.to_string()).collect(),
                verdict,
            });
        }
    }

    fn safety(&self, snap: &inv::Snapshot) -> Vec<inv::Violation> {
        let mut v = inv::check_safety(snap);
        let confirmed = self.history.lock().expect("history").confirmed.clone();
        v.extend(inv::s4_confirmed_kept(snap, &confirmed));
        if self.cfg.scenario.checks(self.cfg.jobs).s2_redis {
            v.extend(inv::s2_redis_one_reservation_per_user(snap));
            v.extend(inv::s2_redis_fallback_winners_marked(snap));
            v.extend(inv::r1_no_failed_orders(snap));
        }
        v
    }

    async fn check_continuously(self: Arc<Self>) {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let (snap, raw) = self.god.read().await;
            self.record(self.safety(&snap), Verdict::Safety);
            if self.cfg.scenario.checks(self.cfg.jobs).s2_redis || self.recovered_since_loss() {
                self.record(GodView::units_conserved(&snap, &raw), Verdict::Safety);
            }
            self.record(self.god.generation_fenced().await, Verdict::Safety);
            self.record(self.transfers_acked(), Verdict::Safety);
            self.record(self.gates_move_forward(), Verdict::Safety);
            self.record(self.stale_orders_refused(), Verdict::Safety);
            self.record(self.commits_after_apply(), Verdict::Safety);
            self.watch_claims();
        }
    }

    /// A transfer a rebalancer reported complete is acked in its source bucket (read raw), unless
    /// Redis restarted since its pass began (the restart may have lost the ack; the recovery
    /// rebuilds the marks from the ledger's journal). The reconciler finishes a transfer left
    /// unacked, so only a look at once tells a rebalancer that skips its ack.
    fn transfers_acked(&self) -> Vec<inv::Violation> {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::xfer_key;
        let done = self.faults.take_transfers_done();
        let restarted = *self.redis.restarted_at.lock().expect("restarted");
        done.into_iter()
            .filter(|t| restarted.is_none_or(|r| r < t.since))
            .filter(|t| {
                let key = xfer_key(ACTIVITY, BucketNo(t.from));
                let field = format!("ack:{}", t.id);
                !self.redis.model.read(|ks| match ks.get(key.as_bytes()) {
                    Some(Value::Hash(h)) => h.contains_key(field.as_bytes()),
                    _ => false,
                })
            })
            .map(|t| inv::Violation {
                invariant: inv::Invariant::R1Reconciled,
                bucket: Some(t.from),
                detail: format!(
                    "transfer {} reported complete by its rebalancer but not acked in Redis",
                    t.id
                ),
            })
            .collect()
    }

    /// S5's ground: a gate's intent version never goes back while Redis lives (read raw). The
    /// gates enforce the operator's latest intent only because an older write — a call that was
    /// overtaken, a recovery's reopen with the intent it read before a pause — never overrides a
    /// newer one; a version going back is a newer intent undone (a pause lifted, a resume lost).
    /// A restart may bring back an older gate (its write was past the AOF window): the recovery
    /// reopens it to the registry's intent, and the look starts over.
    fn gates_move_forward(&self) -> Vec<inv::Violation> {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::gate_key;
        let restarted = *self.redis.restarted_at.lock().expect("restarted");
        let now: BTreeMap<u32, u64> = self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .filter_map(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(v)) => String::from_utf8_lossy(v)
                        .split('|')
                        .nth(2)
                        .and_then(|v| v.parse().ok())
                        .map(|v| (b.0, v)),
                    _ => None,
                })
                .collect()
        });
        let mut seen = self.gate_versions.lock().expect("gate versions");
        if seen.0 != restarted {
            *seen = (restarted, BTreeMap::new());
        }
        let mut out = Vec::new();
        for (b, v) in now {
            if let Some(before) = seen.1.insert(b, v).filter(|before| *before > v) {
                out.push(inv::Violation {
                    invariant: inv::Invariant::S5PauseHolds,
                    bucket: Some(b),
                    detail: format!(
                        "the gate's intent went from version {before} back to {v}: an older intent \
                         overrode a newer one"
                    ),
                });
            }
        }
        out
    }

    /// A recovery runs for a cause: a claim Redis granted while it held the whole activity (and
    /// took over no other claim) finds nothing to do when it looks again under its claim, and
    /// finishes without bumping the generation (or closing a gate) — unless Redis lost something
    /// after it claimed. Two runners that waited on each other's claims would otherwise recover
    /// in turn, each closing the sale again for nothing, and report a cause that no longer held.
    fn recoveries_have_a_cause(&self) -> Vec<inv::Violation> {
        let claims = self.redis.claims.lock().expect("claims").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        let lost_after = |at: Duration| self.redis.last_loss().is_some_and(|loss| loss >= at);
        bumps
            .iter()
            .filter_map(|bump| {
                let holder = claims.iter().rev().find(|c| c.at <= *bump)?;
                (holder.on_whole && !lost_after(holder.at)).then(|| inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "claim {} was granted at {:?} on a Redis holding the whole activity (no \
                         other claim, the epoch this run's, every key there), and the generation \
                         was bumped at {bump:?} under it: a recovery with nothing to recover",
                        holder.fence, holder.at
                    ),
                })
            })
            .collect()
    }

    /// A recovery's finish is answered true: "finished" only to the runner whose own finish
    /// ended its claim (this one, or its first run when a re-sent finish meets it again), and
    /// "lost" only where it did not, or where another claim or a loss of Redis came since. A
    /// runner told "finished" reports a recovery done — to the operator who asked for it, too
    /// — while a successor holds the claim; one told "lost" reports a recovery that finished
    /// as taken over.
    fn finishes_answer_true(&self) -> Vec<inv::Violation> {
        let finishes = self.redis.finishes.lock().expect("finishes").clone();
        let claims = self.redis.claims.lock().expect("claims").clone();
        let last_loss = self.redis.last_loss();
        let mut out = Vec::new();
        for (i, e) in finishes.iter().enumerate() {
            let own =
                |f: &crate::stores::FinishSeen| f.fence == e.fence && f.held.as_deref() == Some(&*f.fence);
            let ended = finishes[..=i].iter().rev().find(|f| own(f)).map(|f| f.at);
            if !e.finished && e.held.is_some() {
                self.faults.cover("finish_after_takeover_lost");
            }
            let lie = match (e.finished, ended) {
                (true, None) => Some("finished, though no finish of its own ended its claim"),
                (false, Some(at)) => {
                    let moved_on = claims.iter().any(|c| c.at >= at && c.at <= e.at)
                        || last_loss.is_some_and(|l| l >= at);
                    (!moved_on)
                        .then_some("lost, though its own finish had ended its claim and nothing came since")
                }
                _ => None,
            };
            if let Some(lie) = lie {
                out.push(inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "Redis answered claim {}'s finish at {:?} (holding {:?}): {lie}",
                        e.fence, e.at, e.held
                    ),
                });
            }
        }
        out
    }

    /// S6 at the close: a recovery closes a gate only at its own generation or a newer one — a
    /// runner whose claim read the registry before another recovery bumped it and reopened the
    /// gate (it slept between its claim and its close) must not halt the sale again, and would
    /// fence the gate with a claim a successor has already taken over.
    fn closes_not_stale(&self) -> Vec<inv::Violation> {
        (self.redis.stale_closes.lock().expect("stale closes").iter())
            .map(|(at, fence, gate)| inv::Violation {
                invariant: inv::Invariant::S6GenerationFenced,
                bucket: None,
                detail: format!("at {at:?} claim {fence} closed gate {gate}, reopened at a newer generation than the claim's"),
            })
            .collect()
    }

    /// DESIGN §5 on the bus: the worker group commits an offset only after a ledger transaction
    /// that carried its record committed (or after the record went to the dead letters). A
    /// record committed unapplied is skipped for good: no worker reads it again, and only the
    /// reconciler's republish of a reservation left open would resolve its buyer's "queued" —
    /// the look at each commit sees what that slower path hides.
    fn commits_after_apply(&self) -> Vec<inv::Violation> {
        let commits = std::mem::take(&mut *self.kafka.commits.lock().expect("kafka"));
        let applied = self.ledger_log.applied.lock().expect("ledger log");
        let mut out = Vec::new();
        for (at, partition, offsets) in commits {
            for offset in offsets {
                let unapplied = match self.kafka.record(partition, offset) {
                    Some((_, true)) => None,
                    Some((payload, false)) => match Reservation::decode(&payload) {
                        Ok(r) => applied
                            .get(&r.id)
                            .is_none_or(|when| *when > at)
                            .then(|| format!("reservation {}", r.id)),
                        Err(e) => Some(format!("a record that does not decode ({e}), not dead-lettered")),
                    },
                    None => Some("a record past the partition's end".to_string()),
                };
                if let Some(what) = unapplied {
                    out.push(inv::Violation {
                        invariant: inv::Invariant::L1QueuedResolved,
                        bucket: None,
                        detail: format!(
                            "the workers committed partition {partition} offset {offset} ({what}) at {at:?}, \
                             before any ledger transaction carried it"
                        ),
                    });
                }
            }
        }
        out
    }

    /// S6 at the ledger: no order is created from a reservation of an older generation than the
    /// registry's (the ledger's front compares each batch with the registry as it arrives). A
    /// recovery's later snapshot takes such an order in, so the stores may agree again after;
    /// only the look at the apply sees it.
    fn stale_orders_refused(&self) -> Vec<inv::Violation> {
        let taken = std::mem::take(&mut *self.ledger_log.accepted_stale.lock().expect("ledger log"));
        taken
            .into_iter()
            .map(|(id, generation, current)| inv::Violation {
                invariant: inv::Invariant::S6GenerationFenced,
                bucket: None,
                detail: format!(
                    "the ledger created order {id}, reserved under generation {generation}, while the registry was at {current}"
                ),
            })
            .collect()
    }

    /// The recovery claim the meta holds now (read raw).
    fn raw_claim(&self) -> Option<String> {
        crate::stores::meta_claim(
            &self.redis.model,
            &seckill_engine::adapters::script::meta_key(ACTIVITY),
        )
    }

    /// Every bucket has a stock key (read raw).
    /// Redis holds the whole activity and no recovery is under way (read raw): the meta with
    /// its epoch and no claim, every stock key, every gate and none of them recovering.
    fn healthy(&self) -> bool {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::{gate_key, meta_key};
        let meta_ok = self
            .redis
            .model
            .read(|ks| match ks.get(meta_key(ACTIVITY).as_bytes()) {
                Some(Value::Hash(h)) => {
                    h.contains_key(b"epoch".as_slice()) && !h.contains_key(b"claim".as_slice())
                }
                _ => false,
            });
        let gates_ok = self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .all(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(g)) => !g.starts_with(b"recovering"),
                    _ => false,
                })
        });
        meta_ok && gates_ok && self.stock_keys_present()
    }

    fn stock_keys_present(&self) -> bool {
        use seckill_engine::adapters::script::stock_key;
        self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .all(|b| ks.get(stock_key(ACTIVITY, b).as_bytes()).is_some())
        })
    }

    /// Redis holds the ledger's image again since its last loss (a restart or a deleted key):
    /// a recovery claimed after the loss (the checker saw its claim appear) and finished, and
    /// the activity is healthy (read raw). From then on until the next loss every step keeps
    /// the units, as where Redis loses nothing. A claim the checker did not see, or one that
    /// outlived a loss, waits for the next one: the look is skipped, never misjudged.
    fn recovered_since_loss(&self) -> bool {
        let Some(loss) = self.redis.last_loss() else {
            return true;
        };
        let claimed_after = self
            .claims
            .lock()
            .expect("claims")
            .last()
            .is_some_and(|(at, _)| *at > loss);
        claimed_after && self.healthy()
    }

    /// Note a recovery claim the first time the meta shows it.
    fn watch_claims(&self) {
        let Some(claim) = self.raw_claim() else { return };
        let mut claims = self.claims.lock().expect("claims");
        if claims.last().is_none_or(|(_, c)| *c != claim) {
            claims.push((self.faults.elapsed(), claim));
        }
    }

    /// L1 for orders the ledger refused for an older generation: only a zombie's — a publish
    /// acknowledged after the recovery that bumped the generation claimed the activity (before
    /// the claim, the recovery waits the publish out and drains it). A client told "queued"
    /// before that claim whose order was refused lost its unit to a recovery that did not wait.
    /// And a request sent after the last bump before the refusal was reserved under the current
    /// generation (the gates stay closed from the claim until a reopen writes it: S6), so its
    /// refusal means it was stamped with another generation than its gate's.
    ///
    /// Excused: a record a slow follower held back past the recovery's drain whose reservation
    /// Redis lost before the rescue could see it — a data loss of both stores, as a record lost
    /// after its ack with its reservation is. One Redis still held is rescued into the ledger, and
    /// its late record is a redelivery.
    fn l1_no_early_stale_orders(&self) -> Vec<inv::Violation> {
        let stale = self.ledger_log.stale.lock().expect("ledger log").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        let claims = self.claims.lock().expect("claims").clone();
        let visible_late = self.kafka.visible_late.lock().expect("kafka").clone();
        let lost = self.redis.lost_outbox.lock().expect("lost outbox").clone();
        let lost_on_bus = self.kafka.lost_after_ack.lock().expect("kafka").clone();
        let history = self.history.lock().expect("history");
        let mut out = Vec::new();
        for (refused_at, rid) in stale {
            let Some(queued_at) = history.queued_at.get(&rid.to_string()).copied() else {
                continue; // nobody was told "queued" for it
            };
            // Redis lost its outbox entry, and its record reached the ledger only after the
            // drain (visible late) or not at all (lost after its ack, leaving a rescue's apply
            // the network held back as its one copy): nothing was left for the recovery to
            // wait for.
            let id = rid.to_string();
            if lost.contains_key(&id) && (visible_late.contains_key(&id) || lost_on_bus.contains(&id)) {
                continue;
            }
            let Some(bump) = bumps.iter().rev().find(|b| **b <= refused_at) else {
                continue;
            };
            if let Some(sent) = history.queued_sent_at.get(&rid.to_string()).filter(|s| *s > bump) {
                out.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "reservation {rid} was requested at {} ms, after the generation bump at {} ms, \
                         yet refused for its generation at {} ms: it was stamped with an older one",
                        sent.as_millis(),
                        bump.as_millis(),
                        refused_at.as_millis()
                    ),
                });
                continue;
            }
            let Some((claimed, fence)) = claims.iter().rev().find(|(c, _)| c <= bump) else {
                continue;
            };
            if queued_at + CHECK_EVERY < *claimed {
                out.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "reservation {rid} was queued at {} ms, before claim {fence} (seen at {} ms), \
                         yet refused for its generation at {} ms: the recovery did not wait for it",
                        queued_at.as_millis(),
                        claimed.as_millis(),
                        refused_at.as_millis()
                    ),
                });
            }
        }
        out
    }

    fn spawn_clients(self: &Arc<Self>, wave: &Wave) -> Vec<(NodeHandle, madsim::task::JoinHandle<()>)> {
        let n = self.cfg.clients;
        self.faults.clients_start(n);
        (0..n)
            .map(|c| {
                let mine: Vec<UserId> = wave.clicks.iter().skip(c).step_by(n).copied().collect();
                let addr: SocketAddr = format!("{}.{}:7000", wave.net, c + 1)
                    .parse()
                    .expect("client address");
                let node = self
                    .handle
                    .create_node()
                    .name(format!("{}-{c}", wave.name))
                    .ip(addr.ip())
                    .build();
                let (w, window_ms, name) = (self.clone(), wave.window_ms, format!("{}-{c}", wave.name));
                let task = node.spawn(async move { w.client(name, addr, window_ms, mine).await });
                (node, task)
            })
            .collect()
    }

    /// Wait for a wave's clients (not past a violation: the run stops there).
    async fn wait_for(&self, clients: &mut [(NodeHandle, madsim::task::JoinHandle<()>)]) {
        for (_, c) in clients {
            let _ = c.await;
            if self.violated() {
                break;
            }
        }
    }

    /// One client node: each of its clicks is a user acting at a random moment of the wave's
    /// window, concurrently with the others, against a random engine; a queued order is checked
    /// on (and mostly paid) a little later.
    async fn client(self: Arc<Self>, name: String, addr: SocketAddr, window_ms: u64, clicks: Vec<UserId>) {
        let ep = Arc::new(Endpoint::bind(addr).await.expect("bind client"));
        let start = tokio::time::Instant::now();
        let users: Vec<_> = clicks
            .into_iter()
            .map(|user| {
                // A third of the clicks come in the opening burst, the rest spread over the wave.
                let window = if thread_rng().gen_bool(0.3) {
                    window_ms / 10
                } else {
                    window_ms
                };
                let at = start + Duration::from_millis(thread_rng().gen_range(0..window.max(1)));
                let engine = engine_addr(thread_rng().gen_range(0..self.cfg.engines));
                let (w, ep) = (self.clone(), ep.clone());
                madsim::task::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    if !w.violated() {
                        w.click(&ep, engine, user).await;
                    }
                })
            })
            .collect();
        for u in users {
            let _ = u.await;
        }
        self.faults.client_done();
        self.faults.event(format!("{name} done"));
    }

    /// One purchase request, held to S5: queued although sent after a pause returned and
    /// answered before the registry held a newer resume is a violation.
    async fn purchase(
        &self,
        ep: &Endpoint,
        engine: SocketAddr,
        user: UserId,
    ) -> std::io::Result<Result<PurchaseOutcome, String>> {
        let sent = self.faults.elapsed();
        let answer = ep
            .call_timeout(engine, rpc::Purchase { user }, Duration::from_secs(1))
            .await;
        if !matches!(
            answer,
            Ok(Ok(PurchaseOutcome::Queued(_)
                | PurchaseOutcome::Duplicate
                | PurchaseOutcome::SoldOut
                | PurchaseOutcome::NotStarted
                | PurchaseOutcome::Ended))
        ) {
            self.history.lock().expect("history").unsure.insert(user);
        }
        if let Ok(Ok(PurchaseOutcome::Queued(r))) = &answer {
            // A pause is lifted once the registry holds a newer open intent (a resume's
            // registry write precedes its gates'): ground truth, whatever order concurrent
            // operator calls returned in.
            let got = self.faults.elapsed();
            let opens = self.ledger_log.opens.lock().expect("ledger log").clone();
            let held = self
                .pauses
                .lock()
                .expect("pauses")
                .iter()
                .copied()
                .find(|(paused, version)| {
                    *paused <= sent && !opens.iter().any(|(at, open)| open > version && *at <= got)
                });
            if let Some((paused, version)) = held {
                self.record(
                    vec![inv::Violation {
                        invariant: inv::Invariant::S5PauseHolds,
                        bucket: Some(r.bucket.0),
                        detail: format!(
                            "user {user} was queued ({}) for a request sent at {} ms, after the pause \
                             (version {version}) that returned at {} ms and before any resume",
                            r.id,
                            sent.as_millis(),
                            paused.as_millis()
                        ),
                    }],
                    Verdict::Safety,
                );
            }
            let mut h = self.history.lock().expect("history");
            h.queued_sent_at.insert(r.id.to_string(), sent);
        }
        answer
    }

    async fn click(&self, ep: &Endpoint, engine: SocketAddr, user: UserId) {
        let mut answer = self.purchase(ep, engine, user).await;
        // A persistent buyer tries again while the sale lasts (bounded: a few tries).
        for _ in 0..self.cfg.retries_when_sold_out {
            if !matches!(
                answer,
                Ok(Ok(PurchaseOutcome::SoldOut | PurchaseOutcome::Unavailable { .. })) | Err(_)
            ) || self.faults.elapsed().as_millis() as u64 > self.cfg.sale_ms + 1_000
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(100..300))).await;
            answer = self.purchase(ep, engine, user).await;
        }
        let label = match &answer {
            Ok(Ok(o)) => o.label(),
            Ok(Err(_)) => "refused",
            Err(_) => "no_answer",
        };
        *self
            .history
            .lock()
            .expect("history")
            .outcomes
            .entry(label.into())
            .or_insert(0) += 1;
        if let Ok(Ok(PurchaseOutcome::Unavailable { reason })) = &answer {
            self.faults.event(format!("user {user}: unavailable: {reason}"));
        }
        if let Ok(Ok(PurchaseOutcome::Queued(r))) = answer {
            {
                let mut h = self.history.lock().expect("history");
                h.queued.push(r.id.to_string());
                h.queued_users.insert(r.id.to_string(), r.user);
                h.queued_at.insert(r.id.to_string(), self.faults.elapsed());
            }
            self.follow_up(ep, engine, r.user, Some(r.id)).await;
        } else if let Ok(Ok(PurchaseOutcome::Duplicate)) = answer {
            // "You already have one": the user looks at the order page (and pays).
            self.follow_up(ep, engine, user, None).await;
        }
    }

    /// S7 for an order page just shown to `user`: the order it names is the user's in the
    /// ledger, in the state shown or one the ledger can have moved on to since (orders are never
    /// deleted and their states only move forward, so reading the ledger after the answer is
    /// sound); a page that names no order shows "queued" or "none".
    async fn status_true(&self, user: UserId, v: &seckill_engine::service::StatusView) {
        // A live order stays live (created, paid, cancelled), so a page showing one must name
        // the user's live order now. A failed order frees its user, who may hold a live one
        // since: a page showing "failed" must name a failed order of this user.
        let held = match (v.state, v.reservation) {
            (OrderState::Failed, Some(id)) => self
                .god
                .ledger
                .order(id)
                .await
                .expect("in-process")
                .filter(|o| o.reservation.user == user),
            _ => self
                .god
                .ledger
                .order_of(ACTIVITY, user)
                .await
                .expect("in-process"),
        };
        let shown = |s: OrderState| format!("{s:?}").to_lowercase();
        let wrong = match (v.state, v.reservation, &held) {
            (OrderState::Queued | OrderState::None, None, _) => None,
            (_, None, _) | (OrderState::Queued | OrderState::None, Some(_), _) => {
                Some(format!("{} with reservation {:?}", shown(v.state), v.reservation))
            }
            (_, Some(id), None) => Some(format!(
                "{} for reservation {id}, and the ledger holds no order of this user",
                shown(v.state)
            )),
            (said, Some(id), Some(o)) => {
                let now = o.status;
                let reachable = match said {
                    OrderState::Created => {
                        matches!(
                            now,
                            OrderStatus::Created | OrderStatus::Paid | OrderStatus::Cancelled
                        )
                    }
                    OrderState::Paid => now == OrderStatus::Paid,
                    OrderState::Cancelled => now == OrderStatus::Cancelled,
                    OrderState::Failed => now == OrderStatus::Failed,
                    OrderState::Queued | OrderState::None => unreachable!("matched above"),
                };
                (o.reservation.id != id || !reachable).then(|| {
                    format!(
                        "{} for reservation {id}; the ledger's order of this user is {} ({now:?})",
                        shown(said),
                        o.reservation.id
                    )
                })
            }
        };
        if let Some(what) = wrong {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!("user {user}'s order page showed {what}"),
                }],
                Verdict::Safety,
            );
        }
    }

    /// S7 for the page of a user told "queued" for `expect`: an older failed order is not the
    /// answer while `expect` is on its way (DESIGN §6: a failed order frees its user, and the
    /// newer reservation is shown before it — "your order failed" would send the buyer away
    /// from a unit that is theirs). Read raw when the page arrives: `expect` still open in the
    /// outbox, the user marked, no other open reservation of the user and no live order in the
    /// ledger. Then the mark was there when the page was made, unless Redis restarted or lost a
    /// key since it was asked for: a mark comes only with a reserve (its entry open until a
    /// settle, whose order is live, or a release, which takes the mark too) or with a rebuild
    /// (which marks live buyers, and deletes an open entry the ledger lacks).
    async fn queued_before_failed(
        &self,
        user: UserId,
        expect: seckill_engine::domain::ReservationId,
        v: &seckill_engine::service::StatusView,
        sent: Duration,
    ) {
        use seckill_engine::adapters::embedded::Value;
        use seckill_engine::adapters::script::{buyers_key, resv_key};
        if v.state != OrderState::Failed || v.reservation == Some(expect) {
            return;
        }
        let lost = self.redis.last_loss();
        if lost.is_some_and(|at| at >= sent) {
            return;
        }
        let (rid, own) = (expect.to_string(), self.god.plan.route(user));
        let mine = format!("{user}|");
        let (open, others, marked) = self.redis.model.read(|ks| {
            let (mut open, mut others) = (false, false);
            for b in [own, self.god.plan.fallback_bucket()] {
                if let Some(Value::Hash(h)) = ks.get(resv_key(ACTIVITY, b).as_bytes()) {
                    open |= h.contains_key(rid.as_bytes());
                    others |= h
                        .iter()
                        .any(|(k, v)| k.as_slice() != rid.as_bytes() && v.starts_with(mine.as_bytes()));
                }
            }
            let marked = matches!(ks.get(buyers_key(ACTIVITY, own).as_bytes()),
                Some(Value::Set(s)) if s.contains(user.to_string().as_bytes()));
            (open, others, marked)
        });
        if !(open && marked) || others {
            return;
        }
        let live = self
            .god
            .ledger
            .order_of(ACTIVITY, user)
            .await
            .expect("in-process")
            .is_some_and(|o| o.status != OrderStatus::Failed);
        if !live {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "user {user}'s order page (asked at {sent:?}; Redis last lost data at \
                         {lost:?}) showed failed order {} while reservation {expect}, told \
                         queued, was open in Redis and its user marked",
                        v.reservation.map_or("?".to_string(), |r| r.to_string())
                    ),
                }],
                Verdict::Safety,
            );
        }
    }

    /// The user checks the order page until the order shows, then (mostly) pays. With `expect`,
    /// only that reservation counts as this user's order.
    async fn follow_up(
        &self,
        ep: &Endpoint,
        engine: SocketAddr,
        user: UserId,
        expect: Option<seckill_engine::domain::ReservationId>,
    ) {
        // The user checks the order page a few times until the order shows up.
        let mut view = None;
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(100..400))).await;
            let sent = self.faults.elapsed();
            let status = ep
                .call_timeout(engine, rpc::Status { user }, Duration::from_secs(1))
                .await;
            if let Ok(Ok(v)) = status {
                self.status_true(user, &v).await;
                if let Some(expect) = expect {
                    self.queued_before_failed(user, expect, &v, sent).await;
                }
                if v.state != OrderState::Queued {
                    view = Some(v);
                    break;
                }
            }
        }
        // Confirmed only if the ledger's order of this user IS this reservation (after a Redis
        // loss the user may hold an order from another one).
        let Some(view) = view else { return };
        let Some(id) = view.reservation else { return };
        if !matches!(view.state, OrderState::Created | OrderState::Paid) || expect.is_some_and(|e| e != id) {
            return;
        }
        let rid = id.to_string();
        // Some users never pay (DESIGN §9 workload).
        let paid = thread_rng().gen_bool(self.cfg.pay_ratio)
            && matches!(
                ep.call_timeout(engine, rpc::PayOrder { id }, Duration::from_secs(1))
                    .await,
                Ok(Ok(PayOutcome::Paid))
            );
        self.faults.event(format!(
            "user {} told {}",
            user,
            if paid { "paid" } else { "created" }
        ));
        self.history.lock().expect("history").confirmed.push(rid);
    }

    /// A random schedule over the scenario's faults: one at a time, each for a short while.
    async fn nemesis(self: Arc<Self>) {
        let all = self.cfg.scenario.faults();
        if all.is_empty() {
            return;
        }
        // Swarm testing: chaos uses, per seed, a subset of its fault types (each kept at even
        // odds, at least one), so that a seed's faults hit a few parts hard rather than every
        // part a little. Drawn from a stream of its own: the subset is the seed's alone.
        let kinds: Vec<Fault> = if self.cfg.scenario == Scenario::Chaos {
            let mut rng = rand::rngs::StdRng::seed_from_u64(self.cfg.seed ^ 0x5a_a4_4a);
            let mut kept: Vec<Fault> = all.iter().copied().filter(|_| rng.gen_bool(0.5)).collect();
            if kept.is_empty() {
                kept.push(all[rng.gen_range(0..all.len())]);
            }
            let names: std::collections::BTreeSet<String> = kept.iter().map(|f| format!("{f:?}")).collect();
            let names: Vec<String> = names.into_iter().collect();
            self.faults.event(format!("swarm: {}", names.join(" ")));
            kept
        } else {
            all.to_vec()
        };
        // Aimed faults of the operator scenario, before the random ones: a pause at once, while
        // the sale is at its busiest (what a stale API process sells after it is the point), and
        // a Redis loss with a long pause right behind it, so that the recovery's reopen falls
        // inside the pause (it must leave the gates paused).
        // Competing recoveries get one of two aimed pairs per seed, the windows a recovery must
        // get right: records lost after their ack while the sale is busy, then a Redis restart
        // that keeps their reservations (past the AOF window: the recovery must rescue them
        // from the outbox, and the reconciler, which would republish them, stands aside while
        // it runs); or an API node paused mid-sale and Redis lost under it (it wakes up a zombie,
        // maybe after the recovery bumped the generation, and publishes orders of the old one). Then a quiet while, so that the recovery gets that far before the
        // random faults (another Redis restart starts it over) resume.
        let ms = |r: std::ops::Range<u64>| thread_rng().gen_range(r);
        let mut aimed: Vec<(u64, Fault, u64)> = match self.cfg.scenario {
            Scenario::Operator => vec![
                (0, Fault::OperatorPause, ms(30..300)),
                (0, Fault::RedisRestartVolatile, 0),
                (0, Fault::PauseInRecovery, ms(500..1_000)),
            ],
            // The restart comes past the AOF window, so it keeps the reservations whose records
            // were lost, and before the reconciler's republish age, so it still finds them (a
            // seed whose timings leave no room between the two gets the other pair).
            Scenario::CompetingRecoveries
                if thread_rng().gen_bool(0.5)
                    && self.timings.republish_after_ms > self.timings.aof_window_ms + 300 =>
            {
                // Past the window's end by more than the AOF window: the restart keeps every
                // reservation whose record the window lost.
                let lossy = ms(100..200);
                vec![
                    (ms(0..100), Fault::MqLoseAfterAck, lossy),
                    // And records held back past the recovery's drain in the same window: the
                    // rescue must make orders of their reservations that no late record undoes.
                    (0, Fault::MqVisibleLate, lossy),
                    (
                        self.timings.aof_window_ms + lossy + ms(20..80),
                        Fault::RedisRestartAof,
                        0,
                    ),
                    (0, Fault::MqLoseInRecovery, 0),
                    (0, Fault::MqLateInRecovery, 0),
                    (0, Fault::RedisResendInRecovery, 0),
                    (0, Fault::DeliveredLateInRecovery, 0),
                    (0, Fault::LedgerStalledInRecovery, 0),
                    (0, Fault::DeadlockInRecovery, 0),
                ]
            }
            // The pause ends after the recovery bumped the generation, however long the faults
            // in it make the recovery (a pause of a fixed length mostly ended before the bump).
            Scenario::CompetingRecoveries => {
                vec![
                    (ms(50..300), Fault::EnginePauseAcrossBump, 20_000),
                    (ms(0..50), Fault::RedisRestartVolatile, 0),
                    (0, Fault::DeliveredLateInRecovery, 0),
                    (0, Fault::LedgerStalledInRecovery, 0),
                    (0, Fault::DeadlockInRecovery, 0),
                ]
            }
            // On every other seed, once, while the sale is busy (just past the publish timeout,
            // so that the sale goes on around it): purchases whose publish timed out meet a
            // restart that lost their reservation.
            Scenario::RedisLoss if thread_rng().gen_bool(0.5) => {
                vec![(ms(200..600), Fault::BrokerDownAcrossRestart, ms(350..600))]
            }
            _ => Vec::new(),
        };
        let mut quiet = match self.cfg.scenario {
            // Long enough for the recovery the pair starts to wait out its publish window and
            // reach its rescue before a random fault (another restart, a paused runner) cuts it.
            Scenario::CompetingRecoveries => {
                let first = match aimed[0].1 {
                    Fault::EnginePauseAcrossBump => 0,
                    _ => aimed[0].2,
                };
                first + self.timings.recovery().quiesce.as_millis() as u64 + ms(300..800)
            }
            _ => 0,
        };
        aimed.reverse();
        let mut given = self.cfg.schedule.clone().map(|s| s.into_iter());
        loop {
            let (pace, fault, hold) = match aimed.pop() {
                Some(aim) => aim,
                None => {
                    let pace = thread_rng().gen_range(self.cfg.scenario.pace()) + std::mem::take(&mut quiet);
                    let fault = kinds[thread_rng().gen_range(0..kinds.len())];
                    (pace, fault, thread_rng().gen_range(fault.hold_range()))
                }
            };
            // A given schedule replaces what was drawn (drawn all the same, so that the rest of
            // the world draws what it drew in the run the schedule came from).
            // Past its end, the nemesis idles as drawn (the world stopped the run the schedule
            // came from while its nemesis waited for the next fault).
            let next = match given.as_mut().map(Iterator::next) {
                None => Some(Scheduled {
                    after_ms: pace,
                    fault,
                    hold_ms: hold,
                }),
                Some(next) => next,
            };
            let after = next.map_or(pace, |n| n.after_ms);
            if after > 0 {
                tokio::time::sleep(Duration::from_millis(after)).await;
            }
            // L2 is about selling everything once healed: the skewed run heals halfway through
            // the sale, while buyers are still there.
            if self.cfg.scenario == Scenario::Skewed
                && self.faults.elapsed().as_millis() as u64 > self.cfg.sale_ms / 2
            {
                self.faults
                    .event("nemesis done: healed while the sale goes on".into());
                return;
            }
            let Some(next) = next else { continue };
            self.schedule.lock().expect("schedule").push(next);
            self.inject(next.fault, Duration::from_millis(next.hold_ms)).await;
        }
    }

    async fn inject(self: &Arc<Self>, fault: Fault, hold: Duration) {
        let f = &self.faults;
        let pick = |nodes: &[NodeHandle]| nodes[thread_rng().gen_range(0..nodes.len())].id();
        match fault {
            Fault::ConsumerCrash => self.down_for(pick(&self.consumers), "consumer_crash", hold).await,
            Fault::EngineCrash => self.down_for(pick(&self.engines), "engine_crash", hold).await,
            Fault::JobsCrash => self.down_for(pick(&self.jobs_nodes), "jobs_crash", hold).await,
            Fault::BrokerDown => self.down_for(self.kafka_node.id(), "broker_down", hold).await,
            Fault::BrokerDownAcrossRestart => {
                let (w, at) = (self.clone(), hold.mul_f64(thread_rng().gen_range(0.3..0.9)));
                let task = tokio::spawn(async move {
                    tokio::time::sleep(at).await;
                    w.restart_redis(Fault::RedisRestartAof).await
                });
                self.background.lock().expect("background").push(task);
                self.down_for(self.kafka_node.id(), "broker_down", hold).await
            }
            Fault::MysqlUnavailable => {
                self.down_for(self.mysql_node.id(), "mysql_unavailable", hold)
                    .await
            }
            Fault::ClockSkew => {
                let i = thread_rng().gen_range(0..self.engines.len());
                let skew = thread_rng().gen_range(-500..=500);
                f.fired("clock_skew");
                f.event(format!("engine-{i} clock skewed {skew:+} ms"));
                self.skews.lock().expect("skews")[i] = skew;
                self.reboot(self.engines[i].id());
            }
            Fault::RedisRestartVolatile | Fault::RedisRestartAof => self.restart_redis(fault).await,
            Fault::RedisFailover => {
                f.fired("redis_failover");
                // The replica holds what the primary held `lag` ago; the primary goes on taking
                // writes until it dies.
                let lag = thread_rng().gen_range(0..=self.timings.replica_lag_ms);
                if lag > self.timings.recovery().quiesce.as_millis() as u64 {
                    f.cover("failover_past_quiesce");
                }
                let (image, taken_at) = (self.redis.model.dump(), f.elapsed());
                tokio::time::sleep(Duration::from_millis(lag)).await;
                f.event(format!("redis fails over to a replica {lag} ms behind"));
                self.redis.promote_at_restart(image, taken_at);
                self.reboot(self.redis_node.id());
            }
            Fault::RedisPartition => {
                f.fired("redis_partition");
                NetSim::current().clog_node(self.redis_node.id());
                tokio::time::sleep(hold).await;
                NetSim::current().unclog_node(self.redis_node.id());
            }
            Fault::LinkPartition => {
                let (client, store) = match thread_rng().gen_range(0..6) {
                    0 => ((pick(&self.engines), "engine"), (self.kafka_node.id(), "kafka")),
                    1 => ((pick(&self.engines), "engine"), (self.redis_node.id(), "redis")),
                    2 => ((pick(&self.consumers), "worker"), (self.mysql_node.id(), "mysql")),
                    3 => ((pick(&self.consumers), "worker"), (self.kafka_node.id(), "kafka")),
                    4 => ((pick(&self.jobs_nodes), "jobs"), (self.redis_node.id(), "redis")),
                    _ => ((pick(&self.jobs_nodes), "jobs"), (self.mysql_node.id(), "mysql")),
                };
                // 0: both ways; 1: replies lost (the request is carried out); 2: requests lost.
                let way = thread_rng().gen_range(0..3);
                let links: Vec<_> = match way {
                    0 => vec![(client.0, store.0), (store.0, client.0)],
                    1 => vec![(store.0, client.0)],
                    _ => vec![(client.0, store.0)],
                };
                f.fired("link_partition");
                f.event(format!(
                    "link {} node {} <-> {} cut {} for {} ms",
                    client.1,
                    client.0,
                    store.1,
                    ["both ways", "for replies", "for requests"][way],
                    hold.as_millis()
                ));
                let net = NetSim::current();
                links.iter().for_each(|&(a, b)| net.clog_link(a, b));
                tokio::time::sleep(hold).await;
                links.iter().for_each(|&(a, b)| net.unclog_link(a, b));
            }
            Fault::OperatorPause => self.operator_pause(hold).await,
            // Aimed at the recovery's last step: once a claim holds and every bucket has its
            // stock again (rebuilt, or never lost), the reopen is near — it reads the registry,
            // then writes the gates — and the operator acts about then. A recovery outlasts the
            // sale as often as not, and so does the operator's watch: it goes on past the heal
            // (the settle resumes a pause left standing).
            Fault::PauseInRecovery => {
                let w = self.clone();
                let task = tokio::spawn(async move {
                    for _ in 0..400 {
                        if w.raw_claim().is_some() && w.stock_keys_present() {
                            break;
                        }
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..1_000))).await;
                    w.operator_pause(hold).await
                });
                self.background.lock().expect("background").push(task);
            }
            Fault::FullLossRestart => self.full_loss_restart().await,
            Fault::MqLoseInRecovery => self.window_in_recovery("mq_lose_after_ack", lose_after_ack),
            Fault::MqLateInRecovery => self.window_in_recovery("mq_visible_late", visible_late),
            Fault::LedgerStalledInRecovery => {
                self.window_in_recovery("ledger_stalled_txn", |k, on| k.ledger_stalled_txn = prob(0.2, on))
            }
            // The ledger's writes (a runner's bump among the few a recovery sends), 2 s late at
            // least (past many a claim's lease: after a successor's bump, as often as not), for
            // two leases at most: each one held back fails the recovery's attempt.
            Fault::DeliveredLateInRecovery => self.window_in_recovery_for(
                "ledger_delivered_late",
                |k, on| {
                    k.ledger_delivered_late = prob(0.3, on);
                    k.delivered_late_floor = delay(2_000, on);
                },
                Some(2 * self.timings.recovery().lease),
            ),
            Fault::DeadlockInRecovery => self.window_in_recovery_for(
                "ledger_deadlock",
                |k, on| k.ledger_deadlock = prob(0.3, on),
                Some(2 * self.timings.recovery().lease),
            ),
            // Every other script: a recovery that fails at each re-sent step its first run already
            // took (a reopen, a finish) never finishes.
            Fault::RedisResendInRecovery => {
                self.window_in_recovery("redis_resend", |k, on| k.redis_resend = prob(0.5, on))
            }
            // Aimed at a healthy activity under load (a key lost while a recovery rebuilds is
            // the recovery's anyway): it waits for one — in the late wave, if the first never
            // was (a recovery outlasts it as often as not).
            Fault::RedisKeyLost => {
                use seckill_engine::adapters::script::{gate_key, stock_key};
                let all: Vec<BucketNo> = self.god.plan.all_buckets().collect();
                let b = all[thread_rng().gen_range(0..all.len())];
                // Aimed at the writers that check before they write: half the time the stock key
                // goes as the writer's write of it arrives, after its check found it — where the
                // operator warms up, a warmup's (one is started then), else the rebalancer's next
                // give (into whichever bucket it moves units to) or the next cancel's release.
                let warmup = self.cfg.scenario.faults().contains(&Fault::OperatorWarmup);
                let racing = thread_rng().gen_bool(0.5);
                let key = match racing || thread_rng().gen_bool(0.5) {
                    true => stock_key(ACTIVITY, b),
                    false => gate_key(ACTIVITY, b),
                };
                let w = self.clone();
                let task = tokio::spawn(async move {
                    while !(w.faults.under_load() && w.healthy()) {
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    if racing {
                        use crate::stores::LoseAtWrite;
                        let at = if warmup {
                            LoseAtWrite::Warmup(key)
                        } else if thread_rng().gen_bool(0.5) {
                            LoseAtWrite::NextGive
                        } else {
                            LoseAtWrite::NextCancel
                        };
                        *w.redis.lose_at_write.lock().expect("lose at write") = Some(at);
                        if warmup {
                            w.faults.fired("operator_warmup");
                            w.operator_warmup().await;
                        }
                        return;
                    }
                    w.faults.fired("redis_key_lost");
                    w.faults.event(format!("redis: {key} lost"));
                    w.redis.lose_key(&key, w.faults.elapsed());
                    // The recovery recreates the gate: its versions start again.
                    w.gate_versions.lock().expect("gate versions").1.remove(&b.0);
                });
                self.background.lock().expect("background").push(task);
            }
            // Aimed at a healthy activity under load, as a deploy job re-running its steps
            // mid-sale meets it (one that meets a recovery is told to try again, and does).
            Fault::OperatorWarmup => {
                let w = self.clone();
                let task = tokio::spawn(async move {
                    while !(w.faults.under_load() && w.healthy()) {
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    w.faults.fired("operator_warmup");
                    w.operator_warmup().await
                });
                self.background.lock().expect("background").push(task);
            }
            // Pauses overlap the faults that follow: the nemesis goes on while the node sleeps.
            Fault::EnginePause => {
                let (w, id) = (self.clone(), pick(&self.engines));
                let task = tokio::spawn(async move { w.pause_for(id, "engine_pause", hold).await });
                self.background.lock().expect("background").push(task);
            }
            Fault::EnginePauseAcrossBump => {
                let (w, id) = (self.clone(), pick(&self.engines));
                *self.zombie.lock().expect("zombie") = Some(id);
                let task = tokio::spawn(async move {
                    let bumps = || w.ledger_log.bumps.lock().expect("ledger log").len();
                    let before = bumps();
                    w.faults.fired("engine_pause_across_bump");
                    w.faults.event(
                        "engine_pause_across_bump: node paused until a recovery bumps the generation".into(),
                    );
                    w.handle.pause(id);
                    let deadline = tokio::time::Instant::now() + hold;
                    while bumps() == before && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..300))).await;
                    w.handle.resume(id);
                    *w.zombie.lock().expect("zombie") = None;
                });
                self.background.lock().expect("background").push(task);
            }
            Fault::JobsPause => {
                let (w, id) = (self.clone(), pick(&self.jobs_nodes));
                let task = tokio::spawn(async move { w.pause_for(id, "jobs_pause", hold).await });
                self.background.lock().expect("background").push(task);
            }
            Fault::ConsumerPause => {
                let (w, id) = (self.clone(), pick(&self.consumers));
                let task = tokio::spawn(async move { w.pause_for(id, "consumer_pause", hold).await });
                self.background.lock().expect("background").push(task);
            }
            Fault::PacketLoss => {
                f.fired("packet_loss");
                NetSim::current().update_config(|c| c.packet_loss_rate = 0.05);
                tokio::time::sleep(hold).await;
                NetSim::current().update_config(|c| c.packet_loss_rate = 0.0);
            }
            // Knob windows overlap the faults that follow (and each other).
            knob => {
                type Turn = fn(&mut crate::faults::Knobs, bool);
                let (name, turn): (&'static str, Turn) = match knob {
                    Fault::LedgerLockWait => ("ledger_lock_wait", |k, on| k.ledger_lock_wait = prob(0.3, on)),
                    Fault::LedgerDeadlock => ("ledger_deadlock", |k, on| k.ledger_deadlock = prob(0.3, on)),
                    Fault::LedgerCommitUnknown => ("ledger_commit_unknown", |k, on| {
                        k.ledger_commit_unknown = prob(0.3, on)
                    }),
                    Fault::LedgerConnLoss => ("ledger_conn_loss", |k, on| k.ledger_conn_loss = prob(0.2, on)),
                    Fault::LedgerStalledTxn => {
                        ("ledger_stalled_txn", |k, on| k.ledger_stalled_txn = prob(0.1, on))
                    }
                    Fault::MqDuplicate => ("mq_duplicate", |k, on| k.mq_duplicate = prob(0.3, on)),
                    Fault::MqDelay => ("mq_delay", |k, on| k.mq_delay = delay(80, on)),
                    Fault::MqRefuse => ("mq_refuse", |k, on| k.mq_refuse = prob(0.5, on)),
                    Fault::MqAckLost => ("mq_ack_lost", |k, on| k.mq_ack_lost = prob(0.3, on)),
                    Fault::MqVisibleLate => ("mq_visible_late", visible_late),
                    Fault::RedisResend => ("redis_resend", redis_resend),
                    Fault::DeliveredLate => ("delivered_late", delivered_late),
                    Fault::MqLoseAfterAck => ("mq_lose_after_ack", lose_after_ack),
                    Fault::RedisLatency => ("redis_latency", |k, on| k.redis_latency = delay(60, on)),
                    Fault::MqRewindFail => ("mq_rewind_fail", |k, on| k.mq_rewind_fail = prob(0.7, on)),
                    _ => ("redis_slow_script", |k, on| k.redis_slow_script = prob(0.05, on)),
                };
                f.event(format!("window {name} for {} ms", hold.as_millis()));
                // Windows whose effect is a delay count when opened; the others count per hit.
                if matches!(knob, Fault::MqDelay | Fault::RedisLatency) {
                    f.fired(name);
                }
                f.open_window(name, turn);
                let f = f.clone();
                let task = tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    f.close_window(name, turn);
                });
                self.background.lock().expect("background").push(task);
            }
        }
    }

    /// A knob window open for as long as the next recovery runs (from its claim until it finished),
    /// outlasting the heal (which turns every knob off), as the recovery does.
    fn window_in_recovery(self: &Arc<Self>, name: &'static str, turn: fn(&mut crate::faults::Knobs, bool)) {
        self.window_in_recovery_for(name, turn, None)
    }

    /// `window_in_recovery`, closed after `limit` at the latest: for a fault that fails the
    /// recovery's steps, which it would otherwise hold open for good.
    fn window_in_recovery_for(
        self: &Arc<Self>,
        name: &'static str,
        turn: fn(&mut crate::faults::Knobs, bool),
        limit: Option<Duration>,
    ) {
        let w = self.clone();
        let task = tokio::spawn(async move {
            while w.raw_claim().is_none() {
                tokio::time::sleep(CHECK_EVERY).await;
            }
            w.faults.event(format!("window {name} while a recovery runs"));
            w.faults.open_window(name, turn);
            let until = limit.map(|l| w.faults.elapsed() + l);
            while w.raw_claim().is_some() && until.is_none_or(|u| w.faults.elapsed() < u) {
                if !w.faults.window_open(name) {
                    w.faults.open_window(name, turn);
                }
                tokio::time::sleep(CHECK_EVERY).await;
            }
            w.faults.close_window(name, turn);
        });
        self.background.lock().expect("background").push(task);
    }

    /// Redis restarts with what its persistence kept (`RedisRestartVolatile` or `RedisRestartAof`).
    async fn restart_redis(&self, fault: Fault) {
        let f = &self.faults;
        let volatile = fault == Fault::RedisRestartVolatile;
        f.fired(if volatile {
            "redis_restart_volatile"
        } else {
            "redis_restart_aof_window"
        });
        self.redis.set_restart_mode(if volatile {
            Persistence::Volatile
        } else {
            Persistence::Aof
        });
        // In chaos, half the restarts are not instant: Redis is down a while (loading its
        // AOF, a supervisor's restart delay) and requests meanwhile get no answer. The
        // scenarios about recoveries restart it at once, so that records still in flight
        // meet the recovery. Either way it comes back with what its persistence kept.
        self.handle.kill(self.redis_node.id());
        if self.cfg.scenario == Scenario::Chaos && thread_rng().gen_bool(0.5) {
            let down = thread_rng().gen_range(50..1_500);
            f.fired("redis_down_a_while");
            f.event(format!("redis down for {down} ms"));
            tokio::time::sleep(Duration::from_millis(down)).await;
        }
        // Killed again: an aimed restart may have brought it back meanwhile.
        self.reboot(self.redis_node.id());
    }

    /// A node stops (every task where it is), for `hold`, and goes on: a zombie.
    async fn pause_for(&self, id: madsim::task::NodeId, fault: &str, hold: Duration) {
        self.faults.fired(fault);
        self.faults
            .event(format!("{fault}: node paused for {} ms", hold.as_millis()));
        self.handle.pause(id);
        tokio::time::sleep(hold).await;
        self.handle.resume(id);
    }

    /// An admin call through a random API node, from the operator's console.
    async fn admin<R>(&self, req: R, timeout: Duration) -> (usize, Result<R::Response, String>)
    where
        R: madsim::net::rpc::Request + Send + 'static,
        R::Response: Send + 'static,
    {
        let i = thread_rng().gen_range(0..self.engines.len());
        let engine = engine_addr(i);
        let answer = self
            .operator
            .spawn(async move {
                let ep = Endpoint::bind("10.0.5.1:0").await.expect("bind the console");
                ep.call_timeout(engine, req, timeout)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| format!("{e:?}"))
            .and_then(|r| r);
        (i, answer)
    }

    /// Pause (or, one time in five, close) through one API node; after `hold`, resume through
    /// another. From the pause's return until the registry holds a newer resume, S5 holds.
    async fn operator_pause(&self, hold: Duration) {
        let state = if thread_rng().gen_bool(0.2) {
            ActivityState::Closed
        } else {
            ActivityState::Paused
        };
        // The operator waits half a second for the pause; past that, it takes the pause back (a
        // resume through another node) while the first call may still be on its way to the
        // gates: only their versions keep the older intent from winning.
        let (i, answer) = self
            .admin(rpc::Operate { state }, Duration::from_millis(500))
            .await;
        match answer {
            Ok(Ok(intent)) => {
                let at = self.faults.elapsed();
                self.faults.fired("operator_pause");
                self.faults.event(format!(
                    "operator: {state} through engine-{i} (version {})",
                    intent.version
                ));
                self.pauses.lock().expect("pauses").push((at, intent.version));
            }
            other => {
                self.faults
                    .event(format!("operator: {state} through engine-{i} failed: {other:?}"));
                self.resume().await;
                return;
            }
        }
        tokio::time::sleep(hold * 2).await;
        self.resume().await;
    }

    /// The operator resumes the sale (until an API node says it did).
    async fn resume(&self) {
        for _ in 0..50 {
            let (i, answer) = self
                .admin(
                    rpc::Operate {
                        state: ActivityState::Open,
                    },
                    Duration::from_secs(5),
                )
                .await;
            if let Ok(Ok(_)) = answer {
                self.faults.event(format!("operator: resumed through engine-{i}"));
                return;
            }
            self.faults
                .event(format!("operator: resume through engine-{i} failed: {answer:?}"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Redis restarts with nothing, every API node restarts, and the operator calls warmup
    /// through one of them (retrying until it answers) — the README's sequence.
    async fn full_loss_restart(&self) {
        self.faults.fired("full_loss_restart");
        self.redis.set_restart_mode(Persistence::Volatile);
        // Half the time the whole site went down: the job runners come back only after the
        // operator's warmup, which then meets the lost Redis alone (no runner's recovery got
        // there first to hide what the warmup does).
        let site_down = self.cfg.jobs && thread_rng().gen_bool(0.5);
        if site_down {
            self.faults
                .event("full_loss_restart: the job runners are down until the warmup".into());
            for j in &self.jobs_nodes {
                self.handle.kill(j.id());
            }
        }
        self.reboot(self.redis_node.id());
        for e in &self.engines {
            self.reboot(e.id());
        }
        self.operator_warmup().await;
        if site_down {
            for j in &self.jobs_nodes {
                self.handle.restart(j.id());
            }
        }
    }

    /// The operator's warmup through an API node, retried until one answers.
    async fn operator_warmup(&self) {
        for _ in 0..20 {
            let began = self.faults.elapsed();
            let (i, answer) = self.admin(rpc::Warmup, Duration::from_secs(30)).await;
            match answer {
                Ok(Ok(what)) => {
                    self.faults
                        .event(format!("operator: warmup through engine-{i}: {what}"));
                    self.warmup_recovered_only_a_loss(began, &what);
                    return;
                }
                other => self
                    .faults
                    .event(format!("operator: warmup through engine-{i} failed: {other:?}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A warmup that found the activity whole (no recovery needed) and then stock keys missing
    /// as it wrote recovers them — a recovery, with its closed gates and the in-flight orders it
    /// refuses, on account of keys Redis must really have lost after the warmup began. One that
    /// recovers a Redis that lost nothing (a warmup that took every bucket for lost) is an
    /// outage of the operator's making.
    fn warmup_recovered_only_a_loss(&self, began: Duration, answer: &str) {
        if !answer.contains(seckill_engine::service::admin::LOST_AFTER_CHECK) {
            return;
        }
        if self.redis.last_loss().is_none_or(|at| at < began) {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "a warmup begun at {:.3} s recovered buckets it found without their stock key, \
                         and Redis lost no key and did not restart since: {answer}",
                        began.as_secs_f64()
                    ),
                }],
                Verdict::Safety,
            );
        }
    }

    /// A node crashes (at whatever await point it is), stays down for `hold`, and restarts.
    async fn down_for(&self, id: madsim::task::NodeId, fault: &str, hold: Duration) {
        self.faults.fired(fault);
        self.handle.kill(id);
        tokio::time::sleep(hold).await;
        self.handle.restart(id);
    }

    /// A crash and an immediate restart. (madsim's `restart` alone keeps the node's sockets
    /// bound, so the new incarnation could not bind its address.)
    fn reboot(&self, id: madsim::task::NodeId) {
        self.handle.kill(id);
        self.handle.restart(id);
    }

    /// Every server node of the world (the clients are its callers, created per sale).
    fn nodes(&self) -> impl Iterator<Item = &NodeHandle> {
        [
            &self.redis_node,
            &self.mysql_node,
            &self.kafka_node,
            &self.operator,
        ]
        .into_iter()
        .chain(&self.jobs_nodes)
        .chain(&self.engines)
        .chain(&self.consumers)
    }

    /// Stop every node and let the executor drop their tasks before the runtime goes. A task
    /// still pending when a madsim runtime drops is never dropped (madsim-rs/madsim#242): the
    /// servers' loops hold the stores, and so do clients a violation stopped mid-click — each run
    /// kept megabytes alive (a 20-seed sweep peaked at 507,544 KB; now 18,804 KB).
    async fn tear_down(&self, clients: impl Iterator<Item = madsim::task::NodeId>) {
        for task in self.background.lock().expect("background").drain(..) {
            task.abort();
        }
        for id in self.nodes().map(NodeHandle::id).chain(clients) {
            self.handle.kill(id);
        }
        // One tick: the executor takes the killed tasks it was woken for and drops them.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    /// Undo every fault: knobs off, links healed, every node running.
    async fn heal(&self) {
        self.faults.knobs_off();
        // The recovery's long fault points stay armed through the heal (the recovery the faults
        // started runs after it); the rebalancer's does not (the world aims a Redis restart at
        // it: a fault after the heal).
        planted::stop_stalls(RECOVERY_LONG_SITES);
        let net = NetSim::current();
        net.update_config(|c| c.packet_loss_rate = 0.0);
        let nodes: Vec<&NodeHandle> = self.nodes().collect();
        for a in &nodes {
            for b in &nodes {
                net.unclog_link(a.id(), b.id());
            }
        }
        let zombie = *self.zombie.lock().expect("zombie");
        for n in nodes {
            net.unclog_node(n.id());
            if Some(n.id()) != zombie {
                self.handle.resume(n.id());
            }
            if self.handle.is_exit(n.id()) {
                self.handle.restart(n.id());
            }
        }
        if !self.pauses.lock().expect("pauses").is_empty() {
            self.resume().await;
        }
        self.faults.event("healed".into());
    }

    /// Wait until the consumers have committed everything on the bus (three looks in a row).
    /// Wait for quiescence: the bus drained, nothing open or pending in Redis, every cancelled
    /// unit back, and the activity open on the current Redis epoch — three looks in a row.
    async fn settle(&self) -> bool {
        let mut deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
        let mut quiet = 0;
        let mut why = String::new();
        let operated = self.cfg.scenario.faults().contains(&Fault::OperatorPause);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // A sleep at a long fault point (each fires once at most) or a zombie held until a
            // bump (at most its hold) is the faults' time, not the engine's.
            if planted::stalled() > 0 || self.zombie.lock().expect("zombie").is_some() {
                deadline += Duration::from_millis(50);
            }
            // An operator's pause still in flight when the nemesis stopped can land after the
            // heal's resume (its caller gave up, the API node carried on): the operator sees the
            // registry paused and resumes again, as one would.
            if operated {
                let intent = self.god.ledger.registry(ACTIVITY).await.expect("in-process");
                if intent.is_some_and(|r| r.intent.state != seckill_engine::domain::ActivityState::Open) {
                    self.faults
                        .event("operator: the registry is not open after the heal".into());
                    self.resume().await;
                }
            }
            why = self.unsettled().await;
            quiet = if why.is_empty() { quiet + 1 } else { 0 };
            if quiet >= 3 {
                self.faults.event("settled".into());
                return true;
            }
        }
        self.faults.event(format!("not settled: {why}"));
        false
    }

    /// Why the world is not quiescent yet ("" when it is).
    async fn unsettled(&self) -> String {
        // A process asleep at a fault point wakes up as a zombie and goes on where it was: the
        // world is not settled before it did.
        let stalled = planted::stalled();
        if stalled > 0 {
            return format!("{stalled} processes asleep at a fault point");
        }
        if self.zombie.lock().expect("zombie").is_some() {
            return "an API node paused until a recovery's bump".into();
        }
        let held = self.faults.held_back_left();
        if !held.is_zero() {
            return format!(
                "a request held back by the network lands in {} ms",
                held.as_millis()
            );
        }
        let lag = self.kafka.lag(GROUP);
        if lag > 0 {
            return format!("bus lag {lag}");
        }
        if !self.cfg.jobs {
            return String::new(); // without the jobs, a drained bus is all that can settle
        }
        let view = self.god.raw_redis();
        let meta = self.god.cache.meta(ACTIVITY).await.expect("in-process");
        let epoch = self.god.cache.epoch().await.expect("in-process");
        match &meta {
            Some(m) if m.claim.is_none() && m.epoch.as_deref() == Some(&epoch) => {}
            other => return format!("activity not recovered: {other:?}"),
        }
        if let Some(b) = view.buckets.iter().find(|b| b.stock.is_none()) {
            return format!("bucket {} has no stock key", b.bucket);
        }
        let shut: Vec<String> = view
            .buckets
            .iter()
            .filter(|b| {
                b.gate
                    .as_ref()
                    .is_none_or(|g| g.state != seckill_engine::domain::ActivityState::Open)
            })
            .map(|b| format!("{}: {:?}", b.bucket, b.gate))
            .collect();
        if !shut.is_empty() {
            return format!("gates not open: {}", shut.join(", "));
        }
        // An operator call overtaken between its registry write and its gates leaves gates on an
        // older intent; the reconciler writes the registry's to them.
        if let Some(reg) = self.god.ledger.registry(ACTIVITY).await.expect("in-process") {
            let behind: Vec<String> = view
                .buckets
                .iter()
                .filter_map(|b| b.gate.as_ref().map(|g| (b.bucket, g.version)))
                .filter(|(_, v)| *v < reg.intent.version)
                .map(|(b, v)| format!("{b}: version {v}"))
                .collect();
            if !behind.is_empty() {
                return format!(
                    "gates behind the registry's intent (version {}): {}",
                    reg.intent.version,
                    behind.join(", ")
                );
            }
        }
        let open: usize = view.buckets.iter().map(|b| b.open.len() + b.pending.len()).sum();
        if open > 0 {
            return format!("{open} reservations or pending marks open");
        }
        let moving: usize = view.buckets.iter().map(|b| b.transfers_in_flight.len()).sum();
        if moving > 0 {
            return format!("{moving} transfers in flight");
        }
        let released: std::collections::BTreeSet<_> = view
            .buckets
            .iter()
            .flat_map(|b| b.cancelled_released.iter().copied())
            .collect();
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let unreleased = db
            .orders
            .iter()
            .filter(|o| o.status == seckill_engine::ports::OrderStatus::Cancelled)
            .filter(|o| !released.contains(&o.reservation.id))
            .count();
        if unreleased > 0 {
            return format!("{unreleased} cancelled units not back");
        }
        // Every order ends paid or cancelled by the payment timeout.
        let unpaid = db
            .orders
            .iter()
            .filter(|o| o.status == seckill_engine::ports::OrderStatus::Created)
            .count();
        if unpaid > 0 {
            return format!("{unpaid} orders awaiting payment or their timeout");
        }
        String::new()
    }

    /// L1 from ground truth: every reservation a client was told is "queued" is an order in the
    /// ledger (any status), unless its user holds another order (a duplicate buyer's unit went
    /// back) or a Redis restart lost it from the outbox after the client was told, or a restart
    /// lost it and the broker lost its record after the ack (counted as they happen: the exact
    /// account, nothing else is excused). A reservation that silently
    /// vanished — deleted by a rebuild, released without the user told — is a violation.
    async fn l1_exact_account(&self, queued: &[String]) -> Vec<inv::Violation> {
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let in_ledger: std::collections::BTreeSet<String> =
            db.orders.iter().map(|o| o.reservation.id.to_string()).collect();
        let buyers: std::collections::BTreeSet<UserId> =
            db.orders.iter().map(|o| o.reservation.user).collect();
        let lost = self.redis.lost_outbox.lock().expect("lost outbox").clone();
        let (users, queued_at) = {
            let h = self.history.lock().expect("history");
            (h.queued_users.clone(), h.queued_at.clone())
        };
        let dropped = self.kafka.lost_after_ack.lock().expect("kafka").clone();
        let adopted = self.redis.adopted_at.lock().expect("adopted").clone();
        // Lost by a Redis restart after the client heard "queued" (or after Redis confirmed it
        // held the reservation, the answer then on its way), or lost by Redis and by the broker
        // after its ack: data loss. Gone from Redis before the answer with no such confirmation
        // and no record lost: the answer promised what no longer existed.
        let excused = |rid: &String| {
            lost.get(rid).is_some_and(|lost_at| {
                dropped.contains(rid)
                    || queued_at.get(rid).is_some_and(|q| q <= lost_at)
                    || adopted.get(rid).is_some_and(|a| a <= lost_at)
            })
        };
        queued
            .iter()
            .filter(|rid| !in_ledger.contains(*rid) && !excused(rid))
            .filter(|rid| users.get(*rid).is_none_or(|u| !buyers.contains(u)))
            .map(|rid| {
                let told = queued_at
                    .get(rid)
                    .map_or("?".to_string(), |t| format!("{:.3} s", t.as_secs_f64()));
                let lost = match lost.get(rid) {
                    Some(at) => format!(
                        "a Redis restart lost it at {:.3} s, before the answer",
                        at.as_secs_f64()
                    ),
                    None => "no Redis restart lost it".to_string(),
                };
                inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "queued reservation {rid} (told at {told}) never became an order, and {lost}"
                    ),
                }
            })
            .collect()
    }

    /// While Redis loses nothing, its buyer marks and stock are the truth the ledger only
    /// confirms: a consumer batch in which the ledger refused a reservation because its user
    /// already held an order, or because the bucket had no unit left, means Redis let a user
    /// reserve twice (S2) or sold a unit it did not have (S1) — even if the refusal's follow-up
    /// put everything right again.
    fn refusals_without_loss(&self) -> Vec<inv::Violation> {
        let seen = self.faults.coverage();
        [
            (
                "duplicate_buyer_refused",
                inv::Invariant::S2OneOrderPerUser,
                "user already held an order",
            ),
            (
                "out_of_stock_refused",
                inv::Invariant::S1NoOversell,
                "bucket had no unit left",
            ),
        ]
        .into_iter()
        .filter_map(|(what, invariant, why)| {
            seen.get(what).map(|batches| inv::Violation {
                invariant,
                bucket: None,
                detail: format!(
                    "in {batches} consumer batches the ledger refused a reservation because its {why}, \
                     although Redis lost nothing"
                ),
            })
        })
        .collect()
    }

    /// Bounded failed orders: an order fails for want of a unit only where Redis sold one it
    /// did not have, and only a restart makes Redis hold more than the ledger can sell — no more
    /// orders of a bucket fail than its restarts gave it units (a unit given back to Redis
    /// after its order failed is sold and fails again). What a restart gave: the units it came
    /// back with above what it held (a key it lost counts whole), or, where that is more, the
    /// units of the reserves it lost whose orders the ledger took (a release lost in the same
    /// window can make the stock come back no higher while those units are sold twice).
    /// S7 for the purchase answers: every order the ledger holds was announced to its user — told
    /// "queued", or hidden behind an answer that did not know (no answer, "unavailable"). An order
    /// of a user whose every answer was definite ("duplicate", "sold out") came from a reserve
    /// the user was told had not happened: a re-sent script that answered its own first run
    /// "duplicate", say.
    fn orders_announced(&self, db: &seckill_engine::ports::LedgerView) -> Vec<inv::Violation> {
        let h = self.history.lock().expect("history");
        let queued: BTreeSet<&String> = h.queued.iter().collect();
        db.orders
            .iter()
            .filter(|o| !queued.contains(&o.reservation.id.to_string()) && !h.unsure.contains(&o.reservation.user))
            .map(|o| inv::Violation {
                invariant: inv::Invariant::S7AnswersTrue,
                bucket: Some(o.reservation.bucket.0),
                detail: format!(
                    "user {} holds order {} ({:?}), yet no answer it got said \"queued\" for it or left its outcome open",
                    o.reservation.user, o.reservation.id, o.status
                ),
            })
            .collect()
    }

    fn failed_orders_bounded(&self, db: &seckill_engine::ports::LedgerView) -> Vec<inv::Violation> {
        use seckill_engine::adapters::script::stock_key;
        let failed = self.ledger_log.out_of_stock.lock().expect("ledger log").clone();
        let overstated = self.redis.overstated.lock().expect("overstated").clone();
        let lost = self.redis.lost_reserves.lock().expect("lost reserves").clone();
        let mut sold_twice: BTreeMap<String, u64> = BTreeMap::new();
        for o in db.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
            if let Some(key) = lost.get(&o.reservation.id.to_string()) {
                *sold_twice.entry(key.clone()).or_default() += u64::from(o.reservation.qty);
            }
        }
        failed
            .into_iter()
            .filter_map(|(bucket, failed)| {
                let key = stock_key(ACTIVITY, BucketNo(bucket));
                let gained = overstated.get(&key).copied().unwrap_or(0);
                let gained = gained.max(sold_twice.get(&key).copied().unwrap_or(0));
                (failed > gained).then(|| inv::Violation {
                    invariant: inv::Invariant::R1Reconciled,
                    bucket: Some(bucket),
                    detail: format!(
                        "{failed} orders failed for want of a unit, and Redis restarts gave the \
                         bucket {gained} units more than it held"
                    ),
                })
            })
            .collect()
    }

    /// Coverage: a record a slow follower held back became visible after a recovery bumped the
    /// generation (it arrived before the bump), and its order stands — rescued into the ledger
    /// before the bump, the late record a redelivery.
    fn cover_late_records(&self, db: &seckill_engine::ports::LedgerView) {
        let late = self.kafka.visible_late.lock().expect("kafka").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        for o in db.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
            let Some((arrived, visible)) = late.get(&o.reservation.id.to_string()) else {
                continue;
            };
            if bumps.iter().any(|b| arrived < b && b < visible) {
                self.faults.cover("late_record_after_bump_kept");
            }
        }
    }

    async fn final_checks(&self, drained: bool) {
        let snap = self.god.snapshot().await;
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        self.record(self.safety(&snap), Verdict::Safety);
        self.record(self.failed_orders_bounded(&db), Verdict::Safety);
        self.record(self.orders_announced(&db), Verdict::Safety);
        self.record(self.god.generation_fenced().await, Verdict::Safety);
        self.record(self.stale_orders_refused(), Verdict::Safety);
        self.record(self.commits_after_apply(), Verdict::Safety);
        self.record(self.recoveries_have_a_cause(), Verdict::Safety);
        self.record(self.finishes_answer_true(), Verdict::Safety);
        self.record(self.closes_not_stale(), Verdict::Safety);
        self.cover_late_records(&db);
        let checks = self.cfg.scenario.checks(self.cfg.jobs);
        let mut live = Vec::new();
        if checks.r1 {
            live.extend(inv::r1_reconciled(&snap));
        }
        if checks.s2_redis {
            self.record(self.refusals_without_loss(), Verdict::Safety);
        }
        if checks.l2 {
            let unsold: i64 = snap.buckets.iter().filter_map(|b| b.redis_stock).sum();
            if unsold > 0 {
                live.push(inv::Violation {
                    invariant: inv::Invariant::L2BoundedUndersell,
                    bucket: None,
                    detail: format!(
                        "{unsold} units left unsold although demand exceeded stock (per bucket: {:?})",
                        snap.buckets
                            .iter()
                            .map(|b| b.redis_stock.unwrap_or(0))
                            .collect::<Vec<_>>()
                    ),
                });
            }
        }
        if checks.l1 {
            let queued = self.history.lock().expect("history").queued.clone();
            live.extend(inv::l1_queued_resolved(&snap, &queued));
            live.extend(self.l1_exact_account(&queued).await);
            live.extend(self.l1_no_early_stale_orders());
            live.extend(inv::l1_nothing_open(&snap));
            if drained {
                live.extend(inv::l3_no_lockout(&snap));
                live.extend(inv::r2_buyers_marked(&snap));
            }
            if !drained {
                live.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!("never quiescent: {}", self.unsettled().await),
                });
            }
        }
        self.record(live, Verdict::Liveness);
    }

    async fn report(&self) -> RunReport {
        let snap = self.god.snapshot().await;
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let fallback = self.god.plan.fallback_bucket();
        for o in &db.orders {
            if o.reservation.bucket == fallback && o.status != OrderStatus::Failed {
                self.faults.cover("fallback_won");
            }
            // Sold under a generation a recovery bumped: the sale went on after a recovery.
            if o.reservation.generation > 0 && o.status != OrderStatus::Failed {
                self.faults.cover("sold_after_recovery");
            }
        }
        // A user whose order failed bought again: failed orders free their users (DESIGN §6).
        let failed: std::collections::BTreeSet<UserId> = (db.orders.iter())
            .filter(|o| o.status == OrderStatus::Failed)
            .map(|o| o.reservation.user)
            .collect();
        if (db.orders.iter()).any(|o| o.status != OrderStatus::Failed && failed.contains(&o.reservation.user))
        {
            self.faults.cover("failed_user_bought_again");
        }
        let history = self.history.lock().expect("history");
        let violated = self.violated.lock().expect("violated");
        RunReport {
            config: self.cfg.clone(),
            timings: self.timings,
            checks: self.cfg.scenario.checks(self.cfg.jobs),
            verdict: violated.as_ref().map_or(Verdict::Ok, |v| v.verdict),
            violations: violated.as_ref().map_or_else(Vec::new, |v| v.violations.clone()),
            violated_at_ms: violated.as_ref().map(|v| v.at.as_millis() as u64),
            faults: self.faults.counters(),
            outcomes: history.outcomes.clone(),
            queued: history.queued.len() as u64,
            units_sold: snap.units_sold(),
            sim_ms: self.faults.elapsed().as_millis() as u64,
            schedule: self.schedule.lock().expect("schedule").clone(),
            coverage: self.faults.coverage(),
            trace: self.faults.trace(),
        }
    }
}
