//! Fenced recovery after Redis lost data (DESIGN §11.3): a restart without persistence, a lost
//! AOF window, a failover to a lagging replica — where Redis comes back with stale, too-high
//! stock and forgotten buyer marks, or with nothing.
//!
//! 1. Detect: the meta's epoch is not the server's run id now, or the meta, a stock key or a gate
//!    is missing, or a claim or a recovering gate was left behind by a runner that died, or a
//!    gate carries an older generation than the registry's (its orders would all be refused).
//! 2. Claim the activity with a fresh fence; the claim's deadline is Redis's own `TIME`. A live
//!    claim of another runner is left alone; an expired one is taken over. Every renewal also
//!    checks that Redis's run id is still the one read before the claim: a restart meanwhile
//!    may have kept the claim and lost the close, and the recovery starts over.
//! 3. Close every gate with the fence: from here no reserve and no transfer succeeds.
//! 4. Wait out the publish window (a reserve made before the close may still be publishing) and
//!    drain the order topic.
//! 5. Rescue the outbox: every open reservation the ledger lacks is applied to the ledger by the
//!    recovery itself (adopted first, so that its purchase cannot give it back meanwhile),
//!    stamped with the registry's current generation (it is in Redis now, so it is no zombie) —
//!    not republished: a record can become visible after any drain, and after the bump it would
//!    be refused as stale.
//! 6. Bump the generation (the ledger refuses older orders from here on) — a compare-and-set on
//!    the generation read before the rescue, so that a runner that stalled here past its lease
//!    stops instead of putting the registry ahead of the gates its successor reopened — snapshot
//!    the ledger in one consistent read, rebuild every bucket under the fence.
//! 7. Reopen bucket by bucket to the registry's current intent with the new generation, then
//!    finish the claim with the current run id as the epoch.
//!
//! Several runners may race: correctness rests on the fences in the gates (`rebuild.lua` and
//! `gate.lua`'s reopen refuse a gate that another claim closed), not on the claim's lease.

use crate::domain::{ActivityState, Reservation, StockPlan, UserId};
use crate::ports::{
    ApplyOutcome, BucketImage, Claim, JournalKind, Ledger, OrderBus, OrderStatus, PortError, PortResult,
    Rebuilt, ReleaseKind, StockCache, Transfer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// The publish window: a publish started before the gates closed has finished (or timed
    /// out) after this long — the producer's delivery timeout, with a margin.
    pub quiesce: Duration,
    /// Give up (and retry on the next pass) if the topic's lag has not fallen for this long. A
    /// slow drain is waited out: a backlog of a whole sale takes the consumers a while, and
    /// giving up on it would start the wait over (and the quiesce with it) without end.
    pub drain_timeout: Duration,
    /// The consumer group whose lag must reach zero.
    pub group: String,
    /// How long a claim lives without renewal (renewed at every step and while waiting).
    pub lease: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Why the recovery ran.
    pub cause: String,
    pub epoch: String,
    pub generation: u64,
    pub buckets: u32,
    pub buyers: u64,
    pub stock: u64,
    /// Open reservations the ledger lacked, republished from the outbox.
    pub rescued: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Redis holds the activity as the last warmup or recovery left it.
    NotNeeded,
    Busy(Busy),
    Recovered(RecoveryReport),
}

/// Another runner holds a live claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    pub fence: String,
    pub ms_left: u64,
}

/// A fresh fence from the caller's (seeded) RNG.
pub fn new_fence(rng: &mut impl rand::RngCore) -> String {
    format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
}

/// Step 1: why this activity needs a recovery, if it does; `generation` is the registry's (read
/// before this look: a recovery bumps it only while its gates are closed).
pub async fn needs_recovery<C: StockCache>(
    cache: &C,
    plan: &StockPlan,
    generation: u64,
) -> PortResult<Option<String>> {
    needed_besides(cache, plan, generation, None).await
}

