//! The purchase funnel (DESIGN §2): each step does only its cheapest job and turns doomed
//! requests away before the next, costlier one.
//!
//! validate → activity window and state (local cache, never a store read) → local sold-out flag
//! (no Redis call once a bucket and the fallback are known empty) → `reserve.lua` on the user's
//! own bucket, then the fallback → publish the order → answer.
//!
//! Kept true: a request answered `Queued` has an open reservation in Redis; one answered
//! anything else moved no stock — except when the reserve's outcome itself is unknown (its reply
//! lost), which is answered `Unavailable` as an unknown outcome and left to the reconciler (the
//! reservation may exist and then becomes an order): the buyer is never told "nothing was
//! bought" unless that is certain.

use crate::clock::Clock;
use crate::domain::{
    Activity, ActivityId, ActivityState, BucketNo, InvalidField, Reservation, ReservationId, StockPlan,
    UserId,
};
use crate::ports::{
    Ledger, OrderBus, PortResult, Registered, ReleaseKind, Released, ReserveOutcome, StockCache,
};
use rand::RngCore;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tracing::Instrument;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PurchaseOutcome {
    /// Units reserved and the order is on its way to the ledger.
    Queued(Reservation),
    /// The user already holds a unit (or an attempt is in flight).
    Duplicate,
    SoldOut,
    NotStarted,
    Ended,
    /// A dependency is down or the activity is paused/recovering; nothing was bought (or, for
    /// `Unserved::OutcomeUnknown`, whether it was is not known here). `reason` is for the log:
    /// it may name hosts and carry the stores' error text; a buyer is told `why` alone.
    Unavailable {
        why: Unserved,
        reason: String,
    },
}

/// Why a purchase was not served, as a buyer may be told it: stable, and naming nothing
/// internal (no host, no store error text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Unserved {
    /// The operator paused the sale, or a recovery holds it.
    Held(ActivityState),
    /// The sale's stock is not in place yet (no warmup).
    NotReady,
    /// The stock cache did not answer.
    StockCache,
    /// The order could not be queued: nothing was bought.
    OrderBus,
    /// The order may or may not exist: its status says.
    OutcomeUnknown,
}

