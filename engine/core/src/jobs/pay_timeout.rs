//! Payment timeout: created orders unpaid after the activity's `pay_timeout_ms` are cancelled in
//! the ledger (stock back to the bucket there, once per order) and their units released to the
//! reservation's own bucket in Redis (`release.lua` "cancelled", idempotent by reservation id).
//! A release that fails here is retried by the reconciler, which finds cancelled orders whose
//! units are not back yet.

use crate::domain::StockPlan;
use crate::ports::{Ledger, PortResult, ReleaseKind, Released, StockCache};
use futures::StreamExt;

/// Releases in flight at once: a whole sale's unpaid orders fall due together (hundreds), and
/// one round trip after another would hold the jobs loop — recovery and the reconciler wait
/// behind it — for as many round trips; bounded so a large batch does not flood Redis.
const RELEASES_IN_FLIGHT: usize = 32;

/// What one payment-timeout pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PayTimeoutReport {
    /// Orders cancelled in the ledger.
    pub cancelled: u64,
    /// Of those, the ones whose units this pass gave back to Redis.
    pub released: u64,
    /// Releases that failed (Redis down or slow): the reconciler finishes them.
    pub release_failures: u64,
}

/// Cancel what is due at `now_ms`, and give the cancelled orders' units back.
pub async fn cancel_unpaid<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    now_ms: u64,
) -> PortResult<PayTimeoutReport> {
    let cancelled = ledger.cancel_unpaid(plan.activity, now_ms).await?;
    // Owned items: a closure over `&Reservation` makes the stream lifetime-generic, which the
    // jobs role's `Send` future refuses ("FnOnce is not general enough").
    let releases: Vec<PortResult<Released>> = futures::stream::iter(cancelled.iter().cloned())
        .map(|r| async move {
            let r = if crate::planted::on(crate::planted::Bug::CancelReleaseToRoutedBucket) {
                crate::domain::Reservation {
                    bucket: plan.route(r.user),
                    ..r
                }
            } else {
                r
            };
            cache.release(&r, ReleaseKind::Cancelled).await
        })
        .buffer_unordered(RELEASES_IN_FLIGHT)
        .collect()
        .await;
    let mut report = PayTimeoutReport {
        cancelled: cancelled.len() as u64,
        ..Default::default()
    };
    for r in releases {
        match r {
            Ok(Released::Released) => report.released += 1,
            // Back already (the reconciler was quicker), or nothing open to give back.
            Ok(_) => {}
            // The reconciler's: it finds the cancelled order's units not back.
            Err(_) => report.release_failures += 1,
        }
    }
    Ok(report)
}
