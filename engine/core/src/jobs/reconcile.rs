//! The reconciler: one pass over an activity, comparing Redis with the ledger bucket by bucket.
//!
//! - an open reservation the ledger already holds → settle it, or free its user where the ledger
//!   failed it (DESIGN §6: no units back, the buyer mark goes);
//! - an open reservation the ledger lacks, older than the grace period → republish it (the
//!   ledger dedupes by reservation id, so a republish of something in flight is harmless);
//! - a pending-fallback mark older than the grace period → give its attempt up: in one script on
//!   the fallback bucket, leave it to its purchase if the attempt's unit is still open there,
//!   keep the mark if the user holds a unit there (an order's), else void the attempt's id (a
//!   reserve of it still queued in Redis then takes nothing) and clear the mark;
//! - a cancelled order whose units are not back in Redis → release it (idempotent);
//! - a transfer taken but not acknowledged → finish it (ledger transfer, give, ack; idempotent);
//! - a gate holding an older intent than the registry's → write the registry's intent again;
//! - what remains of `redis stock + open + sold − transfers in + out − initial` after the above is
//!   explained is reported as a `Difference` — never "fixed" by guessing.
//!
//! It leaves an activity alone while Redis has lost it (no meta, a missing stock key or gate) or
//! a recovery is under way (a claim, a recovering gate): that is the recovery job's.

use crate::domain::{ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId};
use crate::ports::{
    CacheBucket, GateWrite, GaveUp, Ledger, OrderBus, PortResult, ReleaseKind, StockCache, Transfer,
};
use futures::StreamExt;
use std::collections::BTreeSet;
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
    FreeFailed(Reservation),
    Republish(Reservation),
    /// An old pending-fallback mark: give its attempt up (`outcome`, known once done).
    GiveUp {
        user: UserId,
        attempt: ReservationId,
        outcome: Option<GaveUp>,
    },
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
    /// Failed orders whose users this pass freed (their consumer's follow-up did not happen).
    pub failed_freed: u64,
    pub republished: u64,
    pub pending_kept: u64,
    pub pending_cleared: u64,
    pub cancels_released: u64,
    /// Half-done transfers completed.
    pub transfers_finished: u64,
    /// Gates written again with the registry's intent, which they had missed.
    pub gates_resynced: u64,
    /// Actions that failed (retried next pass).
    pub failed: u64,
    /// Reservations open in Redis when the pass read it (a gauge for operators).
    pub open: u64,
    /// Units Redis had left to sell when the pass read it, over all buckets (a gauge).
    pub stock: u64,
    pub differences: Vec<Difference>,
}

/// Reads of both stores that must agree before a difference is reported. The stores are read
/// one after the other while the sale goes on: an order reserved after the Redis read and
/// written before the ledger read shows as a unit too many, and the alert on the metric would
/// flap during every busy sale. A real difference reads the same every time.
const CONFIRMING_READS: usize = 3;

/// One read of both stores: Redis, then the ledger.
struct Read {
    view: crate::ports::CacheView,
    db: crate::ports::ReconcileView,
    open_anywhere: BTreeSet<ReservationId>,
}