impl Unserved {
    /// What a buyer is told.
    pub fn message(self) -> String {
        match self {
            Unserved::Held(state) => format!("the sale is {state}; try again later"),
            Unserved::NotReady => "the sale is not ready yet; try again later".into(),
            Unserved::StockCache => "the stock service is unavailable; nothing was bought; try again".into(),
            Unserved::OrderBus => "orders cannot be queued right now; nothing was bought; try again".into(),
            Unserved::OutcomeUnknown => {
                "the outcome of this purchase is not known yet: see your order's status".into()
            }
        }
    }
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

/// Reservation ids: 128 random bits (DESIGN §12) — unique across engines without coordination
/// and not guessable from one another (an id is what a cancel names). The generator is seeded
/// from the injected RNG: the OS's in production, the seed's in the simulation. The lock is held
/// for one draw.
struct ReservationIds {
    rng: std::sync::Mutex<rand::rngs::StdRng>,
}

impl ReservationIds {
    fn next(&self) -> ReservationId {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        ReservationId(((rng.next_u64() as u128) << 64) | rng.next_u64() as u128)
    }
}

/// What the purchase path knows about an activity without asking any store. An optimisation
/// that answers doomed requests from memory; the gates in Redis are the authority (§11.2).
struct LocalActivity {
    activity: Activity,
    plan: StockPlan,
    /// The registry's intent as last read (encoded by `state_code`).
    intent: AtomicU64,
    /// The registry's generation as last read: a reservation stamped older was made at a gate a
    /// recovery left behind, and its order would be refused by the ledger (DESIGN §11.3).
    generation: AtomicU64,
    /// A recovery is under way (the meta carries a claim, or Redis lost the meta).
    recovering: std::sync::atomic::AtomicBool,
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
        if self.recovering.load(Ordering::Relaxed) {
            return ActivityState::Recovering;
        }
        STATES[self.intent.load(Ordering::Relaxed) as usize % STATES.len()]
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
                    rng: std::sync::Mutex::new(
                        <rand::rngs::StdRng as rand::SeedableRng>::from_rng(rng).expect("an RNG that works"),
                    ),
                },
                activities: RwLock::new(BTreeMap::new()),
            }),
        }
    }

    /// Load an activity from its registry row (or update its intent if it is loaded). No store
    /// is read: an activity not warmed yet answers "unavailable" at the reserve.
    pub fn load_activity(&self, reg: &Registered) {
        if let Some(local) = self.local(reg.activity.id()) {
            if local.activity == reg.activity {
                local
                    .intent
                    .store(state_code(reg.intent.state), Ordering::Relaxed);
                local.generation.store(reg.intent.generation, Ordering::Relaxed);
                return;
            }
        }
        let plan = StockPlan::new(&reg.activity);
        let local = LocalActivity {
            intent: AtomicU64::new(state_code(reg.intent.state)),
            generation: AtomicU64::new(reg.intent.generation),
            recovering: Default::default(),
            empty_until_ms: plan.units.iter().map(|_| AtomicU64::new(0)).collect(),
            moves: AtomicU64::new(0),
            activity: reg.activity.clone(),
            plan,
        };
        let mut map = self.inner.activities.write().unwrap_or_else(|p| p.into_inner());
        map.insert(local.activity.id(), Arc::new(local));
    }

    /// Bring the local cache in line with the registry (new activities, the operator's intent)
    /// and with each meta (a recovery under way, rebalancing rounds). A failed read keeps what
    /// was known; the error is returned after the rest was refreshed.
    pub async fn refresh<L: Ledger>(&self, ledger: &L) -> PortResult<()> {
        let registry = ledger.registered().await;
        if let Ok(rows) = &registry {
            rows.iter().for_each(|r| self.load_activity(r));
        }
        let locals: Vec<Arc<LocalActivity>> = {
            let map = self.inner.activities.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        let mut meta_error = None;
        for local in locals {
            match self.inner.cache.meta(local.activity.id()).await {
                Ok(meta) => {
                    let recovering = meta.as_ref().is_none_or(|m| m.claim.is_some());
                    local.recovering.store(recovering, Ordering::Relaxed);
                    // Units were rebalanced: a bucket known empty may have stock again.
                    let moves = meta.map_or(0, |m| m.moves);
                    if local.moves.swap(moves, Ordering::Relaxed) != moves {
                        local
                            .empty_until_ms
                            .iter()
                            .for_each(|f| f.store(0, Ordering::Relaxed));
                    }
                }
                Err(e) => meta_error = Some(e),
            }
        }
        registry.map(drop)?;
        meta_error.map_or(Ok(()), Err)
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
                other => unavailable(Unserved::Held(other), format!("activity is {other}")),
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
        // Units reserved now could not be published: refuse before anything moves.
        if let Some(why) = self.inner.bus.known_down() {
            return Ok(unavailable(
                Unserved::OrderBus,
                format!("the order bus is down: {why}"),
            ));
        }
        let own = local.plan.route(user);

        let id = self.inner.ids.next();
        let started = tokio::time::Instant::now();
        let reserved = (self.inner.cache.reserve(&local.plan, user, qty, id, now))
            .instrument(tracing::debug_span!("reserve", activity = %a, user = user.0, bucket = own.0))
            .await;
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
            Ok(ReserveOutcome::NotWarmed) => {
                return Ok(unavailable(Unserved::NotReady, "stock is not warmed".into()))
            }
            Ok(ReserveOutcome::Gated(ActivityState::Closed)) => return Ok(PurchaseOutcome::Ended),
            Ok(ReserveOutcome::Gated(state)) => {
                return Ok(unavailable(Unserved::Held(state), format!("activity is {state}")))
            }
            // A lost reply (a timeout, a connection dropped after the script was sent) may hide
            // a reservation that ran: its outcome is unknown, not "nothing was bought".
            Err(e) if e.is_indeterminate() => {
                return Ok(unavailable(Unserved::OutcomeUnknown, format!("stock cache: {e}")))
            }
            Err(e) => return Ok(unavailable(Unserved::StockCache, format!("stock cache: {e}"))),
        };
        // Fault point: a process stalled between reserve and publish, past the delivery timeout
        // (it wakes up as a zombie and publishes a reservation a recovery may have dropped).
        crate::planted::stall(20, std::time::Duration::from_millis(4_000)).await;
        let (from_fallback, attempt) = (reservation.bucket != own, reservation.id);
        let known = local.generation.load(Ordering::Relaxed);
        let (answer, pending) = if reservation.generation < known {
            // Reserved at a gate of an older generation than the registry's (a gate a late
            // registry write left behind, or a process that woke up after a recovery): the
            // ledger would refuse the order. The units go back, the user may try again.
            let why = format!(
                "activity {a} is at generation {known}, the reservation was made at {}",
                reservation.generation
            );
            self.give_back(reservation, Unserved::Held(ActivityState::Recovering), why)
                .await
        } else {
            self.publish(&local.plan, reservation).await
        };
        // A unit won from the fallback left the own bucket's pending mark in place until the
        // publish's outcome was known: keep the mark if the order may exist, clear it if the
        // units certainly went back. Left alone (or after a crash before this line), the
        // reconciler resolves it.
        if let (true, Some(keep)) = (from_fallback, pending) {
            let _ = self
                .inner
                .cache
                .resolve_pending(&local.plan, user, attempt, keep)
                .await;
        }
        Ok(answer)
    }

    /// Publish a reservation and answer; gives the units back if it certainly was not published.
    /// With the answer, what a pending-fallback mark should become: `Some(keep)`, or `None`
    /// when that is not known.
    async fn publish(
        &self,
        // Only the planted `ReleaseToRoutedBucket` routes with it.
        plan: &StockPlan,
        reservation: Reservation,
    ) -> (PurchaseOutcome, Option<bool>) {
        let started = tokio::time::Instant::now();
        let span =
            tracing::debug_span!("publish", reservation = %reservation.id, bucket = reservation.bucket.0);
        let published = self.inner.bus.publish(&reservation).instrument(span).await;
        metrics::histogram!("seckill_publish_seconds").record(started.elapsed().as_secs_f64());
        let e = match published {
            Ok(()) => return (PurchaseOutcome::Queued(reservation), Some(true)),
            Err(e) => e,
        };
        let indeterminate_is_queued = !crate::planted::on(crate::planted::Bug::ReleaseOnIndeterminatePublish);
        if e.is_indeterminate() && indeterminate_is_queued {
            // The record may be on the bus: the reservation stays open, the reconciler
            // republishes it if the ledger never sees it, and the ledger dedupes by id — as long
            // as it is still in Redis. One that vanished (Redis lost it while this process was
            // stalled past the delivery timeout, or it was applied and settled already) has an
            // outcome this process cannot know: "queued" would be a promise nobody keeps.
            // And if Redis does not answer either, whether it still holds the reservation is
            // not known (a restart may have lost it before the publish timed out: simulation
            // chaos seed 28): no promise either way.
            return match self.inner.cache.adopt(&reservation).await {
                Ok(true) => (PurchaseOutcome::Queued(reservation), Some(true)),
                Ok(false) => (
                    unavailable(
                        Unserved::OutcomeUnknown,
                        format!("order bus: {e}; the reservation is no longer in Redis (check the order's status)"),
                    ),
                    None,
                ),
                Err(adopt) => (
                    unavailable(
                        Unserved::OutcomeUnknown,
                        format!("order bus: {e}; and Redis: {adopt} (check the order's status)"),
                    ),
                    None,
                ),
            };
        }
        let reservation = if crate::planted::on(crate::planted::Bug::ReleaseToRoutedBucket) {
            Reservation {
                bucket: plan.route(reservation.user),
                ..reservation
            }
        } else {
            reservation
        };
        // Certainly not published: give the units back and let the user retry — unless the
        // reconciler adopted the reservation to republish it (or it is already an order): then
        // the order is on its way, and so is the answer "queued".
        // Fault point: stalled between the failed publish and the release, past the reconciler's
        // republish age (it adopts and republishes the reservation meanwhile).
        crate::planted::stall(4, std::time::Duration::from_millis(3_000)).await;
        self.give_back(reservation, Unserved::OrderBus, format!("order bus: {e}"))
            .await
    }

    /// Give back a reservation that certainly was not published (`why`; a buyer is told
    /// `given_back` once it is back), and answer; with the answer, what a pending-fallback mark
    /// should become (see `publish`).
    async fn give_back(
        &self,
        reservation: Reservation,
        given_back: Unserved,
        why: String,
    ) -> (PurchaseOutcome, Option<bool>) {
        let released = self
            .inner
            .cache
            .release(&reservation, ReleaseKind::Unpublished)
            .await;
        // Fault point: a process stalled between a release's effect and its answer (the units
        // are back and the mark gone while the own bucket's pending mark, if any, waits).
        crate::planted::stall(20, std::time::Duration::from_millis(2_000)).await;
        match released {
            Ok(Released::Released) => (unavailable(given_back, why), Some(false)),
            Ok(Released::Adopted) => (PurchaseOutcome::Queued(reservation), Some(true)),
            // Gone from Redis: lost with Redis data (no order then), or rescued, applied and
            // settled by a recovery meanwhile (an order then). Not known here.
            Ok(Released::Absent) => (
                unavailable(
                    Unserved::OutcomeUnknown,
                    format!("{why}; the reservation is no longer in Redis (check the order's status)"),
                ),
                None,
            ),
            // Not given back. Whether it is still open (then the reconciler republishes it and
            // the order comes) or went with Redis's data is not known, even when Redis answered:
            // an error reply proves the release did not run, not that the reservation is there (a
            // restart lost it, and the release met NOSCRIPT: simulation chaos seed 76). No
            // promise either way.
            Err(release) => (
                unavailable(
                    Unserved::OutcomeUnknown,
                    format!("{why}; giving the units back: {release} (check the order's status)"),
                ),
                None,
            ),
        }
    }
}

fn unavailable(why: Unserved, reason: String) -> PurchaseOutcome {
    PurchaseOutcome::Unavailable { why, reason }
}
