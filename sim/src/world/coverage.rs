//! Coverage: the interesting states a sweep must have seen, and the ones read from the ledger
//! at the end of a run.

use super::{Scenario, World};
use seckill_core::ports::OrderStatus;
use serde::Serialize;

/// The interesting states a sweep must have seen (`Faults::cover`): each with the scenarios that
/// reach it and how many runs of those a sweep needs before a target that never happened fails
/// it (most are reached in a few runs; the outbox rescue needs a publish cut at the very moment
/// a recovery closes the gates, about one run in twenty of its two scenarios).
/// The interesting states a run counts (`Faults::cover`, "sometimes" assertions): most are
/// targets a sweep must reach (`COVERAGE_TARGETS`); the last few are counted for the trace and
/// the report only. A report names each by its variant, in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    FallbackWon,
    RedeliveryDeduped,
    ReconcilerRepublished,
    CancelReleasedAtTimeout,
    CancelReleaseFinished,
    PendingMarkResolved,
    TransferFinishedByReconciler,
    Recovered,
    RecoveryContended,
    SoldAfterRecovery,
    RecoveryUnderLoad,
    StaleGenerationRefused,
    DuplicateBuyerRefused,
    RewindRetried,
    OutOfStockRefused,
    FailedUserBoughtAgain,
    FailedUserFreedByReconciler,
    OutboxRescued,
    LateRecordAfterBumpKept,
    RerunReserveKept,
    RerunReleaseAbsent,
    RerunSettleAbsent,
    RerunTransferExists,
    RerunRebuildAgain,
    RerunReopenKept,
    RerunFinishKept,
    FinishAfterTakeoverLost,
    BumpFenced,
    BumpWaitedForABatch,
    DeadlockVictimApply,
    DeadlockVictimTransfer,
    DeadlockVictimCancelUnpaid,
    DeadlockVictimSetIntent,
    DeadlockVictimBump,
    FailoverPastQuiesce,
    TakeGatedInRecovery,
    /// A fallback reserve of an attempt the reconciler gave up, answered "voided".
    LateFallbackVoided,
    /// The same, where the attempt's unit was kept.
    LateFallbackVoidKeptUnit,
    /// The reconciler wrote the operator's intent to gates that missed it.
    GatesResyncedByReconciler,
    /// A ledger write other than those with a target of their own rolled back as a deadlock
    /// victim (install, pay, cancel).
    DeadlockVictimOther,
    /// A user whose order page showed the order failed clicked "buy" again.
    ClickedAfterFailedPage,
}

impl Target {
    /// The name reports and sweeps use: the variant's, in snake_case.
    pub fn name(self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => name,
            other => unreachable!("a unit variant serializes as its name, not {other:?}"),
        }
    }
}

