//! Coverage: the interesting states a sweep must have seen, and the ones read from the ledger
//! at the end of a run.

use super::{Scenario, World};
use seckill_engine::ports::OrderStatus;

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

impl World {
    /// Coverage: a record a slow follower held back became visible after a recovery bumped the
    /// generation (it arrived before the bump), and its order stands — rescued into the ledger
    /// before the bump, the late record a redelivery.
    pub(super) fn cover_late_records(&self, db: &seckill_engine::ports::LedgerView) {
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
}
