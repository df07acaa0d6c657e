//! The seams of the engine: `StockCache` (Redis), `OrderBus`/`OrderSource` (Kafka) and `Ledger`
//! (MySQL). Services are generic over these traits; the embedded backend, the real adapters and
//! the simulated nodes implement them, and `seckill-testkit` holds one suite per trait that
//! every implementation must pass — that is what lets a simulation verdict carry over.
//!
//! Errors are split the way a caller must treat them (DESIGN §3): `Determinate` means the
//! operation certainly did not happen; `Indeterminate` means it may have (a timeout, a lost
//! reply). An indeterminate outcome is never retried or compensated blindly: it leaves an open
//! reservation that the reconciler settles.

use crate::domain::{
    Activity, ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

pub use seckill_invariants::OrderStatus;

/// A port's failure: what was attempted (`op`), why it failed, and — from a real store — the
/// client's error that caused it (`source`, for the log's chain of causes). Two errors are equal
/// when their kind, op and reason are: the cause is neither compared nor serialized (a simulated
/// node's error crosses the simulated network without it).
#[derive(Clone, thiserror::Error, Serialize, Deserialize)]
pub enum PortError {
    #[error("{op} did not happen: {reason}")]
    Determinate {
        op: String,
        reason: String,
        #[serde(skip)]
        source: Option<Cause>,
    },
    #[error("{op} outcome unknown: {reason}")]
    Indeterminate {
        op: String,
        reason: String,
        #[serde(skip)]
        source: Option<Cause>,
    },
}

/// The error a port's failure came from (a store client's), shared so that the error stays
/// `Clone`.
#[derive(Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PortError {
    pub fn determinate(op: &'static str, reason: impl Into<String>) -> Self {
        PortError::Determinate {
            op: op.to_string(),
            reason: reason.into(),
            source: None,
        }
    }

    pub fn indeterminate(op: &'static str, reason: impl Into<String>) -> Self {
        PortError::Indeterminate {
            op: op.to_string(),
            reason: reason.into(),
            source: None,
        }
    }

    /// `determinate`, its reason the client's error `e`, which it keeps as its source.
    pub fn determinate_from(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        PortError::determinate(op, e.to_string()).caused_by(e)
    }

    /// `indeterminate`, its reason the client's error `e`, which it keeps as its source.
    pub fn indeterminate_from(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        PortError::indeterminate(op, e.to_string()).caused_by(e)
    }

    /// The same failure, caused by `e`.
    pub fn caused_by(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        let (PortError::Determinate { source, .. } | PortError::Indeterminate { source, .. }) = &mut self;
        *source = Some(Cause(std::sync::Arc::new(e)));
        self
    }

    pub fn is_indeterminate(&self) -> bool {
        matches!(self, PortError::Indeterminate { .. })
    }

    fn parts(&self) -> (bool, &str, &str, Option<&Cause>) {
        match self {
            PortError::Determinate { op, reason, source } => (false, op, reason, source.as_ref()),
            PortError::Indeterminate { op, reason, source } => (true, op, reason, source.as_ref()),
        }
    }
}

impl PartialEq for PortError {
    fn eq(&self, other: &Self) -> bool {
        let ((a, b, c, _), (x, y, z, _)) = (self.parts(), other.parts());
        (a, b, c) == (x, y, z)
    }
}

impl Eq for PortError {}

/// As derived, but for the source, shown only when there is one.
impl std::fmt::Debug for PortError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (indeterminate, op, reason, source) = self.parts();
        let name = if indeterminate {
            "Indeterminate"
        } else {
            "Determinate"
        };
        let mut d = f.debug_struct(name);
        d.field("op", &op).field("reason", &reason);
        if let Some(s) = source {
            d.field("source", s);
        }
        d.finish()
    }
}

pub type PortResult<T> = Result<T, PortError>;

