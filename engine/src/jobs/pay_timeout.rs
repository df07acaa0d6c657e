//! Payment timeout: created orders unpaid after the activity's `pay_timeout_ms` are cancelled in
//! the ledger (stock back to the bucket there, once per order) and their units released to the
//! reservation's own bucket in Redis (`release.lua` "cancelled", idempotent by reservation id).
//! A release that fails here is retried by the reconciler, which finds cancelled orders whose
//! units are not back yet.

use crate::domain::StockPlan;
use crate::ports::{Ledger, PortResult, ReleaseKind, StockCache};
use futures::StreamExt;

/// Releases in flight at once: a whole sale's unpaid orders fall due together (hundreds), and
/// one round trip after another would hold the jobs loop — recovery and the reconciler wait
/// behind it — for as many round trips; bounded so a large batch does not flood Redis.
const RELEASES_IN_FLIGHT: usize = 32;

/// Cancel what is due at `now_ms`; returns how many orders were cancelled.
pub async fn cancel_unpaid<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    now_ms: u64,
) -> PortResult<u64> {
    let cancelled = ledger.cancel_unpaid(plan.activity, now_ms).await?;
    futures::stream::iter(&cancelled)
        .for_each_concurrent(RELEASES_IN_FLIGHT, |r| async move {
            #[cfg(madsim)]
            let r = &if crate::planted::on(crate::planted::Bug::CancelReleaseToRoutedBucket) {
                crate::domain::Reservation {
                    bucket: plan.route(r.user),
                    ..r.clone()
                }
            } else {
                r.clone()
            };
            // A failed release is the reconciler's: it finds the cancelled order's units not back.
            let _ = cache.release(r, ReleaseKind::Cancelled).await;
        })
        .await;
    Ok(cancelled.len() as u64)
}
