//! The rebalancer: with skewed traffic some buckets drain while others sit full. At low frequency
//! it moves at most half of a rich bucket's stock into each drained business bucket:
//! `take` (source slot, recorded in its xfer hash) → ledger transfer (idempotent by id) → `give`
//! (target slot, idempotent by id) → `ack`. A crash anywhere leaves a take without its ack, which
//! `finish` (called by the reconciler) completes; units are never lost nor doubled.

use crate::domain::{ActivityState, BucketNo, StockPlan};
use crate::ports::{Ledger, PortResult, StockCache, Transfer};

#[derive(Debug, Clone)]
pub struct RebalanceConfig {
    /// A bucket with fewer units than this is not a source.
    pub min_source_units: u64,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        // Even a last unit moves: a cold bucket's single unit is still a unit unsold.
        RebalanceConfig { min_source_units: 1 }
    }
}

/// Complete one transfer from wherever it stopped; every step is idempotent. The last one
/// announces the move (the meta's `moves`): an API process that answers the target bucket "sold
/// out" from memory forgets that at its next refresh instead of after its recheck period — the
/// rebalancer's transfers and those the reconciler finishes for a runner that died alike.
pub async fn finish<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    t: &Transfer,
) -> PortResult<()> {
    ledger.transfer(plan.activity, t).await?;
    cache.give(plan, t).await?;
    cache.ack(plan, t).await?;
    cache.note_moves(plan.activity).await
}

/// One pass: the transfers it completed. `runner` is this process's random id (from its seeded
/// RNG): transfer ids must be unique across every process that runs the rebalancer.
pub async fn rebalance<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    now_ms: u64,
    runner: &str,
    cfg: &RebalanceConfig,
) -> PortResult<Vec<Transfer>> {
    let view = cache.summary(plan).await?;
    // Only over a healthy, open sale: every gate open (a paused or recovering bucket is left
    // alone), nothing lost, no recovery under way.
    let healthy = view.meta.as_ref().is_some_and(|m| m.claim.is_none())
        && view
            .buckets
            .iter()
            .all(|b| b.stock.is_some() && b.gate.as_ref().is_some_and(|g| g.state == ActivityState::Open));
    if !healthy {
        return Ok(Vec::new());
    }
    // The source's gate generation goes with the transfer: the take refuses another, the ledger
    // an older one than the registry's (a recovery between this look and the take).
    let generation = |b: BucketNo| {
        view.buckets
            .iter()
            .find(|v| v.bucket == b)
            .and_then(|v| v.gate.as_ref())
            .map_or(0, |g| g.generation)
    };
    // Business buckets only: the fallback already serves everyone.
    let mut stock: Vec<(BucketNo, u64)> = view
        .buckets
        .iter()
        .filter(|b| b.bucket != plan.fallback_bucket())
        .map(|b| (b.bucket, b.stock.unwrap_or(0).max(0) as u64))
        .collect();
    let drained: Vec<BucketNo> = stock.iter().filter(|(_, s)| *s == 0).map(|(b, _)| *b).collect();
    let mut done = Vec::new();
    for to in drained {
        let Some(&(from, units)) = stock.iter().max_by_key(|(b, s)| (*s, std::cmp::Reverse(*b))) else {
            break;
        };
        if units < cfg.min_source_units {
            break;
        }
        let t = Transfer {
            id: format!("{runner}-{now_ms:x}-{from}-{to}"),
            from,
            to,
            units: (units / 2).max(1),
            generation: generation(from),
        };
        // Fault point: a runner stalled between its look at the gates and its take, once per run
        // (`Site::RebalanceLook`), across a Redis loss and the recovery after it (the simulation
        // aims one at it, and wakes the runner once the recovery rebuilt a bucket): the take
        // then meets a rebuilt bucket whose gate is recovering, or gates of a newer generation,
        // and must be refused — taken, the ledger would refuse its next step (a transfer planned
        // before the rebuild) forever, and its units would sit in no bucket.
        crate::planted::stall_once_until_woken(
            crate::planted::Site::RebalanceLook,
            1,
            std::time::Duration::from_millis(20_000),
        )
        .await;
        if !cache.take(plan, &t).await? {
            continue; // sold meanwhile, or gated: a recovery since the look
        }
        // Fault points: a runner stalled between take and give (the units are in neither bucket:
        // the reconciler may finish the transfer meanwhile, and this runner then finishes it too);
        // once per run (`Site::RebalanceTake`, at the first take) long enough for a recovery to rebuild the
        // buckets in between (the simulation aims a Redis loss at it).
        {
            crate::planted::stall(10, std::time::Duration::from_millis(1_500)).await;
            crate::planted::stall_once(
                crate::planted::Site::RebalanceTake,
                1,
                std::time::Duration::from_millis(8_000),
            )
            .await;
        }
        finish(cache, ledger, plan, &t).await?;
        for (b, s) in stock.iter_mut() {
            if *b == from {
                *s -= t.units;
            } else if *b == to {
                *s += t.units;
            }
        }
        done.push(t);
    }
    Ok(done)
}