// ---------------------------------------------------------------------------------------------
// StockCache (Redis)

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WarmupReport {
    /// Buckets whose stock key this warmup created.
    pub created: u32,
    /// Buckets that were already warm and were left untouched.
    pub existing: u32,
    /// Buckets found warmed once and lost since (a gate without its stock key: Redis lost data
    /// after whatever check came before). None is refilled from the plan, and when any is
    /// found nothing past the buckets is written: the activity needs a recovery.
    pub lost: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// Units taken; `Reservation::bucket` says from which bucket (own or fallback).
    Reserved(Reservation),
    /// The user already holds a unit (or has a fallback attempt in flight).
    Duplicate,
    /// The user's bucket is empty, and so is the fallback (when the plan has one).
    Empty,
    /// The activity's stock keys are missing: not warmed, or lost with a Redis restart.
    NotWarmed,
    /// The bucket's gate is not open (paused, closed, recovering; a missing gate is closed):
    /// nothing was taken. The gate, not any engine's cache, is what enforces the state.
    Gated(ActivityState),
}

/// Why units go back, which decides what happens to the buyer mark and to idempotency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseKind {
    /// The order never reached the bus (determinate publish failure): the user may retry.
    Unpublished,
    /// The ledger refused the order (the user already holds another): the mark stays.
    Rejected,
    /// A durable order was cancelled: units go back exactly once per reservation.
    Cancelled,
}

/// What giving up an old pending-fallback mark did (`StockCache::give_up_pending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// The user holds a fallback unit: the mark stays (the pending field goes).
    Kept,
    /// Voided and cleared: the user may try again.
    Cleared,
    /// The attempt's unit is still open: left to its purchase (or a later pass).
    InFlight,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The units went back.
    Released,
    /// Nothing to give back: not open (settled, already released, or lost with Redis data).
    Absent,
    /// An `Unpublished` release found the reservation adopted by the reconciler, which is
    /// republishing it: it stays open, and its order is on its way.
    Adopted,
}

impl Released {
    pub fn is_released(self) -> bool {
        self == Released::Released
    }
}

/// `sk:{A}:meta` as read back: the plan's shape, the epoch and the recovery claim (§11.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaView {
    pub version: String,
    pub buckets: u32,
    /// The Redis run id at the last warmup or rebuild; `None` if never recorded.
    pub epoch: Option<String>,
    /// Rebalancing rounds so far (engines drop their sold-out flags when it changes).
    pub moves: u64,
    /// The fence of a recovery that claimed the activity and has not finished (live or not).
    pub claim: Option<String>,
}

/// The operator's intent as the registry holds it, with what every gate needs to apply it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// Open, paused or closed (never recovering: that is a gate's state, not an intent).
    pub state: ActivityState,
    /// Bumped by every change of intent: a gate never takes an older one over a newer one.
    pub version: u64,
    /// Bumped by every recovery: orders reserved under an older one are refused by the ledger.
    pub generation: u64,
}

impl Intent {
    /// A newly installed activity: open, version 1, generation 0.
    pub const FIRST: Intent = Intent {
        state: ActivityState::Open,
        version: 1,
        generation: 0,
    };
}

/// One bucket's gate, `sk:{A.b}:gate`, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// What `reserve.lua` obeys: only `Open` sells.
    pub state: ActivityState,
    /// The intent the gate holds (the reopen's target while recovering).
    pub intent: ActivityState,
    pub version: u64,
    pub generation: u64,
    /// The claim that closed it (recovering only).
    pub fence: Option<String>,
}

/// What a warmup may write a missing stock key from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmFrom {
    /// An activity installed by this warmup: the plan's figures are the ledger's.
    Plan,
    /// An activity installed before: a missing stock key is `lost` (whatever else Redis lost
    /// with it, the gate too), never written from the plan — it may have sold since (DESIGN
    /// §11.2: a warmup of an installed activity never writes stock from the plan's figures).
    Installed,
}

