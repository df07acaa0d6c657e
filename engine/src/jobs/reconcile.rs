//! The reconciler: one pass over an activity, comparing Redis with the ledger bucket by bucket.
//!
//! - an open reservation the ledger already holds → settle it;
//! - an open reservation the ledger lacks, older than the grace period → republish it (the
//!   ledger dedupes by reservation id, so a republish of something in flight is harmless);
//! - a pending-fallback mark older than the grace period → keep it if its attempt holds a unit
//!   (open in some bucket, or an order), else clear it;
//! - a cancelled order whose units are not back in Redis → release it (idempotent);
//! - a transfer taken but not acknowledged → finish it (ledger transfer, give, ack; idempotent);
//! - what remains of `redis stock + open + sold − transfers in + out − initial` after the above is
//!   explained is reported as a `Difference` — never "fixed" by guessing.
//!
//! It leaves an activity alone while Redis has lost it (no meta, a missing stock key or gate) or
//! a recovery is under way (a claim, a recovering gate): that is the recovery job's.

use crate::domain::{ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId};
use crate::ports::{Ledger, OrderBus, PortResult, ReleaseKind, StockCache, Transfer};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Actions of one pass in flight at once. After a fault a pass may meet thousands of stale
/// pending marks or open reservations (a standard-size sale under a slow Redis left 5,000); one
/// round trip after another took a pass over a minute, with recovery and the payment timeout
/// waiting behind it. Every action is idempotent and independent of the others, so their order
/// does not matter; the bound keeps one pass from flooding Redis or the bus.
const ACTIONS_IN_FLIGHT: usize = 32;

/// One thing a pass does to one reservation, mark or transfer. Owned (a few clones per pass):
/// a borrowed one makes the pass's future lifetime-generic, which `tokio::spawn` refuses.
enum Action {
    Settle(Reservation),
    Republish(Reservation),
    Resolve { user: UserId, keep: bool },
    Finish(Transfer),
    ReleaseCancelled(Reservation),
}

#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// An open reservation the ledger lacks is republished once it is this old (longer than a
    /// publish plus a consumer batch normally take).
    pub republish_after_ms: u64,
    /// A pending-fallback mark is resolved once it is this old (longer than a fallback attempt
    /// can take with its timeouts).
    pub pending_after_ms: u64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            republish_after_ms: 2_000,
            pending_after_ms: 2_000,
        }
    }
}

/// A difference between Redis and the ledger that the reconciler cannot explain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    pub activity: ActivityId,
    pub bucket: BucketNo,
    /// Units Redis accounts for beyond the ledger (negative: fewer).
    pub units: i64,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "activity {} bucket {}: redis and ledger differ by {:+} units",
            self.activity, self.bucket, self.units
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// The pass did nothing: Redis lost the activity or it is recovering.
    pub skipped: bool,
    pub settled: u64,
    pub republished: u64,
    pub pending_kept: u64,
    pub pending_cleared: u64,
    pub cancels_released: u64,
    /// Half-done transfers completed.
    pub transfers_finished: u64,
    /// Actions that failed (retried next pass).
    pub failed: u64,
    /// Reservations open in Redis when the pass read it (a gauge for operators).
    pub open: u64,
    pub differences: Vec<Difference>,
}