/// `needs_recovery`, not counting the claim `own` (this runner's, just taken).
async fn needed_besides<C: StockCache>(
    cache: &C,
    plan: &StockPlan,
    generation: u64,
    own: Option<&str>,
) -> PortResult<Option<String>> {
    let epoch = cache.epoch().await?;
    let view = cache.summary(plan).await?;
    let Some(meta) = view.meta else {
        return Ok(Some("the activity's meta is missing".into()));
    };
    if let Some(fence) = meta.claim.filter(|f| Some(f.as_str()) != own) {
        return Ok(Some(format!("claim {fence} has not finished")));
    }
    if meta.epoch.as_deref() != Some(epoch.as_str()) {
        return Ok(Some(format!(
            "Redis run id is {epoch}, the activity was rebuilt under {}",
            meta.epoch.as_deref().unwrap_or("none")
        )));
    }
    for b in &view.buckets {
        match (&b.stock, &b.gate) {
            (None, _) => return Ok(Some(format!("bucket {} has no stock key", b.bucket))),
            (_, None) => return Ok(Some(format!("bucket {} has no gate", b.bucket))),
            (_, Some(g)) if g.state == ActivityState::Recovering => {
                return Ok(Some(format!("bucket {} was left recovering", b.bucket)))
            }
            // Every order reserved at this gate would be refused by the ledger as stale: a
            // registry written past the gates (a bump that landed after the recovery that
            // reopened them) is repaired by a recovery, not left to fail the whole sale.
            (_, Some(g)) if g.generation < generation => {
                return Ok(Some(format!(
                    "bucket {} is at generation {}, the registry at {generation}",
                    b.bucket, g.generation
                )))
            }
            _ => {}
        }
    }
    Ok(None)
}

/// A claim held while the recovery works: renewed at every step, so a runner that lost it
/// (paused past its lease and taken over) stops at its next step. The fences in the gates
/// protect the buckets even if it does not.
struct Held<'a, C> {
    cache: &'a C,
    plan: &'a StockPlan,
    fence: &'a str,
    lease_ms: u64,
    /// Redis's run id before the claim: the server every step of this recovery must be on.
    epoch: String,
    /// The registry's generation before the claim: a gate carrying a newer one was reopened by
    /// a recovery this runner did not see, and its claim is stale.
    generation: u64,
    renewed_at: std::sync::Mutex<tokio::time::Instant>,
}

impl<C: StockCache> Held<'_, C> {
    /// How often a long step renews: four times per lease.
    fn every(&self) -> Duration {
        Duration::from_millis(self.lease_ms / 4).max(Duration::from_millis(50))
    }

    /// Renew the claim, and check that Redis did not restart since it was taken. A restart
    /// loses the last writes (an AOF window, a lagging replica): it can keep the claim and lose
    /// the gates' close that followed it, and a recovery going on from there would bump the
    /// generation under gates still open at the old one (orders told "queued", refused by the
    /// ledger). It starts over instead. A restart after this check loses less than the publish
    /// window waited since the close (`quiesce` exceeds what Redis can lose), so the gates stay
    /// closed in whatever image it comes back with.
    async fn keep(&self) -> PortResult<()> {
        if !self.cache.renew(self.plan, self.fence, self.lease_ms).await? && !unfenced() {
            return Err(PortError::determinate(
                "recover",
                format!("claim {} was taken over", self.fence),
            ));
        }
        let now = self.cache.epoch().await?;
        if now != self.epoch && !unfenced() {
            return Err(PortError::determinate(
                "recover",
                format!(
                    "Redis restarted during the recovery (run id {} is now {now}): it may have lost the gates' close; starting over",
                    self.epoch
                ),
            ));
        }
        *self.renewed_at.lock().expect("renewed_at") = tokio::time::Instant::now();
        Ok(())
    }

    /// Renew if a quarter of the lease went by since the last renewal (inside long steps).
    async fn keep_if_due(&self) -> PortResult<()> {
        let last = *self.renewed_at.lock().expect("renewed_at");
        if last.elapsed() >= self.every() {
            self.keep().await?;
        }
        Ok(())
    }

    /// Give up: let the next pass (of any runner) claim again at once. The gates stay closed.
    async fn release(&self) {
        let _ = self.cache.renew(self.plan, self.fence, 0).await;
    }
}

/// Outbox entries adopted and applied at once (in one ledger transaction) by the rescue.
const RESCUE_IN_FLIGHT: usize = 64;

/// Wait until the consumer group has committed everything on the order topic; fail only if the
/// lag stops falling for `drain_timeout` (measured on the tokio clock, lag calls included).
async fn drain<B: OrderBus, C: StockCache>(
    bus: &B,
    cfg: &RecoveryConfig,
    held: &Held<'_, C>,
) -> PortResult<()> {
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
        held.keep_if_due().await?;
        tokio::time::sleep(step).await;
    }
}