/// What writing an intent to one gate did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateWrite {
    Applied,
    /// The gate is recovering: the intent is recorded there and the reopen applies it.
    Recorded,
    /// The gate already holds a newer intent.
    Stale,
    /// No gate (Redis lost it): the bucket sells nothing until recovery reopens it.
    Missing,
}

/// What a recovery claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Claimed (`previous`: the expired claim taken over, if any).
    Claimed { previous: Option<String> },
    /// Another runner holds a live claim.
    Busy { fence: String, ms_left: u64 },
}

/// What a fenced rebuild of one bucket did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuilt {
    Done,
    /// The gate does not carry this fence: another recovery owns the bucket now.
    Fenced,
    /// An open reservation the ledger does not hold is still in the outbox: nothing written.
    Open(ReservationId),
}

/// A pending-fallback mark: the user's own bucket was empty and a fallback attempt started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMark {
    pub user: UserId,
    pub reservation: ReservationId,
    pub since_ms: u64,
}

/// Units moved from one bucket to another by the rebalancer; `id` makes every step idempotent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub id: String,
    pub from: BucketNo,
    pub to: BucketNo,
    pub units: u64,
    /// The generation of the gates it is taken under (DESIGN §11.3): the take refuses another,
    /// and the ledger refuses a transfer of an older generation than the registry's — a take a
    /// recovery's rebuild undid (its snapshot came first) must not move its units again.
    pub generation: u64,
}

/// What a bucket is rebuilt to after Redis lost data: computed from the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketImage {
    pub stock: u64,
    /// Users marked in this bucket: everyone who routes here and holds a live (non-failed)
    /// order, and everyone whose live order took a unit from here.
    pub buyers: Vec<UserId>,
    /// The reservations of this bucket the ledger holds (any status): their outbox entries go.
    /// Any other open reservation makes the rebuild refuse.
    pub held: Vec<ReservationId>,
    /// Cancelled orders of this bucket whose units are already back (keeps `cancelled`
    /// releases idempotent across the rebuild).
    pub cancelled_released: Vec<(ReservationId, u32)>,
    /// The journal's transfers out of this bucket (kept as completed take + ack marks) and into
    /// it (give marks): `stock + open + sold − in + out = initial` still holds after the rebuild,
    /// and a transfer half done across it is never applied twice.
    pub transfers_out: Vec<Transfer>,
    pub transfers_in: Vec<Transfer>,
}

/// One bucket's keys as read back, for audit, invariants and the reconciler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheBucket {
    pub bucket: BucketNo,
    /// `None` when the stock key is missing.
    pub stock: Option<i64>,
    pub buyers: Vec<UserId>,
    pub open: Vec<Reservation>,
    /// Pending-fallback marks left by attempts that have not resolved (yet).
    pub pending: Vec<PendingMark>,
    /// Units given to / taken from this bucket by rebalancing.
    pub transfers_in: u64,
    pub transfers_out: u64,
    /// Reservations whose cancelled order's units came back here.
    pub cancelled_released: Vec<ReservationId>,
    /// Transfers taken from this bucket and not yet acknowledged (given and recorded everywhere).
    pub transfers_in_flight: Vec<Transfer>,
    /// The bucket's gate; `None` when missing (closed).
    pub gate: Option<Gate>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheView {
    pub meta: Option<MetaView>,
    pub buckets: Vec<CacheBucket>,
}

