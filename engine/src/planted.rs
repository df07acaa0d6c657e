//! Planted bugs: small, named variants of real code, compiled only for the simulation
//! (`cfg(madsim)`), each switched on by name. They exist to prove that the simulation's checkers
//! can fail: a run with a bug planted must be caught within a few seeds, and the same seeds must
//! pass without it. Each call site is one `#[cfg(madsim)]` block beside the code it breaks.

use serde::{Deserialize, Serialize};
use std::cell::Cell;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bug {
    /// Reserve reads the stock, then decrements it in a second call from Rust.
    NonAtomicReserve,
    /// The consumer commits offsets before the ledger applies the batch.
    AckBeforeCommit,
    /// A release goes to `route(user)` instead of the reservation's own bucket.
    ReleaseToRoutedBucket,
    /// An empty own bucket falls back without leaving the pending-fallback mark.
    FallbackWithoutPendingMark,
    /// The consumer treats a redelivered order as a duplicate buyer and releases its unit.
    RedeliveredAsDuplicate,
    /// The engine releases the units when a publish's outcome is unknown.
    ReleaseOnIndeterminatePublish,
    /// The ledger has no UNIQUE(activity_id, user_id).
    NoBuyerUniqueKey,
    /// The ledger's stock update lacks `remaining >= qty`.
    NoStockGuard,
    /// The payment timeout releases a cancelled unit to `route(user)`, not its own bucket.
    CancelReleaseToRoutedBucket,
    /// Recovery rebuilds Redis from the ledger at once: no quiesce, no waiting for the topic to drain.
    RebuildWhileInFlight,
    /// The reconciler republishes an open reservation under a fresh id (the ledger cannot dedupe).
    RepublishWithFreshId,
    /// A rebalancing `give` is not idempotent: finishing a transfer twice gives its units twice.
    NonIdempotentGive,
    /// The reconciler reads the ledger before Redis (so a pass that races the consumer sees a
    /// difference that is not one) and "fixes" differences by resetting the bucket's Redis stock.
    ReconcilerResetsStock,
}

impl Bug {
    pub const ALL: [Bug; 13] = [
        Bug::NonAtomicReserve,
        Bug::AckBeforeCommit,
        Bug::ReleaseToRoutedBucket,
        Bug::FallbackWithoutPendingMark,
        Bug::RedeliveredAsDuplicate,
        Bug::ReleaseOnIndeterminatePublish,
        Bug::NoBuyerUniqueKey,
        Bug::NoStockGuard,
        Bug::CancelReleaseToRoutedBucket,
        Bug::RebuildWhileInFlight,
        Bug::RepublishWithFreshId,
        Bug::NonIdempotentGive,
        Bug::ReconcilerResetsStock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::NonAtomicReserve => "non_atomic_reserve",
            Bug::AckBeforeCommit => "ack_before_commit",
            Bug::ReleaseToRoutedBucket => "release_to_routed_bucket",
            Bug::FallbackWithoutPendingMark => "fallback_without_pending_mark",
            Bug::RedeliveredAsDuplicate => "redelivered_as_duplicate",
            Bug::ReleaseOnIndeterminatePublish => "release_on_indeterminate_publish",
            Bug::NoBuyerUniqueKey => "no_buyer_unique_key",
            Bug::NoStockGuard => "no_stock_guard",
            Bug::CancelReleaseToRoutedBucket => "cancel_release_to_routed_bucket",
            Bug::RebuildWhileInFlight => "rebuild_while_in_flight",
            Bug::RepublishWithFreshId => "republish_with_fresh_id",
            Bug::NonIdempotentGive => "non_idempotent_give",
            Bug::ReconcilerResetsStock => "reconciler_resets_stock",
        }
    }

    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

thread_local! {
    /// The planted set, one bit per bug. Per thread: a madsim runtime runs every simulated node
    /// on the thread that drives it, so this reaches all of them — and test threads running
    /// other seeds in parallel are not affected.
    static PLANTED: Cell<u32> = const { Cell::new(0) };
}

/// Plant exactly `bug` (or none) for runs on this thread.
pub fn plant(bug: Option<Bug>) {
    PLANTED.with(|p| p.set(bug.map_or(0, |b| 1 << b as u32)));
}

pub fn on(bug: Bug) -> bool {
    PLANTED.with(|p| p.get()) & (1 << bug as u32) != 0
}
