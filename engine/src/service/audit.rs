//! Builds the invariants' `Snapshot` of one activity from what the ports show, and checks it.
//! Shared by `seckill demo`, tests, the simulation and (later) `seckill audit`.

use crate::domain::StockPlan;
use crate::ports::{CacheView, JournalKind, Ledger, LedgerView, PortResult, StockCache};
use seckill_invariants::{self as inv, BucketState, OpenReservation, Order, Snapshot, Violation};

pub async fn snapshot<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
) -> PortResult<Snapshot> {
    let redis = cache.snapshot(plan).await?;
    let db = ledger.snapshot(plan.activity).await?;
    Ok(snapshot_of(&redis, &db, plan))
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