pub trait StockCache: Clone + Send + Sync + 'static {
    /// Install the plan: stock keys, gates at `intent` (created only where missing), the meta
    /// last, with the Redis run id read before the first key (a restart meanwhile shows as a
    /// stale epoch). Idempotent (a warm bucket is never refilled, an existing gate never
    /// rewritten); a bucket that lost its stock key is reported `lost`, never refilled.
    fn warmup(
        &self,
        plan: &StockPlan,
        intent: &Intent,
        from: WarmFrom,
    ) -> impl Future<Output = PortResult<WarmupReport>> + Send;

    /// Reserve `qty` for `user` in its own bucket, else in the fallback (DESIGN §4).
    fn reserve(
        &self,
        plan: &StockPlan,
        user: UserId,
        qty: u32,
        id: ReservationId,
        now_ms: u64,
    ) -> impl Future<Output = PortResult<ReserveOutcome>> + Send;

    /// Give a reservation's units back to its own bucket.
    fn release(
        &self,
        r: &Reservation,
        kind: ReleaseKind,
    ) -> impl Future<Output = PortResult<Released>> + Send;

    /// Free the user of an order the ledger failed (DESIGN §6: one live order per user): close
    /// its open reservation without giving units back (the ledger never took them) and clear the
    /// user's buyer mark in the bucket the unit came from and in the user's own bucket — only a
    /// mark left under the reservation's generation, and once per reservation, so a newer
    /// reservation of the user keeps its mark. `Ok(true)`: a mark was cleared.
    fn free_failed(&self, plan: &StockPlan, r: &Reservation)
        -> impl Future<Output = PortResult<bool>> + Send;

    /// Close an open reservation whose order the ledger holds. `Ok(false)`: it was not open.
    fn settle(&self, r: &Reservation) -> impl Future<Output = PortResult<bool>> + Send;

    /// Does `user` hold a buyer mark in its own bucket (a unit, or a fallback attempt)?
    fn holds(&self, plan: &StockPlan, user: UserId) -> impl Future<Output = PortResult<bool>> + Send;

    /// The reservation `id` if it is open in bucket `b`'s outbox (reserved, its order not yet
    /// settled nor released): one key read, for an order's status while it is in flight.
    fn open_reservation(
        &self,
        plan: &StockPlan,
        b: BucketNo,
        id: ReservationId,
    ) -> impl Future<Output = PortResult<Option<Reservation>>> + Send;

    fn meta(&self, activity: ActivityId) -> impl Future<Output = PortResult<Option<MetaView>>> + Send;

    /// Write the operator's intent to every gate (one script per bucket); one outcome per
    /// bucket, fallback last. After it returns, a gate not `Applied` or `Stale` sells nothing.
    fn set_gates(
        &self,
        plan: &StockPlan,
        intent: &Intent,
    ) -> impl Future<Output = PortResult<Vec<GateWrite>>> + Send;

    /// Recovery step 2: claim the activity with `fence` for `lease_ms` of Redis's own time.
    fn claim(
        &self,
        plan: &StockPlan,
        fence: &str,
        lease_ms: u64,
    ) -> impl Future<Output = PortResult<Claim>> + Send;

    /// Extend a held claim; `Ok(false)`: it is lost (expired and taken over).
    fn renew(
        &self,
        plan: &StockPlan,
        fence: &str,
        lease_ms: u64,
    ) -> impl Future<Output = PortResult<bool>> + Send;

    /// Recovery step 3: close every gate with the fence (`recovering`). `generation` is the
    /// registry's as the caller read it before its claim: `Ok(false)` when a gate carries a newer
    /// one (a recovery the caller did not see has reopened it: the caller's claim is stale, and
    /// it closes no further gate).
    fn close_gates(
        &self,
        plan: &StockPlan,
        fence: &str,
        generation: u64,
    ) -> impl Future<Output = PortResult<bool>> + Send;

    /// Recovery step 7, one bucket: reopen its gate to `intent` (or the newer intent the gate
    /// holds) with the intent's generation. `Ok(false)`: the gate does not carry the fence.
    fn reopen(
        &self,
        plan: &StockPlan,
        bucket: BucketNo,
        fence: &str,
        intent: &Intent,
    ) -> impl Future<Output = PortResult<bool>> + Send;

    /// Recovery's end: drop the claim and record `epoch`. `Ok(false)`: the claim was lost.
    fn finish(
        &self,
        plan: &StockPlan,
        fence: &str,
        epoch: &str,
    ) -> impl Future<Output = PortResult<bool>> + Send;

    /// The reconciler takes over an open reservation before republishing it; from then on the
    /// purchase path's `Unpublished` release leaves it alone. `Ok(false)`: not open.
    fn adopt(&self, r: &Reservation) -> impl Future<Output = PortResult<bool>> + Send;

    /// The Redis server's run id now: it changes whenever Redis restarts.
    fn epoch(&self) -> impl Future<Output = PortResult<String>> + Send;

    /// Settle the pending-fallback mark of `attempt`: `keep` the user's mark (it holds a fallback
    /// unit) or clear it. A mark that is not this attempt's (another attempt's, or none) is left
    /// alone: a late resolve must not clear a newer reservation's mark.
    fn resolve_pending(
        &self,
        plan: &StockPlan,
        user: UserId,
        attempt: ReservationId,
        keep: bool,
    ) -> impl Future<Output = PortResult<()>> + Send;

    /// Give up a pending-fallback attempt nobody resolved (the reconciler, once the mark is old):
    /// decided in the fallback bucket, atomically — the attempt's unit still open there is left
    /// to its purchase; a user holding a unit there keeps the mark; else the attempt's id is
    /// voided (a fallback reserve of it arriving later takes nothing) and the mark cleared.
    fn give_up_pending(
        &self,
        plan: &StockPlan,
        user: UserId,
        attempt: ReservationId,
    ) -> impl Future<Output = PortResult<GaveUp>> + Send;

    /// Take `t.units` from `t.from` for a transfer (idempotent by id). `Ok(false)`: not enough
    /// stock, or the gate is not open under `t.generation`.
    fn take(&self, plan: &StockPlan, t: &Transfer) -> impl Future<Output = PortResult<bool>> + Send;

    /// Give the transfer's units to `t.to` (idempotent by id).
    fn give(&self, plan: &StockPlan, t: &Transfer) -> impl Future<Output = PortResult<()>> + Send;

    /// Mark the transfer complete on its source bucket.
    fn ack(&self, plan: &StockPlan, t: &Transfer) -> impl Future<Output = PortResult<()>> + Send;

    /// Record that units moved (bumps `moves` in the meta): engines re-offer drained buckets.
    fn note_moves(&self, activity: ActivityId) -> impl Future<Output = PortResult<()>> + Send;

    /// Replace one bucket's keys with `image`, only under the recovery's fence (§11.3 step 6).
    fn rebuild(
        &self,
        plan: &StockPlan,
        bucket: BucketNo,
        fence: &str,
        image: &BucketImage,
    ) -> impl Future<Output = PortResult<Rebuilt>> + Send;

    fn snapshot(&self, plan: &StockPlan) -> impl Future<Output = PortResult<CacheView>> + Send;

    /// `snapshot` without the buyer sets (`buyers` left empty): what the jobs need every few
    /// seconds, without reading a set that grows with the sale.
    fn summary(&self, plan: &StockPlan) -> impl Future<Output = PortResult<CacheView>> + Send;
}

