//! The purchase funnel (DESIGN §2): each step does only its cheapest job and turns doomed
//! requests away before the next, costlier one.
//!
//! validate → activity window and state (local cache, never a store read) → local sold-out flag
//! (no Redis call once a bucket and the fallback are known empty) → `reserve.lua` on the user's
//! own bucket, then the fallback → publish the order → answer.
//!
//! Kept true: a request answered `Queued` has an open reservation in Redis; one answered
//! anything else moved no stock — except when the reserve's outcome itself is unknown, which is
//! answered `Unavailable` and left to the reconciler (the reservation may exist and then becomes
//! an order, or is released).

use crate::clock::Clock;
use crate::domain::{
    Activity, ActivityId, ActivityState, BucketNo, InvalidField, Reservation, ReservationId, StockPlan,
    UserId,
};
use crate::ports::{OrderBus, PortError, ReleaseKind, ReserveOutcome, StockCache};
use rand::RngCore;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PurchaseOutcome {
    /// Units reserved and the order is on its way to the ledger.
    Queued(Reservation),
    /// The user already holds a unit (or an attempt is in flight).
    Duplicate,
    SoldOut,
    NotStarted,
    Ended,
    /// A dependency is down or the activity is paused/recovering; nothing was bought.
    Unavailable {
        reason: String,
    },
}

impl PurchaseOutcome {
    /// A short stable label for counters and logs.
    pub fn label(&self) -> &'static str {
        match self {
            PurchaseOutcome::Queued(_) => "queued",
            PurchaseOutcome::Duplicate => "duplicate",
            PurchaseOutcome::SoldOut => "sold_out",
            PurchaseOutcome::NotStarted => "not_started",
            PurchaseOutcome::Ended => "ended",
            PurchaseOutcome::Unavailable { .. } => "unavailable",
        }
    }
}

/// A request the engine refuses to consider at all (bad input); no stock moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PurchaseError {
    #[error("activity_id: unknown activity {0}")]
    UnknownActivity(ActivityId),
    #[error(transparent)]
    Invalid(#[from] InvalidField),
}

#[derive(Debug, Clone)]
pub struct PurchaseConfig {
    /// How long a bucket found empty is answered from memory before Redis is asked again (units
    /// can come back: releases, cancels, rebalancing).
    pub sold_out_recheck_ms: u64,
}

impl Default for PurchaseConfig {
    fn default() -> Self {
        PurchaseConfig {
            sold_out_recheck_ms: 200,
        }
    }
}

/// Reservation ids: a random 64-bit prefix per service instance (from the injected RNG) and a
/// counter — unique across engines without coordination, and no lock on the hot path.
struct ReservationIds {
    prefix: u64,
    counter: AtomicU64,
}

impl ReservationIds {
    fn next(&self) -> ReservationId {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        ReservationId(((self.prefix as u128) << 64) | n as u128)
    }
}

/// What the purchase path knows about an activity without asking any store.
struct LocalActivity {
    activity: Activity,
    plan: StockPlan,
    /// `ActivityState` as last read from `sk:{A}:meta` (encoded by `state_code`).
    state: AtomicU64,
    /// Per bucket (fallback last): clock ms until which the bucket is known empty; 0 = unknown.
    empty_until_ms: Vec<AtomicU64>,
    /// The meta's `moves` when last refreshed: a change means units were moved between buckets.
    moves: AtomicU64,
}

const STATES: [ActivityState; 4] = [
    ActivityState::Open,
    ActivityState::Paused,
    ActivityState::Recovering,
    ActivityState::Closed,
];

fn state_code(s: ActivityState) -> u64 {
    STATES.iter().position(|x| *x == s).unwrap_or(0) as u64
}

impl LocalActivity {
    fn state(&self) -> ActivityState {
        STATES[self.state.load(Ordering::Relaxed) as usize % STATES.len()]
    }

    fn known_empty(&self, b: BucketNo, now_ms: u64) -> bool {
        self.empty_until_ms[b.0 as usize].load(Ordering::Relaxed) > now_ms
    }

    fn mark_empty(&self, b: BucketNo, until_ms: u64) {
        self.empty_until_ms[b.0 as usize].store(until_ms, Ordering::Relaxed);
    }

    /// Sold out for this bucket's users: its own stock and the fallback are both known empty.
    fn sold_out_for(&self, own: BucketNo, now_ms: u64) -> bool {
        self.known_empty(own, now_ms)
            && (!self.plan.has_fallback() || self.known_empty(self.plan.fallback_bucket(), now_ms))
    }
}

