//! Builds the invariants' `Snapshot` of one activity from what the ports show, and checks it.
//! Shared by `seckill demo`, tests, the simulation and (later) `seckill audit`.

use crate::domain::{ReservationId, StockPlan};
use crate::ports::{
    CacheView, JournalKind, Ledger, LedgerView, OrderBus, OrderStatus, PortResult, StockCache,
};
use crate::service::consumer::ORDER_GROUP;
use seckill_invariants::{self as inv, BucketState, OpenReservation, Order, Snapshot, Violation};
use std::collections::BTreeSet;

pub async fn snapshot<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
) -> PortResult<Snapshot> {
    let redis = cache.snapshot(plan).await?;
    let db = ledger.snapshot(plan.activity).await?;
    Ok(snapshot_of(&redis, &db, plan))
}

/// An audit of the live stores (`seckill audit`, the admin route): S1–S3 always, R1 only at rest.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Audit {
    #[serde(skip)]
    pub snapshot: Snapshot,
    /// Records of the order topic the consumer group has not applied yet.
    pub consumer_lag: u64,
    /// Transfers taken from a bucket and not yet given to the other (the reconciler finishes them).
    pub transfers_in_flight: usize,
    /// Cancelled orders whose units the ledger took back and Redis has not yet.
    pub cancels_in_flight: usize,
    /// Reservations still in the outbox (R1 counts them; not yet "at rest").
    pub open_reservations: usize,
    /// R1 was checked: no lag, no transfer and no cancel half-way (either store is ahead then).
    pub r1_checked: bool,
    #[serde(skip)]
    pub violations: Vec<Violation>,
}

impl Audit {
    pub fn verdict(&self) -> String {
        inv::verdict(&self.violations)
    }
}

pub async fn audit<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
) -> PortResult<Audit> {
    let consumer_lag = bus.lag(ORDER_GROUP).await?;
    let redis = cache.snapshot(plan).await?;
    let db = ledger.snapshot(plan.activity).await?;
    let open: BTreeSet<ReservationId> = redis
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(|r| r.id))
        .collect();
    let released: BTreeSet<ReservationId> = redis
        .buckets
        .iter()
        .flat_map(|b| b.cancelled_released.iter().copied())
        .collect();
    let cancels_in_flight = db
        .orders
        .iter()
        .filter(|o| o.status == OrderStatus::Cancelled)
        .filter(|o| !released.contains(&o.reservation.id) && !open.contains(&o.reservation.id))
        .count();
    let transfers_in_flight = redis.buckets.iter().map(|b| b.transfers_in_flight.len()).sum();
    let snapshot = snapshot_of(&redis, &db, plan);
    let r1_checked = consumer_lag == 0 && transfers_in_flight == 0 && cancels_in_flight == 0;
    Ok(Audit {
        violations: check(&snapshot, r1_checked),
        snapshot,
        consumer_lag,
        transfers_in_flight,
        cancels_in_flight,
        open_reservations: open.len(),
        r1_checked,
    })
}

/// The snapshot of what Redis and the ledger showed (read however the caller could: through
/// the ports, or raw as the simulation's checker does).
pub fn snapshot_of(redis: &CacheView, db: &LedgerView, plan: &StockPlan) -> Snapshot {
    let mut journal = vec![0i64; plan.units.len()];
    let mut transfers = vec![0i64; plan.units.len()];
    for j in &db.journal {
        if let Some(sum) = journal.get_mut(j.bucket.0 as usize) {
            *sum += j.delta;
        }
        if j.kind == JournalKind::Transfer {
            if let Some(net) = transfers.get_mut(j.bucket.0 as usize) {
                *net += j.delta;
            }
        }
    }
    let buckets = redis
        .buckets
        .iter()
        .map(|b| {
            let row = db.buckets.iter().find(|r| r.bucket == b.bucket);
            BucketState {
                bucket: b.bucket.0,
                initial: plan.initial(b.bucket),
                redis_stock: b.stock,
                open: b
                    .open
                    .iter()
                    .map(|r| OpenReservation {
                        reservation: r.id.to_string(),
                        user: r.user.0,
                        qty: r.qty as u64,
                        own_bucket: plan.route(r.user).0,
                    })
                    .collect(),
                buyers: b.buyers.iter().map(|u| u.0).collect(),
                pending: b.pending.iter().map(|p| p.user.0).collect(),
                released_cancels: b.cancelled_released.iter().map(|id| id.to_string()).collect(),
                transfers_in: b.transfers_in,
                transfers_out: b.transfers_out,
                ledger_initial: row.map(|r| r.initial),
                ledger_remaining: row.map(|r| r.remaining),
                journal_delta: journal.get(b.bucket.0 as usize).copied().unwrap_or(0),
                ledger_transfers_net: transfers.get(b.bucket.0 as usize).copied().unwrap_or(0),
            }
        })
        .collect();
    let orders = db
        .orders
        .iter()
        .map(|o| Order {
            reservation: o.reservation.id.to_string(),
            user: o.reservation.user.0,
            bucket: o.reservation.bucket.0,
            own_bucket: plan.route(o.reservation.user).0,
            qty: o.reservation.qty as u64,
            status: o.status,
        })
        .collect();
    Snapshot {
        activity: plan.activity.0,
        total_stock: plan.total_stock,
        buckets,
        orders,
    }
}

/// Safety (S1–S3) always, plus R1 when the system is quiescent.
pub fn check(s: &Snapshot, quiescent: bool) -> Vec<Violation> {
    let mut v = inv::check_safety(s);
    if quiescent {
        v.extend(inv::r1_reconciled(s));
    }
    v
}
