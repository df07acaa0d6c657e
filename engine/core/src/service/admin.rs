//! The operator's operations as plain functions (DESIGN §11.2), called by `serve`'s admin
//! routes, the CLI and the simulation alike. Each acts for every process: it writes the registry
//! (MySQL) and the gates (Redis), and returns only after both.

use crate::domain::{Activity, ActivityId, ActivityState, Reservation, StockPlan};
use crate::jobs::{self, RecoveryConfig, RecoveryReport};
use crate::ports::{
    DeadLetter, GateWrite, Intent, Ledger, OrderBus, OrderStatus, PortError, StockCache, WarmupReport,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    #[error("id: activity {0} is not installed")]
    UnknownActivity(ActivityId),
    #[error("id: activity {0} exists with another plan")]
    OtherPlan(ActivityId),
    #[error("state: an operator sets open, paused or closed, not {0}")]
    BadIntent(ActivityState),
    #[error("a recovery of activity {activity} is under way (claim {fence}, {ms_left} ms left); try again")]
    Busy {
        activity: ActivityId,
        fence: String,
        ms_left: u64,
    },
    #[error(transparent)]
    Store(#[from] PortError),
}

/// Pause, resume or close: the registry first (every process's refresher picks it up), then
/// every gate (which alone enforces it). After this returns no reserve answers `reserved` for a
/// paused or closed activity, in any process, however stale its cache. A gate under recovery
/// records the intent and its reopen applies it.
pub async fn set_intent<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    id: ActivityId,
    state: ActivityState,
) -> Result<(Intent, Vec<GateWrite>), AdminError> {
    if state == ActivityState::Recovering {
        return Err(AdminError::BadIntent(state));
    }
    let activity = ledger
        .activity(id)
        .await?
        .ok_or(AdminError::UnknownActivity(id))?;
    let intent = ledger
        .set_intent(id, state)
        .await?
        .ok_or(AdminError::UnknownActivity(id))?;
    // Fault point: a call stalled between the registry and the gates, overtaken by the
    // operator's next call (only the gates' versions keep the older intent from winning).
    crate::planted::stall(2, std::time::Duration::from_millis(3_000)).await;
    let gates = cache.set_gates(&StockPlan::new(&activity), &intent).await?;
    Ok((intent, gates))
}

/// What a warmup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warmed {
    /// Stock keys and gates written from the plan (a new activity), or found warm already.
    FromPlan(WarmupReport),
    /// The activity had been installed before and Redis did not hold it as it was left: the
    /// fenced recovery rebuilt it from the ledger (never from the plan's initial figures).
    Recovered(RecoveryReport),
}

/// Install the activity in the registry (idempotent; another plan under the same id is refused)
/// and warm it in Redis. Only an activity installed just now is warmed from its plan; one the
/// registry already held — which may have orders — is left as it is if Redis holds it intact, and
/// otherwise recovered (DESIGN §11.2).
pub async fn install_and_warm<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    activity: &Activity,
    recovery: &RecoveryConfig,
    fence: &str,
) -> Result<(bool, Warmed), AdminError> {
    let plan = StockPlan::new(activity);
    if let Some(existing) = ledger.activity(activity.id()).await? {
        if StockPlan::new(&existing).version != plan.version {
            return Err(AdminError::OtherPlan(activity.id()));
        }
    }
    let created = ledger.install(activity, &plan).await?;
    let warmed = warm(cache, ledger, bus, &plan, created, recovery, fence).await?;
    Ok((created, warmed))
}

/// Warm an installed activity (see `install_and_warm`).
pub async fn warmup<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    id: ActivityId,
    recovery: &RecoveryConfig,
    fence: &str,
) -> Result<Warmed, AdminError> {
    let activity = ledger
        .activity(id)
        .await?
        .ok_or(AdminError::UnknownActivity(id))?;
    warm(
        cache,
        ledger,
        bus,
        &StockPlan::new(&activity),
        false,
        recovery,
        fence,
    )
    .await
}

/// The cause of a warmup's recovery of buckets whose stock key went between its check (the
/// activity whole) and its writes (after its count of them).
pub const LOST_AFTER_CHECK: &str = "of its buckets lost their stock key (the gate is there)";

async fn warm<C: StockCache, L: Ledger, B: OrderBus>(
    cache: &C,
    ledger: &L,
    bus: &B,
    plan: &StockPlan,
    new: bool,
    recovery: &RecoveryConfig,
    fence: &str,
) -> Result<Warmed, AdminError> {
    let registry = ledger
        .registry(plan.activity)
        .await?
        .ok_or(AdminError::UnknownActivity(plan.activity))?;
    let new = new || crate::planted::on(crate::planted::Bug::WarmupFromPlan);
    let cause = if new {
        None
    } else {
        jobs::needs_recovery(cache, plan, registry.intent.generation).await?
    };
    let cause = match cause {
        Some(cause) => cause,
        None => {
            // Fault point: a warmup stalled between its check and its writes (Redis may lose a
            // key meanwhile: only the gate left behind tells the warmup not to refill it).
            crate::planted::stall(2, std::time::Duration::from_millis(1_500)).await;
            let from = match new {
                true => crate::ports::WarmFrom::Plan,
                false => crate::ports::WarmFrom::Installed,
            };
            let report = cache.warmup(plan, &registry.intent, from).await?;
            if report.lost == 0 {
                return Ok(Warmed::FromPlan(report));
            }
            // Lost after the check: the warmup wrote nothing of them; recover them now.
            format!("{} {LOST_AFTER_CHECK}", report.lost)
        }
    };
    let cause = format!("warmup of an installed activity: {cause}");
    match jobs::recover(cache, ledger, bus, plan, recovery, fence, cause).await? {
        jobs::Recovery::Recovered(r) => Ok(Warmed::Recovered(r)),
        // A recovery finished between the look and the claim: the activity is whole.
        jobs::Recovery::NotNeeded => Ok(Warmed::FromPlan(WarmupReport {
            existing: plan.all_buckets().count() as u32,
            ..Default::default()
        })),
        jobs::Recovery::Busy(busy) => Err(AdminError::Busy {
            activity: plan.activity,
            fence: busy.fence,
            ms_left: busy.ms_left,
        }),
    }
}

/// What a replay did with one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// Published to the order topic again (the ledger dedupes it by reservation id and fences it
    /// by generation, as it does every republish).
    Published,
    /// The reservation is an order already (of this status): nothing was published.
    AlreadyAnOrder(OrderStatus),
    /// The record still does not decode (replaying it would only dead-letter it again).
    DoesNotDecode(String),
}

/// Replay one dead letter: publish its reservation to the order topic again, unless the ledger
/// holds it already. Safe at any time and any number of times — a record the reconciler could
/// republish is no different — because the ledger applies a reservation id once.
pub async fn replay<B: OrderBus, L: Ledger>(
    bus: &B,
    ledger: &L,
    letter: &DeadLetter,
) -> Result<Replayed, AdminError> {
    let r = match Reservation::decode(&letter.payload) {
        Ok(r) => r,
        Err(e) => return Ok(Replayed::DoesNotDecode(e.to_string())),
    };
    if let Some(order) = ledger.order(r.id).await? {
        return Ok(Replayed::AlreadyAnOrder(order.status));
    }
    bus.publish(&r).await?;
    Ok(Replayed::Published)
}