/// Sleep `d`, renewing the claim on the way.
async fn wait<C: StockCache>(d: Duration, held: &Held<'_, C>) -> PortResult<()> {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(held.every().min(until - tokio::time::Instant::now())).await;
        held.keep().await?;
    }
    Ok(())
}

/// Step 5: apply the open reservations the ledger lacks to the ledger, here, stamped with the
/// registry's generation (they are in Redis now, so they are no zombies) — not republished: a
/// record can become visible on the topic long after its append (a slow follower holds the high
/// watermark back for up to `replica.lag.time.max.ms`), after the bump below, which would refuse
/// it. Applied before the bump, each is an order (or a failed one its user can see) whatever the
/// broker does with any record of it later: a late one is a redelivery. Adopted first, so that
/// its purchase cannot give it back meanwhile. Returns how many were rescued.
async fn rescue_into_ledger<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    held: &Held<'_, C>,
    rescue: &[&Reservation],
    generation: u64,
) -> PortResult<u64> {
    let mut rescued = 0u64;
    // A sale's worth of entries can be waiting here (every publish that failed while the gates
    // were closing): adopted and applied many at a time, one ledger transaction per round,
    // renewing the claim between rounds so that the lease does not run out under a long rescue.
    for round in rescue.chunks(RESCUE_IN_FLIGHT) {
        held.keep_if_due().await?;
        let adopted = futures::future::join_all(round.iter().map(|r| cache.adopt(r))).await;
        let mut batch = Vec::with_capacity(round.len());
        for (r, adopted) in round.iter().zip(adopted) {
            // Not adopted: settled or released meanwhile, nothing to rescue.
            if adopted? {
                batch.push(Reservation {
                    generation,
                    ..(*r).clone()
                });
            }
        }
        if batch.is_empty() {
            continue;
        }
        let outcomes = ledger.apply(&batch).await?;
        if outcomes.len() != batch.len() {
            return Err(PortError::indeterminate(
                "recover",
                format!(
                    "ledger returned {} outcomes for {} rescued",
                    outcomes.len(),
                    batch.len()
                ),
            ));
        }
        for (r, outcome) in batch.iter().zip(&outcomes) {
            match outcome {
                // Orders now (failed ones free their user): the rebuild closes their entries.
                ApplyOutcome::Created
                | ApplyOutcome::Redelivered
                | ApplyOutcome::OutOfStock
                | ApplyOutcome::StaleGeneration => {}
                // Not an order: its units go back, as the consumer's release would give them (the
                // rebuild refuses a bucket with an open entry the ledger lacks).
                ApplyOutcome::DuplicateBuyer { .. } => {
                    cache.release(r, ReleaseKind::Rejected).await?;
                }
                ApplyOutcome::UnknownBucket => {
                    return Err(PortError::determinate(
                        "recover",
                        format!("reservation {}: the ledger has no bucket {}", r.id, r.bucket),
                    ))
                }
            }
        }
        rescued += batch.len() as u64;
    }
    Ok(rescued)
}

/// Planted (`RescueRepublished`): step 5 as it was — the rescued reservations republished on the
/// topic and drained, which a record visible after the drain (and after the bump) defeats.
async fn republish<C: StockCache, B: OrderBus>(
    cache: &C,
    bus: &B,
    cfg: &RecoveryConfig,
    held: &Held<'_, C>,
    rescue: &[&Reservation],
    generation: u64,
    in_flight_ok: bool,
) -> PortResult<u64> {
    let (mut rescued, mut unknown) = (0u64, 0u64);
    for r in rescue {
        if !cache.adopt(r).await? {
            continue;
        }
        let stamped = Reservation {
            generation,
            ..(*r).clone()
        };
        rescued += 1;
        match bus.publish(&stamped).await {
            Ok(()) => {}
            Err(e) if e.is_indeterminate() => unknown += 1,
            Err(e) => return Err(e),
        }
        held.keep_if_due().await?;
    }
    if rescued > 0 && !in_flight_ok {
        if unknown > 0 {
            wait(cfg.quiesce, held).await?;
        }
        drain(bus, cfg, held).await?;
    }
    Ok(rescued)
}