// ---------------------------------------------------------------------------------------------
// OrderBus (Kafka)

/// One record handed to a consumer. The payload is raw: decoding (and dead-lettering what does
/// not decode) is the consumer's job, shared by every bus implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    pub key: String,
    pub payload: Vec<u8>,
    /// The publisher's trace context (`traceparent`), when the bus carries one (Kafka: a header).
    #[serde(default)]
    pub trace: Option<String>,
}

/// A record on the dead-letter topic: where it sits there, where the consumer read it, why it
/// went there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Its place in the dead-letter topic (what an operator's show, replay and purge name).
    pub partition: u32,
    pub offset: u64,
    /// Where it was on the order topic (`topic/partition@offset`).
    pub origin: String,
    pub key: String,
    pub payload: Vec<u8>,
    pub reason: String,
}

/// Part of the dead-letter topic, read partition by partition, oldest first in each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterPage {
    pub letters: Vec<DeadLetter>,
    /// Records the topic holds in all, on this page and beyond it.
    pub total: u64,
    /// Where the next page starts (`None`: this page reached the end of every partition).
    pub next: Option<(u32, u64)>,
    /// Each partition's end as it was read: a purge below these deletes the `total` records
    /// counted here and nothing that arrived since.
    pub ends: Vec<(u32, u64)>,
}