/// Redis first, then the ledger: the consumer writes the ledger before it settles Redis, so
/// anything Redis shows closed is already in the later ledger read. `None` while Redis has lost
/// the activity or it is recovering.
async fn read<C: StockCache, L: Ledger>(cache: &C, ledger: &L, plan: &StockPlan) -> PortResult<Option<Read>> {
    let resets_stock = crate::planted::on(crate::planted::Bug::ReconcilerResetsStock);
    let early_ledger = match resets_stock {
        true => Some(ledger.snapshot(plan.activity).await?),
        false => None,
    };
    // The buyer sets are not needed here (the planted bug rebuilds buckets from them).
    let view = match resets_stock {
        true => cache.snapshot(plan).await?,
        false => cache.summary(plan).await?,
    };
    let lost_or_recovering = view.buckets.iter().any(|b| {
        b.stock.is_none()
            || b.gate
                .as_ref()
                .is_none_or(|g| g.state == ActivityState::Recovering)
    });
    if lost_or_recovering || view.meta.as_ref().is_none_or(|m| m.claim.is_some()) {
        return Ok(None);
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
    let db = early_ledger.map_or(db, |early| {
        crate::ports::ReconcileView::of(&early.orders, &mentioned)
    });
    Ok(Some(Read {
        view,
        db,
        open_anywhere,
    }))
}

impl Read {
    /// A cancelled order of bucket `b` whose units the ledger took back and Redis has not yet.
    fn cancels_in_flight<'a>(&'a self, b: &'a CacheBucket) -> impl Iterator<Item = &'a Reservation> {
        let released: BTreeSet<ReservationId> = b.cancelled_released.iter().copied().collect();
        self.db.cancelled.iter().filter(move |r| {
            r.bucket == b.bucket && !released.contains(&r.id) && !self.open_anywhere.contains(&r.id)
        })
    }

    /// `redis stock + open the ledger lacks + sold + cancels not yet given back − transfers in +
    /// transfers out − initial`: 0 when the two stores agree on bucket `b`.
    fn units_off(&self, b: &CacheBucket, plan: &StockPlan) -> i64 {
        let open_unordered: u64 = b
            .open
            .iter()
            .filter(|r| !self.db.held.contains(&r.id))
            .map(|r| r.qty as u64)
            .sum();
        let cancel_in_flight: u64 = self.cancels_in_flight(b).map(|r| r.qty as u64).sum();
        let sold = self.db.sold.get(&b.bucket).copied().unwrap_or(0);
        b.stock.unwrap_or(0) + (open_unordered + sold + cancel_in_flight + b.transfers_out) as i64
            - (b.transfers_in + plan.initial(b.bucket)) as i64
    }

    fn differences(&self, plan: &StockPlan) -> Vec<Difference> {
        self.view
            .buckets
            .iter()
            .map(|b| Difference {
                activity: plan.activity,
                bucket: b.bucket,
                units: self.units_off(b, plan),
            })
            .filter(|d| d.units != 0)
            .collect()
    }
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
    let Some(first) = read(cache, ledger, plan).await? else {
        report.skipped = true;
        return Ok(report);
    };
    let (view, held) = (&first.view, &first.db.held);
    let mut actions: Vec<Action> = Vec::new();
    report.open = view.buckets.iter().map(|b| b.open.len() as u64).sum();
    report.stock = view
        .buckets
        .iter()
        .map(|b| b.stock.unwrap_or(0).max(0) as u64)
        .sum();
    for b in &view.buckets {
        for r in &b.open {
            if first.db.failed.contains(&r.id) {
                actions.push(Action::FreeFailed(r.clone()));
                continue;
            }
            if held.contains(&r.id) {
                actions.push(Action::Settle(r.clone()));
                continue;
            }
            if now_ms >= r.reserved_at_ms.saturating_add(cfg.republish_after_ms) {
                let r = if crate::planted::on(crate::planted::Bug::RepublishWithFreshId) {
                    crate::domain::Reservation {
                        id: ReservationId(r.id.0 ^ (now_ms as u128) << 64),
                        ..r.clone()
                    }
                } else {
                    r.clone()
                };
                actions.push(Action::Republish(r));
            }
        }
        for p in b
            .pending
            .iter()
            .filter(|p| now_ms >= p.since_ms.saturating_add(cfg.pending_after_ms))
        {
            // Whether the attempt won is decided in Redis, atomically with the void: a decision
            // from this pass's snapshot would miss a fallback reserve that lands after it.
            actions.push(Action::GiveUp {
                user: p.user,
                attempt: p.reservation,
                outcome: None,
            });
        }
        actions.extend(b.transfers_in_flight.iter().cloned().map(Action::Finish));
        // Units the ledger took back but Redis has not yet: this pass gives them back.
        actions.extend(first.cancels_in_flight(b).cloned().map(Action::ReleaseCancelled));
        if crate::planted::on(crate::planted::Bug::ReconcilerResetsStock) {
            let units = first.units_off(b, plan);
            if units != 0 {
                planted_reset(
                    cache,
                    plan,
                    b,
                    (b.stock.unwrap_or(0) - units).max(0) as u64,
                    &first.db,
                )
                .await;
            }
        }
    }
    report.differences = first.differences(plan);
    for _ in 1..CONFIRMING_READS {
        if report.differences.is_empty() {
            break;
        }
        let again = match read(cache, ledger, plan).await? {
            Some(r) => r.differences(plan),
            None => Vec::new(),
        };
        report.differences.retain(|d| again.contains(d));
    }

    // Fault point: a pass stalled between its read and its actions (what it read may have
    // moved on: a purchase released or the consumer settled what it is about to adopt).
    crate::planted::stall(4, std::time::Duration::from_millis(1_500)).await;
    let mut results = futures::stream::iter(actions)
        .map(|mut action| async move {
            let done = match &mut action {
                Action::Settle(r) => cache.settle(r).await,
                Action::FreeFailed(r) => crate::service::consumer::free_failed(cache, plan, r)
                    .await
                    .map(|_| true),
                // Adopted first: the purchase that failed to publish it can no longer give it
                // back (it answers "queued" instead), so a republished order is never one the
                // user was told did not happen.
                Action::Republish(r) => match cache.adopt(r).await {
                    Ok(true) => bus.publish(r).await.map(|()| true),
                    other => other,
                },
                Action::GiveUp {
                    user,
                    attempt,
                    outcome,
                } => cache.give_up_pending(plan, *user, *attempt).await.map(|o| {
                    *outcome = Some(o);
                    o != GaveUp::InFlight
                }),
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
            Action::FreeFailed(_) => &mut report.failed_freed,
            Action::Republish(_) => &mut report.republished,
            Action::GiveUp {
                outcome: Some(GaveUp::Kept),
                ..
            } => &mut report.pending_kept,
            Action::GiveUp { .. } => &mut report.pending_cleared,
            Action::Finish(_) => &mut report.transfers_finished,
            Action::ReleaseCancelled(_) => &mut report.cancels_released,
        };
        match done {
            Ok(true) => *count += 1,
            Ok(false) => {}
            Err(_) => report.failed += 1,
        }
    }

    // The operator's intent on every gate (the registry owns it, the gates enforce it): an
    // intent write that found a gate missing (a warmup creating the gates at the intent it had
    // read, just after a pause) or that failed half-way is written again. gate.lua keeps a
    // newer intent, and records this one on a recovering gate for its reopen.
    let behind = |version: u64| {
        (first.view.buckets.iter()).any(|b| b.gate.as_ref().is_some_and(|g| g.version < version))
    };
    match ledger.registry(plan.activity).await {
        Ok(Some(reg)) if behind(reg.intent.version) => match cache.set_gates(plan, &reg.intent).await {
            Ok(writes) => {
                report.gates_resynced = writes
                    .iter()
                    .filter(|w| matches!(w, GateWrite::Applied | GateWrite::Recorded))
                    .count() as u64
            }
            Err(_) => report.failed += 1,
        },
        Ok(_) => {}
        Err(_) => report.failed += 1,
    }
    Ok(report)
}

/// Planted `ReconcilerResetsStock`: "fix" a difference by rebuilding the bucket at the stock that
/// would hide it (through the recovery's own scripts, under a fence of its own).
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
            generation: gate.generation,
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
    if cache.close_gates(plan, FENCE, u64::MAX).await.is_ok() {
        let _ = cache.rebuild(plan, b.bucket, FENCE, &image).await;
        for bucket in plan.all_buckets() {
            let _ = cache.reopen(plan, bucket, FENCE, &intent).await;
        }
    }
}
