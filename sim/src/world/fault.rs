//! The fault catalogue: every fault type the nemesis knows, the knobs it turns, how long it
//! holds, and which faults each family of scenarios draws from.

use crate::stores::SESSION_TIMEOUT;
use serde::Serialize;
use std::time::Duration;

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
    /// The operator runs the warmup again mid-sale (a deploy job re-running its steps):
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
    /// Every job runner is down (a deploy of the jobs role) when Redis restarts (AOF), and stays
    /// down for the hold while the faults go on: the sale goes on, on what Redis kept, with
    /// nobody to notice the loss — orders refused for want of a unit free their users, who buy
    /// again, all at the generation still open — until a runner comes back and recovers.
    RedisRestartJobsAway,
}

impl Fault {
    /// The name schedules, counters and the catalogue use: the variant's, in snake_case.
    pub fn name(self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => name,
            other => unreachable!("a unit variant serializes as its name, not {other:?}"),
        }
    }
}

/// The knob of a window in which the broker loses records after their ack (one in five).
pub(super) fn lose_after_ack(k: &mut crate::faults::Knobs, on: bool) {
    k.mq_lose_after_ack = prob(0.2, on);
}

/// The knob of a window in which Redis scripts are re-sent (one in five).
pub(super) fn redis_resend(k: &mut crate::faults::Knobs, on: bool) {
    k.redis_resend = prob(0.2, on);
}

/// The knobs of a window in which requests to Redis and MySQL are delivered late (one in ten).
pub(super) fn delivered_late(k: &mut crate::faults::Knobs, on: bool) {
    k.redis_delivered_late = prob(0.1, on);
    k.ledger_delivered_late = prob(0.1, on);
}

/// The knob of a window in which records become visible past the quiesce (three in ten).
pub(super) fn visible_late(k: &mut crate::faults::Knobs, on: bool) {
    k.mq_visible_late = prob(0.3, on);
}

/// A knob's probability while its window is open, else 0.
pub(super) fn prob(p: f64, on: bool) -> f64 {
    if on {
        p
    } else {
        0.0
    }
}

/// A knob's delay while its window is open, else none.
pub(super) fn delay(ms: u64, on: bool) -> Duration {
    Duration::from_millis(if on { ms } else { 0 })
}

impl Fault {
    /// How long the fault lasts, in ms (a window, a crash's downtime, a pause).
    pub(super) fn hold_range(self) -> std::ops::Range<u64> {
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
            // Long enough for a failed order's user to see the order page and buy again.
            Fault::RedisRestartJobsAway => 500..2_000,
            _ => 30..300,
        }
    }
}

// Unknown commits and crashes weigh double: they are what redeliver records mid-stream.
pub(super) const CONSUMER_FAULTS: &[Fault] = &[
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
pub(super) const PRODUCER_FAULTS: &[Fault] = &[
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
pub(super) const ALL_FAULTS: &[Fault] = &[
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