pub async fn reconcile<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    now_ms: u64,
    cfg: &ReconcileConfig,
) -> PortResult<ReconcileReport> {
    let mut report = ReconcileReport::default();
    // Redis first, then the ledger: the consumer writes the ledger before it settles Redis, so
    // anything Redis shows closed is already in the later ledger read (no false difference).
    #[cfg(madsim)]
    let resets_stock = crate::planted::on(crate::planted::Bug::ReconcilerResetsStock);
    #[cfg(madsim)]
    let early_ledger = match resets_stock {
        true => Some(ledger.snapshot(plan.activity).await?),
        false => None,
    };
    // The buyer sets are not needed here (the planted bug rebuilds buckets from them).
    #[cfg(madsim)]
    let view = match resets_stock {
        true => cache.snapshot(plan).await?,
        false => cache.summary(plan).await?,
    };
    #[cfg(not(madsim))]
    let view = cache.summary(plan).await?;
    let lost_or_recovering = view.buckets.iter().any(|b| {
        b.stock.is_none()
            || b.gate
                .as_ref()
                .is_none_or(|g| g.state == ActivityState::Recovering)
    });
    if lost_or_recovering || view.meta.as_ref().is_none_or(|m| m.claim.is_some()) {
        report.skipped = true;
        return Ok(report);
    }
    let open_anywhere: BTreeSet<ReservationId> = view
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(|r| r.id))
        .collect();
    // Of the ledger, only what this pass acts on (a finished sale has many orders; Redis still
    // mentions few): units sold per bucket, the cancelled orders, and which of the reservations
    // Redis shows open or pending the ledger holds.
    let mentioned: BTreeSet<ReservationId> = view
        .buckets
        .iter()
        .flat_map(|b| b.pending.iter().map(|p| p.reservation))
        .chain(open_anywhere.iter().copied())
        .collect();
    let db = ledger.reconcile_view(plan.activity, &mentioned).await?;
    #[cfg(madsim)]
    let db = early_ledger.map_or(db, |early| {
        crate::ports::ReconcileView::of(&early.orders, &mentioned)
    });
    let held = &db.held;
    let mut cancelled_in: BTreeMap<BucketNo, Vec<&Reservation>> = BTreeMap::new();
    for r in &db.cancelled {
        cancelled_in.entry(r.bucket).or_default().push(r);
    }
    let mut actions: Vec<Action> = Vec::new();
    report.open = view.buckets.iter().map(|b| b.open.len() as u64).sum();
    for b in &view.buckets {
        let stock = b.stock.unwrap_or(0);
        let mut open_unordered = 0i64;
        for r in &b.open {
            if held.contains(&r.id) {
                actions.push(Action::Settle(r.clone()));
                continue;
            }
            open_unordered += r.qty as i64;
            if now_ms >= r.reserved_at_ms.saturating_add(cfg.republish_after_ms) {
                #[cfg(madsim)]
                let r = &if crate::planted::on(crate::planted::Bug::RepublishWithFreshId) {
                    crate::domain::Reservation {
                        id: ReservationId(r.id.0 ^ (now_ms as u128) << 64),
                        ..r.clone()
                    }
                } else {
                    r.clone()
                };
                actions.push(Action::Republish(r.clone()));
            }
        }
        for p in b
            .pending
            .iter()
            .filter(|p| now_ms >= p.since_ms.saturating_add(cfg.pending_after_ms))
        {
            let keep = open_anywhere.contains(&p.reservation) || held.contains(&p.reservation);
            actions.push(Action::Resolve { user: p.user, keep });
        }
        actions.extend(b.transfers_in_flight.iter().cloned().map(Action::Finish));
        let released: BTreeSet<ReservationId> = b.cancelled_released.iter().copied().collect();
        let sold = db.sold.get(&b.bucket).copied().unwrap_or(0) as i64;
        let mut cancel_in_flight = 0i64;
        for r in cancelled_in.get(&b.bucket).into_iter().flatten() {
            // Units the ledger took back but Redis has not yet: this pass gives them back.
            if !released.contains(&r.id) && !open_anywhere.contains(&r.id) {
                cancel_in_flight += r.qty as i64;
                actions.push(Action::ReleaseCancelled((*r).clone()));
            }
        }
        let units = stock + open_unordered + sold + cancel_in_flight - b.transfers_in as i64
            + b.transfers_out as i64
            - plan.initial(b.bucket) as i64;
        #[cfg(madsim)]
        if units != 0 && crate::planted::on(crate::planted::Bug::ReconcilerResetsStock) {
            planted_reset(cache, plan, b, (stock - units).max(0) as u64, &db).await;
        }
        if units != 0 {
            report.differences.push(Difference {
                activity: plan.activity,
                bucket: b.bucket,
                units,
            });
        }
    }

    let mut results = futures::stream::iter(actions)
        .map(|action| async move {
            let done = match &action {
                Action::Settle(r) => cache.settle(r).await,
                // Adopted first: the purchase that failed to publish it can no longer give it
                // back (it answers "queued" instead), so a republished order is never one the
                // user was told did not happen.
                Action::Republish(r) => match cache.adopt(r).await {
                    Ok(true) => bus.publish(r).await.map(|()| true),
                    other => other,
                },
                Action::Resolve { user, keep } => {
                    cache.resolve_pending(plan, *user, *keep).await.map(|()| true)
                }
                Action::Finish(t) => super::rebalance::finish(cache, ledger, plan, t)
                    .await
                    .map(|()| true),
                Action::ReleaseCancelled(r) => cache
                    .release(r, ReleaseKind::Cancelled)
                    .await
                    .map(|x| x.is_released()),
            };
            (action, done)
        })
        .buffer_unordered(ACTIONS_IN_FLIGHT);
    while let Some((action, done)) = results.next().await {
        let count = match action {
            Action::Settle(_) => &mut report.settled,
            Action::Republish(_) => &mut report.republished,
            Action::Resolve { keep: true, .. } => &mut report.pending_kept,
            Action::Resolve { keep: false, .. } => &mut report.pending_cleared,
            Action::Finish(_) => &mut report.transfers_finished,
            Action::ReleaseCancelled(_) => &mut report.cancels_released,
        };
        match done {
            Ok(true) => *count += 1,
            Ok(false) => {}
            Err(_) => report.failed += 1,
        }
    }
    Ok(report)
}

/// Planted `ReconcilerResetsStock`: "fix" a difference by rebuilding the bucket at the stock that
/// would hide it (through the recovery's own scripts, under a fence of its own).
#[cfg(madsim)]
async fn planted_reset<C: StockCache>(
    cache: &C,
    plan: &StockPlan,
    b: &crate::ports::CacheBucket,
    stock: u64,
    db: &crate::ports::ReconcileView,
) {
    const FENCE: &str = "planted";
    let Some(gate) = b.gate.clone() else { return };
    let side = |units: u64, from: BucketNo, to: BucketNo| {
        (units > 0).then(|| Transfer {
            id: format!("planted{}", to.0),
            from,
            to,
            units,
        })
    };
    let image = crate::ports::BucketImage {
        stock,
        buyers: b.buyers.clone(),
        held: b.open.iter().map(|r| r.id).collect(),
        cancelled_released: b
            .cancelled_released
            .iter()
            .filter_map(|id| db.cancelled.iter().find(|r| r.id == *id).map(|r| (*id, r.qty)))
            .collect(),
        transfers_out: side(b.transfers_out, b.bucket, BucketNo(u32::MAX))
            .into_iter()
            .collect(),
        transfers_in: side(b.transfers_in, BucketNo(u32::MAX), b.bucket)
            .into_iter()
            .collect(),
    };
    let intent = crate::ports::Intent {
        state: gate.intent,
        version: gate.version,
        generation: gate.generation,
    };
    if cache.close_gates(plan, FENCE).await.is_ok() {
        let _ = cache.rebuild(plan, b.bucket, FENCE, &image).await;
        for bucket in plan.all_buckets() {
            let _ = cache.reopen(plan, bucket, FENCE, &intent).await;
        }
    }
}