/// Recover the activity if it needs it (§11.3), under `fence` (see `new_fence`).
pub async fn recover_if_needed<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
    fence: &str,
) -> PortResult<Recovery> {
    let generation = registered(ledger, plan).await?.intent.generation;
    let Some(cause) = needs_recovery(cache, plan, generation).await? else {
        return Ok(Recovery::NotNeeded);
    };
    claim_and_recover(cache, ledger, bus, plan, cfg, fence, generation, cause).await
}

/// Run the fenced recovery now, whatever the detection said (warmup of an activity that already
/// has orders runs it, DESIGN §11.2) — unless, once claimed, nothing needs it: see
/// `claim_and_recover`.
pub async fn recover<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
    fence: &str,
    cause: String,
) -> PortResult<Recovery> {
    let generation = registered(ledger, plan).await?.intent.generation;
    claim_and_recover(cache, ledger, bus, plan, cfg, fence, generation, cause).await
}

/// Claim, then recover — unless the claim took over nothing and Redis needs nothing besides
/// it: the claim seen unfinished may have finished between the look and this claim, and what
/// it recovered needs nothing more. Without this look, two runners waiting on each other's
/// claims would recover in turn, each bumping the generation and closing the sale again for a
/// recovery that changes nothing (and a warmup that saw a recovery finishing ran a whole one:
/// simulation operator seed 90630).
#[allow(clippy::too_many_arguments)]
async fn claim_and_recover<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
    fence: &str,
    generation: u64,
    cause: String,
) -> PortResult<Recovery> {
    let epoch = cache.epoch().await?;
    let previous = match claim(cache, plan, cfg, fence).await? {
        Ok(previous) => previous,
        Err(busy) => return Ok(Recovery::Busy(busy)),
    };
    if previous.is_none()
        && needed_besides(cache, plan, generation, Some(fence))
            .await?
            .is_none()
    {
        // The meta holds Redis's run id now (the look compared them): finish leaves it so.
        cache.finish(plan, fence, &cache.epoch().await?).await?;
        return Ok(Recovery::NotNeeded);
    }
    metrics::counter!("seckill_recovery_runs_total", "activity" => plan.activity.to_string()).increment(1);
    let held = Held {
        cache,
        plan,
        fence,
        lease_ms: lease_ms(cfg),
        epoch,
        generation,
        renewed_at: std::sync::Mutex::new(tokio::time::Instant::now()),
    };
    let outcome = recover_claimed(cache, ledger, bus, plan, cfg, &held, cause).await;
    if outcome.is_err() {
        // Let the claim go: the next pass (of any runner) claims again at once.
        held.release().await;
    }
    outcome.map(Recovery::Recovered)
}

/// The activity's registry row (it must be installed to be recovered).
async fn registered<L: Ledger>(ledger: &L, plan: &StockPlan) -> PortResult<crate::ports::Registered> {
    ledger.registry(plan.activity).await?.ok_or_else(|| {
        PortError::determinate("recover", format!("activity {} is not installed", plan.activity))
    })
}

fn lease_ms(cfg: &RecoveryConfig) -> u64 {
    cfg.lease.as_millis().max(1) as u64
}

/// Step 2: claim the recovery; `Ok(previous)`: the expired claim taken over, if any.
async fn claim<C: StockCache>(
    cache: &C,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
    fence: &str,
) -> PortResult<Result<Option<String>, Busy>> {
    Ok(match cache.claim(plan, fence, lease_ms(cfg)).await? {
        Claim::Claimed { previous } => Ok(previous),
        Claim::Busy { .. } if unfenced() => Ok(None),
        Claim::Busy { fence, ms_left } => Err(Busy { fence, ms_left }),
    })
}