pub trait OrderBus: Clone + Send + Sync + 'static {
    type Source: OrderSource;

    /// Publish an order event keyed `A.b`. `Indeterminate`: it may or may not have been stored.
    fn publish(&self, r: &Reservation) -> impl Future<Output = PortResult<()>> + Send;

    /// Publish arbitrary bytes (replaying a dead letter, or a test's malformed message).
    fn publish_raw(&self, key: &str, payload: &[u8]) -> impl Future<Output = PortResult<()>> + Send;

    /// Records published but not yet committed by `group` (zero: the topic is drained).
    fn lag(&self, group: &str) -> impl Future<Output = PortResult<u64>> + Send;

    /// Why no broker can be reached right now, as far as this client knows (`None`: reachable,
    /// or merely slow). Cheap and synchronous: the purchase path asks before every reserve and
    /// answers 503 instead of reserving units it could not publish (DESIGN §12).
    fn known_down(&self) -> Option<String> {
        None
    }

    /// Ask a broker whether it answers and remember the answer for `known_down` (the API role's
    /// refresher calls it every period, so a bus that came back is seen without a purchase).
    fn probe(&self) -> impl Future<Output = PortResult<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Up to `limit` dead letters from `from` = (partition, offset) on: the rest of that partition,
    /// then every later partition from its start.
    fn dead_letters(
        &self,
        from: (u32, u64),
        limit: usize,
    ) -> impl Future<Output = PortResult<DeadLetterPage>> + Send;

    /// Delete the dead letters below each (partition, offset) given (Kafka's DeleteRecords: what
    /// arrived after an operator looked stays); how many went.
    fn purge_dead_letters(&self, before: &[(u32, u64)]) -> impl Future<Output = PortResult<u64>> + Send;

    /// Join the consumer group `group`. Positions start at the group's committed offsets, so
    /// whatever a previous member polled but did not commit is delivered again.
    fn subscribe(&self, group: &str) -> impl Future<Output = PortResult<Self::Source>> + Send;
}

pub trait OrderSource: Send + 'static {
    /// Up to `max` deliveries; waits a bounded time and returns an empty batch if none came.
    fn poll(&mut self, max: usize) -> impl Future<Output = PortResult<Vec<Delivery>>> + Send;

    /// Commit past every delivery in `batch` (called only after the ledger committed them).
    fn commit(&mut self, batch: &[Delivery]) -> impl Future<Output = PortResult<()>> + Send;

    /// Move a delivery that can never be applied to the dead-letter topic, with the reason.
    fn dead_letter(&mut self, d: &Delivery, reason: &str) -> impl Future<Output = PortResult<()>> + Send;

    /// Forget uncommitted progress: the next poll starts again at the committed offsets.
    fn rewind(&mut self) -> impl Future<Output = PortResult<()>> + Send;
}

// ---------------------------------------------------------------------------------------------
// Ledger (MySQL)

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyOutcome {
    /// A new order; the bucket's stock went down by its quantity.
    Created,
    /// This reservation is already an order (the bus redelivered it): nothing changed.
    Redelivered,
    /// The user already has an order from another reservation: this one must be released.
    DuplicateBuyer { existing: ReservationId },
    /// The bucket's ledger stock cannot cover it: recorded as a failed order.
    OutOfStock,
    /// The event names an activity or bucket the ledger does not have: nothing changed.
    UnknownBucket,
    /// Reserved under a generation older than the registry's (a process paused past a recovery
    /// published it): recorded as a failed order, the user can see it; no stock moves.
    StaleGeneration,
}

