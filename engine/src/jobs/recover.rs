//! Recovery after Redis lost data (DESIGN §7): a restart without persistence, or with the last
//! AOF window lost — where Redis comes back with stale, too-high stock and forgotten buyer marks.
//!
//! Detection: `sk:{A}:meta` records the Redis run id it was written under (its epoch). No meta,
//! or an epoch that is not the server's current run id, means Redis restarted since the last
//! warmup or rebuild. Then: state `recovering` (purchases answer Unavailable), wait for the
//! engines to notice and for publishes in flight to land, wait until the consumers have drained
//! the topic, rebuild every bucket from the ledger (remaining stock, buyer marks, nothing open),
//! and reopen with the current epoch. Never rebuild while messages are in flight: an order the
//! ledger has not applied yet would be sold again.

use crate::domain::{ActivityState, StockPlan, UserId};
use crate::ports::{
    BucketImage, JournalKind, Ledger, OrderBus, OrderStatus, PortError, PortResult, StockCache,
};
use std::collections::BTreeSet;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// After setting `recovering`: long enough for every engine to refresh its activity state
    /// and for a publish already under way to finish (or time out).
    pub quiesce: Duration,
    /// Give up (and retry on the next pass) if the topic's lag has not fallen for this long. A
    /// slow drain is waited out: a backlog of a whole sale takes the consumers a while, and
    /// giving up on it would start the wait over (and the quiesce with it) without end.
    pub drain_timeout: Duration,
    /// The consumer group whose lag must reach zero.
    pub group: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub epoch: String,
    pub buckets: u32,
    pub buyers: u64,
    pub stock: u64,
}

/// Wait until the consumer group has committed everything on the order topic; fail only if the
/// lag stops falling for `drain_timeout` (measured on the tokio clock, lag calls included).
async fn drain<B: OrderBus>(bus: &B, cfg: &RecoveryConfig) -> PortResult<()> {
    let step = Duration::from_millis(50);
    let mut lowest = u64::MAX;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let lag = bus.lag(&cfg.group).await?;
        if lag == 0 {
            return Ok(());
        }
        if lag < lowest {
            lowest = lag;
            progress_at = tokio::time::Instant::now();
        } else if progress_at.elapsed() >= cfg.drain_timeout {
            return Err(PortError::determinate(
                "recover",
                format!(
                    "the order topic did not drain: {lag} records, no progress for {} ms",
                    cfg.drain_timeout.as_millis()
                ),
            ));
        }
        tokio::time::sleep(step).await;
    }
}

pub async fn recover_if_needed<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
) -> PortResult<Option<RecoveryReport>> {
    let epoch = cache.epoch().await?;
    let meta = cache.meta(plan.activity).await?;
    let fresh = meta
        .as_ref()
        .is_some_and(|m| m.epoch.as_deref() == Some(epoch.as_str()) && m.state != ActivityState::Recovering);
    if fresh {
        return Ok(None);
    }
    // A paused or closed activity stays so after the rebuild.
    let reopen = match meta.as_ref().map(|m| m.state) {
        Some(s @ (ActivityState::Paused | ActivityState::Closed)) => s,
        _ => ActivityState::Open,
    };
    cache.set_state(plan, ActivityState::Recovering, None).await?;
    #[cfg(madsim)]
    let in_flight_ok = crate::planted::on(crate::planted::Bug::RebuildWhileInFlight);
    #[cfg(not(madsim))]
    let in_flight_ok = false;
    if !in_flight_ok {
        tokio::time::sleep(cfg.quiesce).await;
    }

    if !in_flight_ok {
        drain(bus, cfg).await?;
    }

    let db = ledger.snapshot(plan.activity).await?;
    let mut report = RecoveryReport {
        epoch: epoch.clone(),
        buckets: plan.units.len() as u32,
        buyers: 0,
        stock: 0,
    };
    for row in &db.buckets {
        let b = row.bucket;
        let mut buyers: BTreeSet<UserId> = BTreeSet::new();
        let mut image = BucketImage {
            stock: row.remaining.max(0) as u64,
            ..Default::default()
        };
        for o in &db.orders {
            let r = &o.reservation;
            // Every order keeps its user out (the ledger's unique key holds for all statuses):
            // marked in its own bucket, and in the bucket its unit came from.
            if plan.route(r.user) == b || r.bucket == b {
                buyers.insert(r.user);
            }
            if r.bucket == b && o.status == OrderStatus::Cancelled {
                image.cancelled_released.push((r.id, r.qty));
            }
        }
        for j in db
            .journal
            .iter()
            .filter(|j| j.bucket == b && j.kind == JournalKind::Transfer)
        {
            if j.delta > 0 {
                image.transfers_in += j.delta as u64;
            } else {
                image.transfers_out += j.delta.unsigned_abs();
            }
        }
        image.buyers = buyers.into_iter().collect();
        report.buyers += image.buyers.len() as u64;
        report.stock += image.stock;
        cache.rebuild(plan, b, &image).await?;
    }
    cache.set_state(plan, reopen, Some(&epoch)).await?;
    Ok(Some(report))
}