pub const COVERAGE_TARGETS: &[(Target, &[Scenario], usize)] = &[
    (Target::FallbackWon, &[Scenario::Calm, Scenario::Chaos], 20),
    (
        Target::RedeliveryDeduped,
        &[Scenario::ConsumerFaults, Scenario::LostRecords],
        20,
    ),
    (
        Target::ReconcilerRepublished,
        &[Scenario::ConsumerFaults, Scenario::LostRecords],
        20,
    ),
    (
        Target::CancelReleasedAtTimeout,
        &[Scenario::Calm, Scenario::RedisLoss],
        20,
    ),
    (
        Target::CancelReleaseFinished,
        &[Scenario::Calm, Scenario::RedisLoss],
        20,
    ),
    (Target::PendingMarkResolved, &[Scenario::Rebalancing], 20),
    (
        Target::TransferFinishedByReconciler,
        &[Scenario::Rebalancing, Scenario::Skewed],
        20,
    ),
    (
        Target::Recovered,
        &[Scenario::RedisLoss, Scenario::FullLossRestart],
        20,
    ),
    (Target::RecoveryContended, &[Scenario::CompetingRecoveries], 20),
    (
        Target::SoldAfterRecovery,
        &[Scenario::RedisLoss, Scenario::FullLossRestart],
        20,
    ),
    (
        Target::RecoveryUnderLoad,
        &[Scenario::Operator, Scenario::Chaos],
        20,
    ),
    (
        Target::StaleGenerationRefused,
        &[Scenario::CompetingRecoveries],
        20,
    ),
    (Target::DuplicateBuyerRefused, &[Scenario::RedisLoss], 20),
    (Target::RewindRetried, &[Scenario::ConsumerFaults], 20),
    (Target::OutOfStockRefused, &[Scenario::RedisLoss], 20),
    (
        Target::FailedUserBoughtAgain,
        &[Scenario::RedisLoss, Scenario::CompetingRecoveries],
        20,
    ),
    (Target::FailedUserFreedByReconciler, &[Scenario::RedisLoss], 20),
    (
        Target::OutboxRescued,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        100,
    ),
    (
        Target::LateRecordAfterBumpKept,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        100,
    ),
    // A script run again after its reply was lost (`RedisResend`) takes its "already done"
    // branch and answers what its first run did.
    (
        Target::RerunReserveKept,
        &[Scenario::ProducerFaults, Scenario::Chaos],
        20,
    ),
    (
        Target::RerunReleaseAbsent,
        &[Scenario::ProducerFaults, Scenario::Chaos],
        100,
    ),
    (
        Target::RerunSettleAbsent,
        &[Scenario::ProducerFaults, Scenario::Chaos],
        20,
    ),
    (Target::RerunTransferExists, &[Scenario::Chaos], 200),
    (
        Target::RerunRebuildAgain,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    (
        Target::RerunReopenKept,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    (
        Target::RerunFinishKept,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // A runner's finish after another runner took its claim over (it stalled between its reopen
    // and its finish past its lease): Redis tells it the claim was lost.
    (
        Target::FinishAfterTakeoverLost,
        &[Scenario::CompetingRecoveries],
        100,
    ),
    // A runner's bump that reached the ledger after another runner's (delivered late, or sent
    // by a runner that stalled past its lease): the compare-and-set refuses it.
    (
        Target::BumpFenced,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // A recovery's bump that waited for a batch holding the generation (`LedgerStalledTxn`).
    (
        Target::BumpWaitedForABatch,
        &[Scenario::Chaos, Scenario::CompetingRecoveries],
        200,
    ),
    // Ledger transactions rolled back as deadlock victims (`LedgerDeadlock`: every attempt the
    // adapter makes), which their callers must run again: a batch, a transfer, a payment
    // timeout's cancels, an operator's intent write, a recovery's bump.
    (
        Target::DeadlockVictimApply,
        &[Scenario::ConsumerFaults, Scenario::Rebalancing],
        20,
    ),
    (Target::DeadlockVictimTransfer, &[Scenario::Rebalancing], 20),
    (
        Target::DeadlockVictimCancelUnpaid,
        &[Scenario::Rebalancing, Scenario::Operator],
        20,
    ),
    (Target::DeadlockVictimSetIntent, &[Scenario::Operator], 300),
    (Target::DeadlockVictimBump, &[Scenario::CompetingRecoveries], 100),
    // A failover to a replica further behind than the recovery's quiesce.
    (
        Target::FailoverPastQuiesce,
        &[Scenario::RedisLoss, Scenario::Chaos],
        100,
    ),
    // A rebalancer's take, planned before a recovery, refused at a bucket's recovering gate
    // (the rebalancer stalled between its look and its take, woken after the recovery's first
    // rebuild): taken, its units would sit in no bucket.
    (
        Target::TakeGatedInRecovery,
        &[Scenario::RedisLoss, Scenario::Operator, Scenario::JobsAway],
        100,
    ),
];

impl World {
    /// Coverage: a record a slow follower held back became visible after a recovery bumped the
    /// generation (it arrived before the bump), and its order stands — rescued into the ledger
    /// before the bump, the late record a redelivery.
    pub(super) fn cover_late_records(&self, db: &seckill_core::ports::LedgerView) {
        let late = self.kafka.visible_late.lock().expect("kafka").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        for o in db.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
            let Some((arrived, visible)) = late.get(&o.reservation.id.to_string()) else {
                continue;
            };
            if bumps.iter().any(|b| arrived < b && b < visible) {
                self.faults.cover(Target::LateRecordAfterBumpKept);
            }
        }
    }
}