/// An activity as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub activity: Activity,
    pub intent: Intent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRow {
    pub reservation: Reservation,
    pub status: OrderStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayOutcome {
    Paid,
    AlreadyPaid,
    /// Paid already, by another payment (its id).
    PaidWithOther(String),
    /// Cancelled or failed orders cannot be paid; no stock moves.
    NotPayable(OrderStatus),
    NotFound,
}

/// What a buyer's cancel did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelOutcome {
    /// Cancelled now: the unit is back in the ledger and must go back to Redis (to its own bucket).
    Cancelled(Reservation),
    AlreadyCancelled,
    /// Paid or failed orders cannot be cancelled here; no stock moves.
    NotCancellable(OrderStatus),
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalKind {
    Order,
    Cancel,
    Transfer,
    Adjust,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub bucket: BucketNo,
    pub kind: JournalKind,
    /// The reservation or transfer id the movement belongs to.
    pub reference: String,
    pub delta: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerBucket {
    pub bucket: BucketNo,
    pub initial: u64,
    pub remaining: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LedgerView {
    pub buckets: Vec<LedgerBucket>,
    pub orders: Vec<OrderRow>,
    pub journal: Vec<JournalEntry>,
}

pub trait Ledger: Clone + Send + Sync + 'static {
    /// Cancel every created (unpaid) order of the activity whose payment window closed by
    /// `now_ms`: status cancelled, stock back to its bucket, a `cancel` journal row — once per
    /// order. Returns the reservations cancelled now, whose units must go back to Redis.
    fn cancel_unpaid(
        &self,
        activity: ActivityId,
        now_ms: u64,
    ) -> impl Future<Output = PortResult<Vec<Reservation>>> + Send;

    /// Record the activity and its `stock_bucket` rows; idempotent. `Ok(true)` if it created them.
    fn install(&self, activity: &Activity, plan: &StockPlan)
        -> impl Future<Output = PortResult<bool>> + Send;

    /// Apply a batch in ONE transaction; one outcome per event, in order. An error means none of
    /// the batch was applied (`Determinate`) or the commit's outcome is unknown (`Indeterminate`);
    /// either way the batch is delivered again and dedupes by reservation id.
    fn apply(&self, batch: &[Reservation]) -> impl Future<Output = PortResult<Vec<ApplyOutcome>>> + Send;

    /// The payment provider confirmed `payment` for the order (DESIGN §12): created → paid,
    /// recording the payment id; the same payment again answers `AlreadyPaid`, another one
    /// `PaidWithOther` (a double charge: the shop refunds it). No stock moves.
    fn pay(&self, id: ReservationId, payment: &str) -> impl Future<Output = PortResult<PayOutcome>> + Send;

    /// One order by its reservation id (ownership checks, the admin view).
    fn order(&self, id: ReservationId) -> impl Future<Output = PortResult<Option<OrderRow>>> + Send;

    /// The buyer cancels a created (unpaid) order: status cancelled, stock back to its bucket, a
    /// `cancel` journal row — once (a second cancel answers `AlreadyCancelled`).
    fn cancel(&self, id: ReservationId) -> impl Future<Output = PortResult<CancelOutcome>> + Send;

    /// The activity as installed.
    fn activity(&self, id: ActivityId) -> impl Future<Output = PortResult<Option<Activity>>> + Send;

    /// The registry row (§11.2): the activity, the operator's intent and the generation.
    fn registry(&self, id: ActivityId) -> impl Future<Output = PortResult<Option<Registered>>> + Send;

    /// Every installed activity's registry row: what every API process loads and polls.
    fn registered(&self) -> impl Future<Output = PortResult<Vec<Registered>>> + Send;

    /// Record the operator's intent (open, paused or closed); bumps the version. `Ok(None)`:
    /// no such activity.
    fn set_intent(
        &self,
        id: ActivityId,
        state: ActivityState,
    ) -> impl Future<Output = PortResult<Option<Intent>>> + Send;

    /// Recovery step 6: bump the activity's generation from `from` to `from + 1`, a
    /// compare-and-set; from now on `apply` refuses orders reserved under an older one. Returns
    /// the registry's intent with the new generation, or `Ok(None)` if the registry is not at
    /// `from` (another runner bumped it: this recovery was taken over, and a late bump must never
    /// put the registry ahead of the gates its successor reopened). Determinate error: no such
    /// activity.
    fn bump_generation(
        &self,
        id: ActivityId,
        from: u64,
    ) -> impl Future<Output = PortResult<Option<Intent>>> + Send;

    /// Move `t.units` of ledger stock between buckets with two `transfer` journal rows; idempotent
    /// by transfer id (`Ok(false)`: already done). The source must have the units, and differ
    /// from the target. A transfer not done yet whose generation is older than the registry's is
    /// refused (determinate): a recovery rebuilt the buckets since its take, without it.
    fn transfer(&self, activity: ActivityId, t: &Transfer) -> impl Future<Output = PortResult<bool>> + Send;

    /// The user's order in this activity, whatever its status.
    fn order_of(
        &self,
        activity: ActivityId,
        user: UserId,
    ) -> impl Future<Output = PortResult<Option<OrderRow>>> + Send;

    fn snapshot(&self, activity: ActivityId) -> impl Future<Output = PortResult<LedgerView>> + Send;

    /// What the reconciler needs of the activity, read at one point in time (one transaction):
    /// `ReconcileView::of(snapshot(activity).orders, mentioned)` — aggregates and the few rows it
    /// acts on, not every order of the sale every few seconds.
    fn reconcile_view(
        &self,
        activity: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> impl Future<Output = PortResult<ReconcileView>> + Send;
}

/// The ledger as the reconciler reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReconcileView {
    /// Units held by created or paid orders, per bucket (buckets without any are absent).
    pub sold: BTreeMap<BucketNo, u64>,
    /// The cancelled orders, by reservation id.
    pub cancelled: Vec<Reservation>,
    /// Which of the reservations asked about have an order, in any status.
    pub held: BTreeSet<ReservationId>,
    /// Which of those the ledger failed: their users are freed, not settled (DESIGN §6).
    pub failed: BTreeSet<ReservationId>,
}

impl ReconcileView {
    /// The view of a set of orders (the definition every ledger must agree with).
    pub fn of<'a>(
        orders: impl IntoIterator<Item = &'a OrderRow>,
        mentioned: &BTreeSet<ReservationId>,
    ) -> Self {
        let mut view = ReconcileView::default();
        for o in orders {
            let r = &o.reservation;
            if mentioned.contains(&r.id) {
                view.held.insert(r.id);
                if o.status == OrderStatus::Failed {
                    view.failed.insert(r.id);
                }
            }
            match o.status {
                OrderStatus::Created | OrderStatus::Paid => {
                    *view.sold.entry(r.bucket).or_default() += u64::from(r.qty)
                }
                OrderStatus::Cancelled => view.cancelled.push(r.clone()),
                OrderStatus::Failed => {}
            }
        }
        view.cancelled.sort_by_key(|r| r.id);
        view
    }
}

#[cfg(test)]
mod tests {
    use super::PortError;
    use std::error::Error;

    #[test]
    fn a_port_error_keeps_its_cause_as_its_source_and_compares_without_it() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = PortError::indeterminate_from("publish", io);
        assert_eq!(e.to_string(), "publish outcome unknown: connection refused");
        let source = e.source().expect("the client's error is the source");
        assert_eq!(source.to_string(), "connection refused");
        assert_eq!(e, PortError::indeterminate("publish", "connection refused"));
        assert_ne!(e, PortError::determinate("publish", "connection refused"));
        // Without a cause, Debug reads as the derived one did (the simulation's reports quote it).
        assert_eq!(
            format!("{:?}", PortError::determinate("reserve", "gated")),
            r#"Determinate { op: "reserve", reason: "gated" }"#
        );
        assert!(PortError::determinate("reserve", "gated").source().is_none());
    }
}