async fn recover_claimed<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    cfg: &RecoveryConfig,
    held: &Held<'_, C>,
    cause: String,
) -> PortResult<RecoveryReport> {
    let fence = held.fence;
    // Fault point: a runner stalled between its claim and its close, at most once per run and
    // past its lease: another runner takes over, recovers and reopens meanwhile, and this one's
    // close must not halt the sale again.
    {
        let floor = Duration::from_millis(lease_ms(cfg)) + cfg.quiesce * 2 + Duration::from_secs(1);
        crate::planted::stall_once_past(
            crate::planted::Site::RecoveryClose,
            1,
            floor,
            floor + Duration::from_secs(5),
        )
        .await;
    }
    if !cache.close_gates(plan, fence, held.generation).await? && !unfenced() {
        return Err(PortError::determinate(
            "recover",
            format!(
                "a gate carries a newer generation than {}: another runner recovered since claim {fence} was taken",
                held.generation
            ),
        ));
    }

    let in_flight_ok = crate::planted::on(crate::planted::Bug::RebuildWhileInFlight);
    if !in_flight_ok {
        wait(cfg.quiesce, held).await?;
        drain(bus, cfg, held).await?;
    }

    // Step 5: the outbox. What is still open in Redis and not in the ledger was told "queued".
    let registry = registered(ledger, plan).await?;
    let open: Vec<Reservation> = cache
        .summary(plan)
        .await?
        .buckets
        .into_iter()
        .flat_map(|b| b.open)
        .collect();
    let ids: BTreeSet<_> = open.iter().map(|r| r.id).collect();
    let held_ids = ledger.reconcile_view(plan.activity, &ids).await?.held;
    let drop_outbox = crate::planted::on(crate::planted::Bug::RebuildDropsOutbox);
    let rescue: Vec<&Reservation> = open
        .iter()
        .filter(|r| !held_ids.contains(&r.id) && !drop_outbox)
        .collect();
    let rescued = if crate::planted::on(crate::planted::Bug::RescueRepublished) {
        republish(
            cache,
            bus,
            cfg,
            held,
            &rescue,
            registry.intent.generation,
            in_flight_ok,
        )
        .await?
    } else {
        rescue_into_ledger(cache, ledger, held, &rescue, registry.intent.generation).await?
    };
    held.keep().await?;

    // Fault point: a runner stalled between its last renewal and the bump, once per run far past
    // its lease (another runner takes over, recovers and reopens meanwhile: only the bump's
    // compare-and-set keeps this one from writing the registry past the reopened gates).
    {
        let floor = Duration::from_millis(lease_ms(cfg)) + cfg.quiesce * 2 + Duration::from_secs(1);
        crate::planted::stall_once_past(
            crate::planted::Site::RecoveryBump,
            1,
            floor,
            floor + Duration::from_secs(5),
        )
        .await;
    }
    // Step 6: from here the ledger refuses orders reserved before the loss.
    let from = registry.intent.generation;
    let Some(intent) = ledger.bump_generation(plan.activity, from).await? else {
        return Err(PortError::determinate(
            "recover",
            format!(
                "the registry's generation moved past {from} during the recovery: another runner recovered meanwhile"
            ),
        ));
    };
    let db = ledger.snapshot(plan.activity).await?;
    let mut report = RecoveryReport {
        cause,
        epoch: held.epoch.clone(),
        generation: intent.generation,
        buckets: plan.units.len() as u32,
        buyers: 0,
        stock: 0,
        rescued,
    };
    // Fault points: a runner stalled between its snapshot and its rebuild, once per run long
    // past its lease (another runner recovers and reopens, sales go on, buckets sell out and
    // settle meanwhile: only the fence keeps it from writing the past over them).
    {
        crate::planted::stall(2, Duration::from_millis(3_000)).await;
        crate::planted::stall_once(
            crate::planted::Site::RecoveryRebuild,
            2,
            Duration::from_millis(10_000),
        )
        .await;
    }
    if unfenced() {
        // Planted: whatever claim closed the gates meanwhile, this runner writes over it.
        cache.close_gates(plan, fence, u64::MAX).await?;
    }
    let transfers = journaled_transfers(&db.journal, intent.generation);
    for row in &db.buckets {
        let b = row.bucket;
        let mut buyers: BTreeSet<UserId> = BTreeSet::new();
        let mut image = BucketImage {
            stock: row.remaining.max(0) as u64,
            ..Default::default()
        };
        for o in &db.orders {
            let r = &o.reservation;
            // Every live order keeps its user out (the ledger's unique key holds for them):
            // marked in its own bucket, and in the bucket its unit came from. A failed order
            // frees its user (DESIGN §6).
            let live = o.status != OrderStatus::Failed
                || crate::planted::on(crate::planted::Bug::FailedOrderLocksOut);
            if live && (plan.route(r.user) == b || r.bucket == b) {
                buyers.insert(r.user);
            }
            if r.bucket == b {
                image.held.push(r.id);
                if o.status == OrderStatus::Cancelled {
                    image.cancelled_released.push((r.id, r.qty));
                }
            }
        }
        for t in &transfers {
            if t.from == b {
                image.transfers_out.push(t.clone());
            }
            if t.to == b {
                image.transfers_in.push(t.clone());
            }
        }
        if drop_outbox {
            // Planted: whatever is open in the bucket goes with the rebuild.
            image
                .held
                .extend(open.iter().filter(|r| r.bucket == b).map(|r| r.id));
        }
        image.buyers = buyers.into_iter().collect();
        report.buyers += image.buyers.len() as u64;
        report.stock += image.stock;
        match cache.rebuild(plan, b, fence, &image).await? {
            Rebuilt::Done => {}
            Rebuilt::Fenced => {
                return Err(PortError::determinate(
                    "recover",
                    format!("bucket {b}: its gate carries another claim than {fence}"),
                ))
            }
            Rebuilt::Open(rid) => {
                return Err(PortError::determinate(
                    "recover",
                    format!("bucket {b}: reservation {rid} is open and not in the ledger yet"),
                ))
            }
        }
    }
    held.keep().await?;

    // Step 7: the registry's intent now — an operator's pause or close made meanwhile stands
    // (the gates hold any newer one, and the reopen keeps the newer).
    let now = ledger
        .registry(plan.activity)
        .await?
        .map_or(intent.clone(), |r| r.intent);
    let target = crate::ports::Intent {
        generation: intent.generation,
        ..now
    };
    let target = match crate::planted::on(crate::planted::Bug::ReopenOverPause) {
        // Planted: back to the intent seen when the recovery began, over anything newer.
        true => crate::ports::Intent {
            version: 1_000_000_000,
            ..registry.intent.clone()
        },
        false => target,
    };
    if unfenced() {
        cache.close_gates(plan, fence, u64::MAX).await?;
    }
    // Fault points: a runner stalled between its read of the registry and the reopen (an
    // operator's pause may land meanwhile: only the gates' versions keep it standing), now and
    // then past its lease, once per run far past it (another runner takes over meanwhile: only
    // the fence keeps it from reopening gates that are another's to reopen).
    {
        crate::planted::stall(1, Duration::from_millis(1_500)).await;
        crate::planted::stall(5, Duration::from_millis(5_000)).await;
        crate::planted::stall_once(
            crate::planted::Site::RecoveryReopen,
            2,
            Duration::from_millis(8_000),
        )
        .await;
    }
    for b in plan.all_buckets() {
        if !cache.reopen(plan, b, fence, &target).await? {
            return Err(PortError::determinate(
                "recover",
                format!("bucket {b}: its gate carries another claim than {fence}"),
            ));
        }
    }
    // Fault point: a runner stalled between its reopen and its finish, at most once per run and
    // past its lease: another runner takes the claim over (and may finish it) meanwhile, and
    // this one must be told its claim was lost, not that its recovery finished.
    {
        let floor = Duration::from_millis(lease_ms(cfg)) + Duration::from_secs(1);
        crate::planted::stall_once_past(
            crate::planted::Site::RecoveryFinish,
            1,
            floor,
            floor + Duration::from_secs(5),
        )
        .await;
    }
    if !cache.finish(plan, fence, &held.epoch).await? && !unfenced() {
        return Err(PortError::determinate(
            "recover",
            format!("claim {fence} was taken over before it finished"),
        ));
    }
    Ok(report)
}

/// Planted (`RecoveryWithoutFence`): this runner ignores other claims and the gates' fences.
fn unfenced() -> bool {
    crate::planted::on(crate::planted::Bug::RecoveryWithoutFence)
}

/// The journal's transfers: each id with the bucket it left and the bucket it reached (its two
/// rows: the negative one on the source, the positive one on the target), as held in the image
/// of `generation` (the ledger has them: no generation check ever refuses them again).
fn journaled_transfers(journal: &[crate::ports::JournalEntry], generation: u64) -> Vec<Transfer> {
    let rows = || journal.iter().filter(|j| j.kind == JournalKind::Transfer);
    let to: BTreeMap<&str, crate::domain::BucketNo> = rows()
        .filter(|j| j.delta > 0)
        .map(|j| (j.reference.as_str(), j.bucket))
        .collect();
    rows()
        .filter(|j| j.delta < 0)
        .filter_map(|j| {
            Some(Transfer {
                id: j.reference.clone(),
                from: j.bucket,
                to: *to.get(j.reference.as_str())?,
                units: j.delta.unsigned_abs(),
                generation,
            })
        })
        .collect()
}