pub struct PurchaseService<C, B> {
    inner: Arc<Inner<C, B>>,
}

impl<C, B> Clone for PurchaseService<C, B> {
    fn clone(&self) -> Self {
        PurchaseService {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<C, B> {
    cache: C,
    bus: B,
    clock: Clock,
    config: PurchaseConfig,
    ids: ReservationIds,
    /// Read on every request, written when an activity is loaded: a std RwLock, never held
    /// across an await (the entry is cloned out).
    activities: RwLock<BTreeMap<ActivityId, Arc<LocalActivity>>>,
}

impl<C: StockCache, B: OrderBus> PurchaseService<C, B> {
    pub fn new(cache: C, bus: B, clock: Clock, config: PurchaseConfig, rng: &mut impl RngCore) -> Self {
        PurchaseService {
            inner: Arc::new(Inner {
                cache,
                bus,
                clock,
                config,
                ids: ReservationIds {
                    prefix: rng.next_u64(),
                    counter: AtomicU64::new(0),
                },
                activities: RwLock::new(BTreeMap::new()),
            }),
        }
    }

    /// Load (or refresh) an activity into the local cache from its warmed meta.
    pub async fn load_activity(&self, activity: Activity) -> Result<(), PortError> {
        let plan = StockPlan::new(&activity);
        let meta = self.inner.cache.meta(activity.id()).await?.ok_or_else(|| {
            PortError::determinate(
                "load activity",
                format!("activity {} is not warmed", activity.id()),
            )
        })?;
        if meta.version != plan.version {
            return Err(PortError::determinate(
                "load activity",
                format!("plan version {} in redis, {} here", meta.version, plan.version),
            ));
        }
        let local = LocalActivity {
            state: AtomicU64::new(state_code(meta.state)),
            empty_until_ms: plan.units.iter().map(|_| AtomicU64::new(0)).collect(),
            moves: AtomicU64::new(meta.moves),
            activity,
            plan,
        };
        let mut map = self.inner.activities.write().unwrap_or_else(|p| p.into_inner());
        map.insert(local.activity.id(), Arc::new(local));
        Ok(())
    }

    /// Re-read every loaded activity's state from `sk:{A}:meta`, so pause / resume / close and
    /// recovery reach this engine. A missing meta means Redis lost the activity: `recovering`
    /// until the recovery job rebuilds it. A read error keeps the last known state.
    pub async fn refresh_states(&self) {
        let locals: Vec<Arc<LocalActivity>> = {
            let map = self.inner.activities.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        for local in locals {
            if let Ok(meta) = self.inner.cache.meta(local.activity.id()).await {
                let state = meta.as_ref().map_or(ActivityState::Recovering, |m| m.state);
                local.state.store(state_code(state), Ordering::Relaxed);
                // Units were rebalanced: a bucket known empty may have stock again.
                let moves = meta.map_or(0, |m| m.moves);
                if local.moves.swap(moves, Ordering::Relaxed) != moves {
                    local
                        .empty_until_ms
                        .iter()
                        .for_each(|f| f.store(0, Ordering::Relaxed));
                }
            }
        }
    }

    /// Refresh the states every `every`, forever (run it as a task beside the service).
    pub async fn run_refresher(&self, every: std::time::Duration) {
        loop {
            tokio::time::sleep(every).await;
            self.refresh_states().await;
        }
    }

    fn local(&self, a: ActivityId) -> Option<Arc<LocalActivity>> {
        let map = self.inner.activities.read().unwrap_or_else(|p| p.into_inner());
        map.get(&a).cloned()
    }

    pub fn plan(&self, a: ActivityId) -> Option<StockPlan> {
        self.local(a).map(|l| l.plan.clone())
    }

    /// The activity as loaded here, with its state as last refreshed.
    pub fn activity(&self, a: ActivityId) -> Option<(Activity, ActivityState)> {
        self.local(a).map(|l| (l.activity.clone(), l.state()))
    }

    /// Every activity loaded here.
    pub fn activities(&self) -> Vec<ActivityId> {
        let map = self.inner.activities.read().unwrap_or_else(|p| p.into_inner());
        map.keys().copied().collect()
    }

    /// The answer the purchase path can give from memory alone — unknown activity, bad quantity,
    /// outside the window, not open, known sold out — or `None`: Redis must be asked.
    pub fn precheck(
        &self,
        a: ActivityId,
        user: UserId,
        qty: u32,
    ) -> Option<Result<PurchaseOutcome, PurchaseError>> {
        let Some(local) = self.local(a) else {
            return Some(Err(PurchaseError::UnknownActivity(a)));
        };
        Self::from_memory(&local, user, qty, self.inner.clock.now_ms())
    }

    fn from_memory(
        local: &LocalActivity,
        user: UserId,
        qty: u32,
        now: u64,
    ) -> Option<Result<PurchaseOutcome, PurchaseError>> {
        let limit = local.activity.spec().per_user_limit;
        if qty == 0 || qty > limit {
            return Some(Err(InvalidField::new(
                "qty",
                format!("must be 1..={limit}, got {qty}"),
            )
            .into()));
        }
        let answer = match local.activity.window_at(now) {
            std::cmp::Ordering::Less => PurchaseOutcome::NotStarted,
            std::cmp::Ordering::Greater => PurchaseOutcome::Ended,
            std::cmp::Ordering::Equal => match local.state() {
                ActivityState::Open if local.sold_out_for(local.plan.route(user), now) => {
                    PurchaseOutcome::SoldOut
                }
                ActivityState::Open => return None,
                ActivityState::Closed => PurchaseOutcome::Ended,
                other => unavailable(format!("activity is {other}")),
            },
        };
        Some(Ok(answer))
    }

    pub async fn purchase(
        &self,
        a: ActivityId,
        user: UserId,
        qty: u32,
    ) -> Result<PurchaseOutcome, PurchaseError> {
        let local = self.local(a).ok_or(PurchaseError::UnknownActivity(a))?;
        let now = self.inner.clock.now_ms();
        if let Some(answer) = Self::from_memory(&local, user, qty, now) {
            return answer;
        }
        let own = local.plan.route(user);

        let id = self.inner.ids.next();
        let started = tokio::time::Instant::now();
        let reserved = self.inner.cache.reserve(&local.plan, user, qty, id, now).await;
        metrics::histogram!("seckill_reserve_seconds").record(started.elapsed().as_secs_f64());
        let reservation = match reserved {
            Ok(ReserveOutcome::Reserved(r)) => r,
            Ok(ReserveOutcome::Duplicate) => return Ok(PurchaseOutcome::Duplicate),
            Ok(ReserveOutcome::Empty) => {
                let until = now + self.inner.config.sold_out_recheck_ms;
                local.mark_empty(own, until);
                if local.plan.has_fallback() {
                    local.mark_empty(local.plan.fallback_bucket(), until);
                }
                return Ok(PurchaseOutcome::SoldOut);
            }
            Ok(ReserveOutcome::NotWarmed) => return Ok(unavailable("stock is not warmed".into())),
            Err(e) => return Ok(unavailable(format!("stock cache: {e}"))),
        };

        let started = tokio::time::Instant::now();
        let published = self.inner.bus.publish(&reservation).await;
        metrics::histogram!("seckill_publish_seconds").record(started.elapsed().as_secs_f64());
        let e = match published {
            Ok(()) => return Ok(PurchaseOutcome::Queued(reservation)),
            Err(e) => e,
        };
        #[cfg(madsim)]
        let indeterminate_is_queued = !crate::planted::on(crate::planted::Bug::ReleaseOnIndeterminatePublish);
        #[cfg(not(madsim))]
        let indeterminate_is_queued = true;
        if e.is_indeterminate() && indeterminate_is_queued {
            // The record may be on the bus: the reservation stays open, the reconciler
            // republishes it if the ledger never sees it, and the ledger dedupes by id.
            return Ok(PurchaseOutcome::Queued(reservation));
        }
        #[cfg(madsim)]
        let reservation = if crate::planted::on(crate::planted::Bug::ReleaseToRoutedBucket) {
            Reservation {
                bucket: local.plan.route(user),
                ..reservation
            }
        } else {
            reservation
        };
        // Certainly not published: give the units back and let the user retry. If this release
        // fails too, the reservation stays open for the reconciler.
        let _ = self
            .inner
            .cache
            .release(&reservation, ReleaseKind::Unpublished)
            .await;
        Ok(unavailable(format!("order bus: {e}")))
    }
}

fn unavailable(reason: String) -> PurchaseOutcome {
    PurchaseOutcome::Unavailable { reason }
}
