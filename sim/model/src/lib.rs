//! An exhaustive model of the fenced recovery (DESIGN §7, §11.2, §11.3), checked with
//! `stateright`: every interleaving of a few job runners, API purchases, a worker, the
//! reconciler's republish, an operator's pause and resume, and the faults the recovery exists
//! for — Redis losing its data (a restart without persistence, a failover to a replica without
//! the last write), leases running out under a runner that stalled, records appended late.
//!
//! The simulation samples interleavings at random; this explores all of them for a small bound,
//! and either proves the properties there or prints the shortest trace it found that breaks one.
//!
//! **Tied to the code, not a second design.** Each runner step is one call (or one group of
//! reads) of `engine/core/src/jobs/recover.rs`, in the order that function makes them, and each
//! store operation mirrors the Lua script it stands for (`lua/gate.lua`, `warmup.lua`,
//! `rebuild.lua`, `release.lua`, `reserve.lua`, `settle.lua`) or the ledger's
//! `EmbeddedLedger::apply_one`: see `Step` and the functions on `State` that name a script. The
//! replay (`tests/it/replay.rs`) runs the checker's traces against the embedded stores through
//! the engine's own `recover_if_needed`, one store call at a time, and checks after every step
//! that the stores hold what the model says.
//!
//! What the model leaves out, on purpose: quantities (every reservation is one unit), the
//! reserve's fallback to the fallback bucket (which the model keeps empty), transfers, cancels
//! and payments (their marks survive a rebuild by the journal, which no step here touches), and
//! time except as the order of events (a lease "expires" as a fault at any moment; a runner that
//! is not scheduled is a runner that stalled).

use std::collections::HashMap;
use std::sync::Mutex;

use stateright::{Model, Property};

/// Planted bugs the model can express: each is a one-line change of a step, as the engine's
/// `planted::Bug` of the same name is of the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The ledger applies orders of any generation.
    NoGenerationCheck,
    /// The bump is an unconditional `generation + 1` (as it was before the compare-and-set).
    UnfencedBump,
    /// A runner ignores other claims and the gates' fences (closes them again with its own).
    RecoveryWithoutFence,
    /// No publish window and no drain before the rescue and the rebuild.
    RebuildWhileInFlight,
    /// The reopen returns to the intent read at the rescue, over a later pause.
    ReopenOverPause,
    /// The rebuild drops the outbox instead of rescuing it.
    RebuildDropsOutbox,
    /// The rescue republishes the outbox (and drains) instead of applying it to the ledger.
    RescueRepublished,
    /// The rebuild marks the users of failed orders as buyers.
    FailedOrderLocksOut,
}

impl Bug {
    pub const ALL: [Bug; 8] = [
        Bug::NoGenerationCheck,
        Bug::UnfencedBump,
        Bug::RecoveryWithoutFence,
        Bug::RebuildWhileInFlight,
        Bug::ReopenOverPause,
        Bug::RebuildDropsOutbox,
        Bug::RescueRepublished,
        Bug::FailedOrderLocksOut,
    ];

    /// The engine's name for it (`seckill_core::planted::Bug::name`).
    pub fn name(self) -> &'static str {
        match self {
            Bug::NoGenerationCheck => "no_generation_check",
            Bug::UnfencedBump => "unfenced_bump",
            Bug::RecoveryWithoutFence => "recovery_without_fence",
            Bug::RebuildWhileInFlight => "rebuild_while_in_flight",
            Bug::ReopenOverPause => "reopen_over_pause",
            Bug::RebuildDropsOutbox => "rebuild_drops_outbox",
            Bug::RescueRepublished => "rescue_republished",
            Bug::FailedOrderLocksOut => "failed_order_locks_out",
        }
    }

    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// The bound: how many of each actor and fault, and the plan. As in `StockPlan`, the last
/// bucket is the fallback (no user routes to it; the model never falls back, so it holds 0).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    pub runners: u8,
    /// Units per bucket, the fallback bucket last.
    pub stock: Vec<u8>,
    /// Each user's own bucket (`StockPlan::route`); every user buys one unit.
    pub routes: Vec<u8>,
    /// Reserve attempts per user (a retry follows an answer that took nothing, or a 503).
    pub attempts_per_user: u8,
    /// Claims per runner (each abort costs one; a runner out of claims stops).
    pub claims_per_runner: u8,
    /// Redis data losses (restart without persistence, failover losing the last write).
    pub losses: u8,
    /// Leases that run out under a runner that did not renew in time.
    pub expiries: u8,
    /// Whether the operator pauses (and later resumes) the sale once.
    pub operator: bool,
}

impl Bound {
    /// `business` buckets of one unit each (and the fallback), `users` routed round robin.
    pub fn plan(business: u8, users: u8) -> (Vec<u8>, Vec<u8>) {
        let mut stock = vec![1; business as usize];
        stock.push(0);
        (stock, (0..users).map(|u| u % business).collect())
    }

    /// The bound CI checks in full: 2 runners × 2 buckets of stock (and the empty fallback),
    /// a user in each, a Redis loss, an expiry, an operator.
    pub fn ci() -> Bound {
        let (stock, routes) = Bound::plan(2, 2);
        Bound {
            runners: 2,
            stock,
            routes,
            attempts_per_user: 1,
            claims_per_runner: 2,
            losses: 1,
            expiries: 1,
            operator: true,
        }
    }

    pub fn buckets(&self) -> u8 {
        self.stock.len() as u8
    }

    pub fn users(&self) -> u8 {
        self.routes.len() as u8
    }

    fn rids(&self) -> u8 {
        self.users() * self.attempts_per_user
    }

    fn user_of(&self, rid: Rid) -> u8 {
        rid / self.attempts_per_user
    }

    fn route(&self, user: u8) -> usize {
        self.routes[user as usize] as usize
    }

    /// The ledger holds a live (created) order of `user`: its UNIQUE(activity, live user).
    fn has_live_order(&self, l: &Ledger, user: u8) -> bool {
        (0..self.rids()).any(|r| {
            self.user_of(r) == user
                && l.orders[r as usize]
                    .as_ref()
                    .is_some_and(|o| o.status == Status::Created)
        })
    }

    fn bucket_of(&self, rid: Rid) -> usize {
        self.route(self.user_of(rid))
    }
}

/// A reservation id: `user * attempts_per_user + attempt`.
pub type Rid = u8;
/// A recovery claim's fence: `claim * runners + runner`, unique per claim.
pub type Fence = u8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intent {
    Open,
    Paused,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateState {
    Sells,
    Paused,
    Closed,
    Recovering,
}

impl From<Intent> for GateState {
    fn from(i: Intent) -> GateState {
        match i {
            Intent::Open => GateState::Sells,
            Intent::Paused => GateState::Paused,
            Intent::Closed => GateState::Closed,
        }
    }
}

/// `sk:{A.b}:gate` (gate.lua).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gate {
    pub state: GateState,
    pub intent: Intent,
    pub version: u8,
    pub generation: u8,
    pub fence: Option<Fence>,
}

/// An open reservation in `sk:{A.b}:resv` (the outbox).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub rid: Rid,
    pub generation: u8,
    /// `|r`: adopted by a rescue or a republish (an `unpublished` release refuses it).
    pub adopted: bool,
}

/// One bucket's keys. `None` keys are missing (Redis lost them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bucket {
    pub stock: Option<u8>,
    /// `buyers`, one bit per user.
    pub buyers: u32,
    pub resv: Vec<Entry>,
    /// `xfer` field `fail:<rid>`, one bit per reservation.
    pub failed: u32,
    pub gate: Option<Gate>,
}

/// `sk:{A}:meta` (warmup.lua).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    pub claim: Option<Fence>,
    /// The claim's deadline has not passed (Redis `TIME`).
    pub live: bool,
    pub epoch: Option<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Redis {
    /// `INFO server` → `run_id`: new after every restart or failover.
    pub run_id: u8,
    pub meta: Option<Meta>,
    pub buckets: Vec<Bucket>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Created,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Order {
    pub generation: u8,
    pub status: Status,
}

/// The ledger (MySQL): the registry row and the orders.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ledger {
    pub intent: Intent,
    pub version: u8,
    pub generation: u8,
    pub remaining: Vec<u8>,
    /// By reservation id.
    pub orders: Vec<Option<Order>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Created,
    Redelivered,
    DuplicateBuyer,
    OutOfStock,
    StaleGeneration,
}

/// A record on the order topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub rid: Rid,
    pub generation: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FollowUp {
    /// settle.lua
    Settle,
    /// release.lua "rejected"
    Release,
    /// release.lua "failed" (`StockCache::free_failed`)
    Free,
}

/// What a user was told about their latest attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Told {
    Nothing,
    /// reserve.lua took a unit under the gate's generation; the publish is under way.
    Publishing(Rid, u8),
    Queued(Rid),
    /// Gated, not warmed, duplicate, sold out, or a 503 after a failed publish: nothing held.
    Refused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Purchase {
    pub attempts: u8,
    pub told: Told,
}

/// The operator pausing the sale once, then resuming it (`service::admin`: the registry's
/// intent first, then every gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    Idle,
    Pausing(u8),
    Paused,
    Resuming(u8),
    Done,
}

/// Where a runner is in `recover_if_needed`: the step it takes next. Each names the calls it
/// stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `registered`: `Ledger::registry` → G0.
    Registry,
    /// `needs_recovery`: `epoch` + `summary`.
    Detect,
    /// `claim_and_recover`: `epoch` → E, then warmup.lua "claim".
    Claim,
    /// `needed_besides(own)`: `epoch` + `summary` (the claim took nothing over).
    Recheck,
    /// Nothing needed after all: `epoch` + warmup.lua "finish".
    FinishUnneeded,
    /// `close_gates`: gate.lua "close" on bucket b.
    Close(u8),
    /// `wait(quiesce)`: one renewal (warmup.lua "renew" + `epoch`).
    Wait,
    /// `drain`: `OrderBus::lag` until 0.
    Drain,
    /// `registered` again → G1.
    RescueRegistry,
    /// `summary` + `Ledger::reconcile_view`: the outbox the ledger lacks.
    Outbox,
    /// `keep_if_due`, then release.lua "adopt" on each.
    Adopt,
    /// `Ledger::apply` of the adopted, stamped G1.
    RescueApply,
    /// release.lua "rejected" for each duplicate buyer.
    RescueRelease,
    /// Planted `RescueRepublished`: the adopted published, then drained.
    RescueDrain,
    /// `held.keep()` after the rescue.
    KeepRescued,
    /// `Ledger::bump_generation(from G1)` → G2.
    Bump,
    /// `Ledger::snapshot`.
    Snapshot,
    /// Planted `RecoveryWithoutFence`: gate.lua "close" on every bucket with its own fence.
    Steal(u8),
    /// rebuild.lua on bucket b.
    Rebuild(u8),
    /// `held.keep()` after the rebuild.
    KeepRebuilt,
    /// `Ledger::registry`: the intent to reopen to.
    Intent,
    /// gate.lua "reopen" on bucket b.
    Reopen(u8),
    /// warmup.lua "finish" with E.
    Finish,
    /// An error: `Held::release` (warmup.lua "renew" with lease 0).
    Release,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Runner {
    pub step: Step,
    pub claims: u8,
    /// A lease went by since its last renewal (its next `keep_if_due` renews).
    pub due: bool,
    pub fence: Fence,
    /// Redis's run id before the claim.
    pub epoch: u8,
    pub g0: u8,
    pub g1: u8,
    pub g2: u8,
    /// Reservations to rescue (one bit each), or adopted, or duplicates, by step.
    pub outbox: u32,
    /// Planted `RebuildDropsOutbox`: the open reservations seen at the rescue.
    pub dropped: u32,
    /// The records visible on the topic when it closed its first gate.
    pub visible: u32,
    pub snapshot: Option<Ledger>,
    /// The reopen's intent, version and generation.
    pub target: Option<(Intent, u8, u8)>,
}

impl Runner {
    fn idle(claims: u8) -> Runner {
        Runner {
            step: Step::Registry,
            claims,
            due: false,
            fence: 0,
            epoch: 0,
            g0: 0,
            g1: 0,
            g2: 0,
            outbox: 0,
            dropped: 0,
            visible: 0,
            snapshot: None,
            target: None,
        }
    }
}

/// What the properties read: facts about the history, kept beside the state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Reservations whose open entry a Redis loss dropped.
    pub lost: u32,
    /// The highest generation a rebuild wrote.
    pub rebuilt: u8,
    /// The operator's pause returned, and Redis lost nothing since the call began (a loss can
    /// take the pause's gate writes with it: sales go on until a recovery closes the gates).
    pub paused: bool,
    /// The operator's call in progress met no Redis loss so far.
    pub call_intact: bool,
    pub recoveries: u8,
    /// Violations seen on a step (the state keeps them: a property reads them).
    pub stale_counted: bool,
    pub queued_refused: bool,
    pub sold_while_paused: bool,
    /// A bump while a record visible at its runner's close was not yet applied.
    pub drain_skipped: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub redis: Redis,
    /// Redis before its last write: what a replica that missed it holds.
    pub replica: Option<Redis>,
    pub ledger: Ledger,
    /// Published, not yet visible to the consumer.
    pub inflight: Vec<Msg>,
    /// Visible, not yet applied.
    pub topic: Vec<Msg>,
    /// Applied; the worker's Redis follow-up not yet done.
    pub followups: Vec<(Msg, FollowUp)>,
    pub purchases: Vec<Purchase>,
    pub runners: Vec<Runner>,
    pub operator: Operator,
    pub losses: u8,
    pub expiries: u8,
    pub ghost: Ghost,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// reserve.lua "own" for the user's next attempt.
    Reserve(u8),
    /// `OrderBus::publish` acknowledged: the user is told "queued".
    Published(u8),
    /// The publish timed out and the record was never appended: still "queued" (the outbox).
    PublishLost(u8),
    /// The publish failed determinately: release.lua "unpublished", a 503.
    PublishFailed(u8),
    /// A record becomes visible on the topic (late, in any order).
    Visible(Msg),
    /// The worker: `Ledger::apply` of one record, then its offset committed.
    Apply(Msg),
    /// The worker's Redis follow-up of an applied record.
    FollowUp(Msg, FollowUp),
    /// The reconciler: release.lua "adopt", then publish again.
    Republish(Rid),
    /// The operator's next call.
    Operator(Operator),
    /// A runner's next step.
    Runner(u8, Step),
    LeaseExpires,
    RedisRestartsEmpty,
    RedisFailsOver,
}

impl Action {
    /// Faults: what a fair continuation without faults leaves out.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::LeaseExpires
                | Action::RedisRestartsEmpty
                | Action::RedisFailsOver
                | Action::PublishLost(_)
                | Action::PublishFailed(_)
        )
    }
}

pub struct Recovery {
    pub bound: Bound,
    pub bug: Option<Bug>,
    /// Whether a state reaches quiescence by a fair run without faults (states on such a run
    /// share its answer).
    settles: Mutex<HashMap<u64, bool>>,
}

impl Recovery {
    pub fn new(bound: Bound, bug: Option<Bug>) -> Recovery {
        Recovery {
            bound,
            bug,
            settles: Mutex::new(HashMap::new()),
        }
    }

    fn planted(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    pub fn initial(&self) -> State {
        let b = &self.bound;
        let gate = Gate {
            state: GateState::Sells,
            intent: Intent::Open,
            version: 1,
            generation: 0,
            fence: None,
        };
        State {
            redis: Redis {
                run_id: 0,
                meta: Some(Meta {
                    claim: None,
                    live: false,
                    epoch: Some(0),
                }),
                buckets: (b.stock.iter())
                    .map(|&units| Bucket {
                        stock: Some(units),
                        buyers: 0,
                        resv: vec![],
                        failed: 0,
                        gate: Some(gate.clone()),
                    })
                    .collect(),
            },
            replica: None,
            ledger: Ledger {
                intent: Intent::Open,
                version: 1,
                generation: 0,
                remaining: b.stock.clone(),
                orders: vec![None; b.rids() as usize],
            },
            inflight: vec![],
            topic: vec![],
            followups: vec![],
            purchases: vec![
                Purchase {
                    attempts: 0,
                    told: Told::Nothing
                };
                b.users() as usize
            ],
            runners: (0..b.runners).map(|_| Runner::idle(0)).collect(),
            operator: if b.operator {
                Operator::Idle
            } else {
                Operator::Done
            },
            losses: b.losses,
            expiries: b.expiries,
            ghost: Ghost::default(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: each function is the script it names, on the model's keys.

impl State {
    /// A write of what the model does not track (the claim's deadline): a replica missing it
    /// holds what Redis holds now.
    fn wrote(&mut self) {
        if self.losses > 0 {
            self.replica = Some(self.redis.clone());
        }
    }

    /// A script's writes: `f` on Redis, and — if it changed anything — the state before it is
    /// what a replica missing this write holds (kept only while a loss can still come).
    fn write<T>(&mut self, f: impl FnOnce(&mut Redis) -> T) -> T {
        let before = (self.losses > 0).then(|| self.redis.clone());
        let out = f(&mut self.redis);
        if let Some(before) = before.filter(|b| *b != self.redis) {
            self.replica = Some(before);
        }
        out
    }

    /// Step 1's look (`needed_besides`): whether the activity needs a recovery.
    pub fn needed(&self, generation: u8, own: Option<Fence>) -> bool {
        let r = &self.redis;
        let Some(meta) = &r.meta else { return true };
        if meta.claim.is_some() && meta.claim != own {
            return true;
        }
        if meta.epoch != Some(r.run_id) {
            return true;
        }
        r.buckets.iter().any(|b| match (&b.stock, &b.gate) {
            (None, _) | (_, None) => true,
            (_, Some(g)) => g.state == GateState::Recovering || g.generation < generation,
        })
    }

    /// warmup.lua "claim": `Some(taken over)` or `None` (busy).
    fn claim(&mut self, fence: Fence) -> Option<Option<Fence>> {
        if let Some(m) = &self.redis.meta {
            if m.claim.is_some() && m.claim != Some(fence) && m.live {
                return None;
            }
        }
        // The deadline moves with every claim and renewal: a write, even where nothing else
        // changes.
        self.wrote();
        Some(self.write(|r| {
            let previous = r.meta.as_ref().and_then(|m| m.claim);
            let epoch = r.meta.as_ref().and_then(|m| m.epoch);
            r.meta = Some(Meta {
                claim: Some(fence),
                live: true,
                epoch,
            });
            previous
        }))
    }

    /// warmup.lua "renew" (lease 0: `live = false`, the next runner claims at once).
    fn renew(&mut self, fence: Fence, live: bool) -> bool {
        if self.redis.meta.as_ref().is_none_or(|m| m.claim != Some(fence)) {
            return false;
        }
        self.wrote();
        self.write(|r| r.meta.as_mut().expect("just read").live = live);
        true
    }

    /// warmup.lua "finish".
    fn finish(&mut self, fence: Fence, epoch: u8) -> bool {
        self.write(|r| match &r.meta {
            Some(m) if m.claim == Some(fence) => {
                r.meta = Some(Meta {
                    claim: None,
                    live: false,
                    epoch: Some(epoch),
                });
                true
            }
            _ => false,
        })
    }

    /// gate.lua "close": false for `{"newer"}`.
    fn close(&mut self, b: usize, fence: Fence, generation: u8) -> bool {
        self.write(|r| {
            if r.buckets[b]
                .gate
                .as_ref()
                .is_some_and(|g| g.generation > generation)
            {
                return false;
            }
            let g = r.buckets[b].gate.get_or_insert(Gate {
                state: GateState::Closed,
                intent: Intent::Closed,
                version: 0,
                generation: 0,
                fence: None,
            });
            g.state = GateState::Recovering;
            g.fence = Some(fence);
            true
        })
    }

    /// gate.lua "reopen": false for `{"fenced"}`.
    fn reopen(&mut self, b: usize, fence: Fence, intent: Intent, version: u8, generation: u8) -> bool {
        self.write(|r| match r.buckets[b].gate.as_mut() {
            // Reopened already at this generation (a re-sent reopen).
            Some(g)
                if g.state != GateState::Recovering && g.fence.is_none() && g.generation == generation =>
            {
                true
            }
            Some(g) if g.state == GateState::Recovering && g.fence == Some(fence) => {
                if version > g.version {
                    g.intent = intent;
                    g.version = version;
                }
                g.state = g.intent.into();
                g.generation = generation;
                g.fence = None;
                true
            }
            _ => false,
        })
    }

    /// gate.lua "set" (the operator).
    fn set_gate(&mut self, b: usize, intent: Intent, version: u8) {
        self.write(|r| {
            if let Some(g) = r.buckets[b].gate.as_mut().filter(|g| version > g.version) {
                g.intent = intent;
                g.version = version;
                if g.state != GateState::Recovering {
                    g.state = intent.into();
                }
            }
        })
    }

    fn entry(&self, b: usize, rid: Rid) -> Option<&Entry> {
        self.redis.buckets[b].resv.iter().find(|e| e.rid == rid)
    }

    /// release.lua "adopt".
    fn adopt(&mut self, b: usize, rid: Rid) -> bool {
        self.write(|r| match r.buckets[b].resv.iter_mut().find(|e| e.rid == rid) {
            Some(e) => {
                e.adopted = true;
                true
            }
            None => false,
        })
    }

    /// release.lua "unpublished" / "rejected": the units back (if the stock key is there); the
    /// buyer mark goes for "unpublished". False for `{"adopted"}`.
    fn release(&mut self, b: usize, rid: Rid, user: u8, unpublished: bool) -> bool {
        self.write(|r| {
            let bucket = &mut r.buckets[b];
            let Some(e) = bucket.resv.iter().find(|e| e.rid == rid) else {
                return true;
            };
            if unpublished && e.adopted {
                return false;
            }
            if let Some(s) = bucket.stock.as_mut() {
                *s += 1;
            }
            if unpublished {
                bucket.buyers &= !(1 << user);
            }
            bucket.resv.retain(|e| e.rid != rid);
            true
        })
    }

    /// release.lua "failed": false for `{"missing"}`.
    fn free_failed(&mut self, b: usize, rid: Rid, user: u8, generation: u8) -> bool {
        self.write(|r| {
            let bucket = &mut r.buckets[b];
            if bucket.stock.is_none() {
                return false;
            }
            bucket.resv.retain(|e| e.rid != rid);
            if bucket.failed & (1 << rid) == 0 {
                bucket.failed |= 1 << rid;
                if bucket.gate.as_ref().map(|g| g.generation) == Some(generation) {
                    bucket.buyers &= !(1 << user);
                }
            }
            true
        })
    }

    /// settle.lua.
    fn settle(&mut self, b: usize, rid: Rid) {
        self.write(|r| r.buckets[b].resv.retain(|e| e.rid != rid))
    }
}

// ---------------------------------------------------------------------------------------------
// The ledger: `EmbeddedLedger::apply_one` and the registry's compare-and-set.

impl Recovery {
    fn apply(&self, s: &mut State, m: Msg) -> Outcome {
        let b = &self.bound;
        let l = &mut s.ledger;
        if l.orders[m.rid as usize].is_some() {
            return Outcome::Redelivered;
        }
        let stale = m.generation < l.generation && !self.planted(Bug::NoGenerationCheck);
        if b.has_live_order(l, b.user_of(m.rid)) {
            return Outcome::DuplicateBuyer;
        }
        let bucket = b.bucket_of(m.rid);
        let (status, outcome) = if stale {
            (Status::Failed, Outcome::StaleGeneration)
        } else if l.remaining[bucket] >= 1 {
            l.remaining[bucket] -= 1;
            (Status::Created, Outcome::Created)
        } else {
            (Status::Failed, Outcome::OutOfStock)
        };
        l.orders[m.rid as usize] = Some(Order {
            generation: m.generation,
            status,
        });
        if outcome == Outcome::Created && m.generation < s.ghost.rebuilt {
            s.ghost.stale_counted = true;
        }
        if outcome == Outcome::StaleGeneration && s.ghost.lost & (1 << m.rid) == 0 {
            s.ghost.queued_refused = true;
        }
        outcome
    }
}

// ---------------------------------------------------------------------------------------------
// Steps.

impl Recovery {
    /// `Held::keep`: renew, then Redis's run id must still be the one before the claim.
    fn keep(&self, s: &mut State, r: usize) -> bool {
        let (fence, epoch) = (s.runners[r].fence, s.runners[r].epoch);
        s.runners[r].due = false;
        let renewed = s.renew(fence, true);
        self.planted(Bug::RecoveryWithoutFence) || (renewed && s.redis.run_id == epoch)
    }

    /// Where a runner goes when a step fails: `Held::release`.
    fn fail(&self, s: &mut State, r: usize) {
        s.runners[r].step = Step::Release;
    }

    fn next_bucket(&self, b: u8, then: Step, each: fn(u8) -> Step) -> Step {
        if b + 1 < self.bound.buckets() {
            each(b + 1)
        } else {
            then
        }
    }

    fn runner(&self, s: &mut State, r: usize, step: Step) {
        let unfenced = self.planted(Bug::RecoveryWithoutFence);
        let run = s.runners[r].clone();
        let go = |s: &mut State, step: Step| s.runners[r].step = step;
        match step {
            Step::Registry => {
                s.runners[r].g0 = s.ledger.generation;
                go(s, Step::Detect);
            }
            Step::Detect => {
                if s.needed(run.g0, None) {
                    go(s, Step::Claim)
                } else {
                    s.runners[r] = Runner::idle(run.claims);
                }
            }
            Step::Claim => {
                let fence = run.claims * self.bound.runners + r as u8;
                let epoch = s.redis.run_id;
                match s.claim(fence) {
                    None if !unfenced => s.runners[r] = Runner::idle(run.claims),
                    taken => {
                        let me = &mut s.runners[r];
                        me.claims += 1;
                        me.fence = fence;
                        me.epoch = epoch;
                        me.due = false;
                        me.step = match taken {
                            Some(Some(_)) => Step::Close(0),
                            _ => Step::Recheck,
                        };
                    }
                }
            }
            Step::Recheck => {
                if s.needed(run.g0, Some(run.fence)) {
                    go(s, Step::Close(0))
                } else {
                    go(s, Step::FinishUnneeded)
                }
            }
            Step::FinishUnneeded => {
                let now = s.redis.run_id;
                s.finish(run.fence, now);
                s.runners[r] = Runner::idle(run.claims);
            }
            Step::Close(b) => {
                let after = if self.planted(Bug::RebuildWhileInFlight) {
                    Step::RescueRegistry
                } else {
                    Step::Wait
                };
                // `close_gates` stops at the first gate with a newer generation.
                match s.close(b as usize, run.fence, run.g0) {
                    true => {
                        // What the drain is for: the records on the topic now are applied
                        // before this runner bumps the generation.
                        if b == 0 {
                            s.runners[r].visible = s.topic.iter().fold(0, |v, m| v | 1 << m.rid);
                        }
                        go(s, self.next_bucket(b, after, Step::Close))
                    }
                    false if unfenced => go(s, after),
                    false => self.fail(s, r),
                }
            }
            Step::Wait => {
                if !self.keep(s, r) {
                    return self.fail(s, r);
                }
                go(s, Step::Drain);
            }
            Step::Drain => go(s, Step::RescueRegistry),
            Step::RescueRegistry => {
                s.runners[r].g1 = s.ledger.generation;
                if self.planted(Bug::ReopenOverPause) {
                    // Planted: the intent seen here, over anything newer (the engine's version
                    // 1_000_000_000, and the registry's generation as read here).
                    s.runners[r].target = Some((s.ledger.intent, 200, s.ledger.generation));
                }
                go(s, Step::Outbox);
            }
            Step::Outbox => {
                let (mut open, mut outbox) = (0u32, 0u32);
                for bucket in &s.redis.buckets {
                    for e in &bucket.resv {
                        open |= 1 << e.rid;
                        if s.ledger.orders[e.rid as usize].is_none() {
                            outbox |= 1 << e.rid;
                        }
                    }
                }
                if self.planted(Bug::RebuildDropsOutbox) {
                    s.runners[r].dropped = open;
                    outbox = 0;
                }
                s.runners[r].outbox = outbox;
                go(
                    s,
                    if outbox == 0 {
                        Step::KeepRescued
                    } else {
                        Step::Adopt
                    },
                );
            }
            Step::Adopt => {
                if run.due && !self.keep(s, r) {
                    return self.fail(s, r);
                }
                let mut adopted = 0u32;
                for rid in bits(run.outbox) {
                    if s.adopt(self.bound.bucket_of(rid), rid) {
                        adopted |= 1 << rid;
                    }
                }
                s.runners[r].outbox = adopted;
                if adopted == 0 {
                    go(s, Step::KeepRescued)
                } else if self.planted(Bug::RescueRepublished) {
                    for rid in bits(adopted) {
                        s.inflight.push(Msg {
                            rid,
                            generation: run.g1,
                        });
                    }
                    s.inflight.sort();
                    s.inflight.dedup();
                    go(s, Step::RescueDrain)
                } else {
                    go(s, Step::RescueApply)
                }
            }
            Step::RescueApply => {
                let mut duplicates = 0u32;
                for rid in bits(run.outbox) {
                    let m = Msg {
                        rid,
                        generation: run.g1,
                    };
                    if self.apply(s, m) == Outcome::DuplicateBuyer {
                        duplicates |= 1 << rid;
                    }
                }
                s.runners[r].outbox = duplicates;
                go(
                    s,
                    if duplicates == 0 {
                        Step::KeepRescued
                    } else {
                        Step::RescueRelease
                    },
                );
            }
            Step::RescueRelease => {
                for rid in bits(run.outbox) {
                    let user = self.bound.user_of(rid);
                    s.release(self.bound.bucket_of(rid), rid, user, false);
                }
                go(s, Step::KeepRescued);
            }
            Step::RescueDrain => go(s, Step::KeepRescued),
            Step::KeepRescued => {
                s.runners[r].outbox = 0;
                if !self.keep(s, r) {
                    return self.fail(s, r);
                }
                go(s, Step::Bump);
            }
            Step::Bump => {
                if s.ledger.generation != run.g1 && !self.planted(Bug::UnfencedBump) {
                    return self.fail(s, r);
                }
                if s.topic.iter().any(|m| run.visible & (1 << m.rid) != 0) {
                    s.ghost.drain_skipped = true;
                }
                s.ledger.generation += 1;
                s.runners[r].g2 = s.ledger.generation;
                go(s, Step::Snapshot);
            }
            Step::Snapshot => {
                s.runners[r].snapshot = Some(s.ledger.clone());
                go(
                    s,
                    if unfenced {
                        Step::Steal(0)
                    } else {
                        Step::Rebuild(0)
                    },
                );
            }
            Step::Steal(b) => {
                s.close(b as usize, run.fence, u8::MAX);
                let then = match run.snapshot {
                    Some(_) => Step::Rebuild(0),
                    None => Step::Reopen(0),
                };
                go(s, self.next_bucket(b, then, Step::Steal));
            }
            Step::Rebuild(b) => {
                if !self.rebuild(s, r, b as usize) {
                    return self.fail(s, r);
                }
                go(s, self.next_bucket(b, Step::KeepRebuilt, Step::Rebuild));
            }
            Step::KeepRebuilt => {
                s.runners[r].snapshot = None;
                if !self.keep(s, r) {
                    return self.fail(s, r);
                }
                go(s, Step::Intent);
            }
            Step::Intent => {
                if !self.planted(Bug::ReopenOverPause) {
                    s.runners[r].target = Some((s.ledger.intent, s.ledger.version, run.g2));
                }
                go(s, if unfenced { Step::Steal(0) } else { Step::Reopen(0) });
            }
            Step::Reopen(b) => {
                let (intent, version, generation) = run.target.expect("read at Intent");
                if !s.reopen(b as usize, run.fence, intent, version, generation) && !unfenced {
                    return self.fail(s, r);
                }
                go(s, self.next_bucket(b, Step::Finish, Step::Reopen));
            }
            Step::Finish => {
                if !s.finish(run.fence, run.epoch) && !unfenced {
                    return self.fail(s, r);
                }
                s.ghost.recoveries += 1;
                s.runners[r] = Runner::idle(run.claims);
            }
            Step::Release => {
                s.renew(run.fence, false);
                s.runners[r] = Runner::idle(run.claims);
            }
        }
    }

    /// The image of bucket `b` from the runner's snapshot (recover.rs), written by rebuild.lua:
    /// false for `{"fenced"}` and `{"open", rid}`.
    fn rebuild(&self, s: &mut State, r: usize, b: usize) -> bool {
        let bound = &self.bound;
        let run = &s.runners[r];
        let (fence, generation) = (run.fence, run.g2);
        let snap = run.snapshot.clone().expect("taken at Snapshot");
        let mut held = 0u32;
        let mut buyers = 0u32;
        for rid in 0..bound.rids() {
            let Some(o) = &snap.orders[rid as usize] else {
                continue;
            };
            if bound.bucket_of(rid) != b {
                continue;
            }
            held |= 1 << rid;
            if o.status == Status::Created || self.planted(Bug::FailedOrderLocksOut) {
                buyers |= 1 << bound.user_of(rid);
            }
        }
        // Planted: whatever was open at the rescue goes with the rebuild.
        held |= run.dropped;
        match &s.redis.buckets[b].gate {
            Some(g) if g.state == GateState::Recovering && g.fence == Some(fence) => {}
            _ => return false,
        }
        if s.redis.buckets[b].resv.iter().any(|e| held & (1 << e.rid) == 0) {
            return false;
        }
        s.write(|r| {
            let bucket = &mut r.buckets[b];
            bucket.stock = Some(snap.remaining[b]);
            bucket.buyers = buyers;
            bucket.resv.clear();
            bucket.failed = 0;
        });
        s.ghost.rebuilt = s.ghost.rebuilt.max(generation);
        true
    }

    fn purchase(&self, s: &mut State, user: u8) {
        let bound = &self.bound;
        let p = s.purchases[user as usize];
        let rid = user * bound.attempts_per_user + p.attempts;
        let b = bound.route(user);
        s.purchases[user as usize] = Purchase {
            attempts: p.attempts + 1,
            told: Told::Refused,
        };
        let bucket = &s.redis.buckets[b];
        let Some(gate) = bucket.gate.as_ref().filter(|g| g.state == GateState::Sells) else {
            return;
        };
        let generation = gate.generation;
        let Some(stock) = bucket.stock else { return };
        if bucket.buyers & (1 << user) != 0 || stock == 0 {
            return;
        }
        s.write(|r| {
            let bucket = &mut r.buckets[b];
            bucket.stock = Some(stock - 1);
            bucket.buyers |= 1 << user;
            bucket.resv.push(Entry {
                rid,
                generation,
                adopted: false,
            });
            bucket.resv.sort();
        });
        s.purchases[user as usize].told = Told::Publishing(rid, generation);
        if s.ghost.paused {
            s.ghost.sold_while_paused = true;
        }
    }

    fn lose(&self, s: &mut State, to: Redis) {
        let mut to = to;
        to.run_id = s.redis.run_id + 1;
        for b in 0..self.bound.buckets() as usize {
            for e in &s.redis.buckets[b].resv {
                if !to.buckets[b].resv.iter().any(|k| k.rid == e.rid) {
                    s.ghost.lost |= 1 << e.rid;
                }
            }
        }
        s.redis = to;
        s.losses -= 1;
        s.ghost.paused = false;
        s.ghost.call_intact = false;
        s.replica = None;
    }
}

/// A state's 64-bit fingerprint (as the checker dedupes states by one).
fn fingerprint(s: &State) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(s)
}

/// The set bits of `mask`, lowest first.
fn bits(mask: u32) -> impl Iterator<Item = u8> {
    (0..32u8).filter(move |i| mask & (1 << i) != 0)
}

impl Recovery {
    /// Nothing left to happen: no purchase publishing, nothing on the bus or waiting for its
    /// follow-up, every runner idle and nothing for a recovery to do, the operator not in a
    /// call, and nothing the reconciler would republish.
    pub fn quiescent(&self, s: &State) -> bool {
        s.purchases
            .iter()
            .all(|p| !matches!(p.told, Told::Publishing(..)))
            && s.inflight.is_empty()
            && s.topic.is_empty()
            && s.followups.is_empty()
            && s.runners.iter().all(|r| r.step == Step::Registry)
            && matches!(s.operator, Operator::Idle | Operator::Paused | Operator::Done)
            && !s.needed(s.ledger.generation, None)
            && (0..self.bound.rids()).all(|rid| !self.republishable(s, rid))
    }

    /// The reconciler republishes an open reservation the ledger lacks once its purchase is done
    /// with it and nothing of it is on the bus — and only while no recovery is due or under way
    /// (it leaves the activity to the recovery then).
    fn republishable(&self, s: &State, rid: Rid) -> bool {
        let b = self.bound.bucket_of(rid);
        s.entry(b, rid).is_some()
            && s.ledger.orders[rid as usize].is_none()
            && !s.inflight.iter().chain(&s.topic).any(|m| m.rid == rid)
            && !matches!(s.purchases[self.bound.user_of(rid) as usize].told, Told::Publishing(r, _) if r == rid)
            && !s.needed(0, None)
    }

    /// From `s`, a fair run without faults (each actor in turn takes its first possible step;
    /// an idle runner starts a pass when no other runner is in one) reaches quiescence. States met on the way share the answer for the same turn of the
    /// rotation (the cache's key), so the check costs about one step per state.
    pub fn settles(&self, s: &State) -> bool {
        self.fair_run(s, None)
    }

    /// The fair run from `s` (see `settles`), its steps written to `trace` (no cache then).
    pub fn fair_run(&self, s: &State, mut trace: Option<&mut Vec<Action>>) -> bool {
        let cached = |now: &State, turn: usize| -> Option<bool> {
            let cache = self.settles.lock().expect("settles");
            cache.get(&(fingerprint(now) ^ turn as u64)).copied()
        };
        if trace.is_none() {
            if let Some(known) = cached(s, 0) {
                return known;
            }
        }
        let mut path = vec![fingerprint(s)];
        let mut now = s.clone();
        let mut turn = 0usize;
        let answer = loop {
            if self.quiescent(&now) {
                break true;
            }
            if path.len() > 400 {
                break false;
            }
            // Without the bound on claims: the engine's runners try again every pass.
            let mut actions = vec![];
            self.actions_within(&now, &mut actions, u8::MAX);
            actions.retain(|a| !a.is_fault());
            // An idle runner starts a pass only while no other runner is inside one. Without
            // this, two runners in lockstep keep each other busy for ever: each one's look sees
            // the other's claim unfinished, claims once it finished, finds nothing to do and
            // finishes — harmless to the sale (no gate closes), and broken by any jitter in the
            // passes' timing, which the engine's runners have.
            let busy = |r: u8| {
                now.runners
                    .iter()
                    .enumerate()
                    .any(|(k, x)| k != r as usize && x.step != Step::Registry)
            };
            actions.retain(|a| !matches!(a, Action::Runner(r, Step::Registry) if busy(*r)));
            let actor = |a: &Action| match a {
                Action::Runner(r, _) => 1 + *r as usize,
                Action::Reserve(_) | Action::Published(_) => 0,
                Action::Visible(_) | Action::Apply(_) | Action::FollowUp(..) => 10,
                Action::Republish(_) => 11,
                _ => 12,
            };
            let mut chosen = None;
            'actors: for k in 0..13 {
                let want = (turn + k) % 13;
                for a in actions.iter().filter(|a| actor(a) == want) {
                    if let Some(next) = self.next_state(&now, a.clone()) {
                        chosen = Some((a.clone(), next));
                        turn = want + 1;
                        break 'actors;
                    }
                }
            }
            let Some((action, next)) = chosen else { break false };
            now = next;
            match trace.as_mut() {
                Some(t) => t.push(action),
                None => {
                    if let Some(known) = cached(&now, turn) {
                        break known;
                    }
                }
            }
            path.push(fingerprint(&now) ^ turn as u64);
        };
        if trace.is_none() {
            let mut cache = self.settles.lock().expect("settles");
            for p in path {
                cache.insert(p, answer);
            }
        }
        answer
    }

    /// R1 per bucket, at quiescence: Redis's stock and open entries are the ledger's remaining.
    fn reconciles(&self, s: &State) -> bool {
        s.redis
            .buckets
            .iter()
            .zip(&s.ledger.remaining)
            .all(|(b, &left)| b.stock.map(|st| st + b.resv.len() as u8) == Some(left))
    }

    fn gates_current(&self, s: &State) -> bool {
        s.redis.buckets.iter().all(|b| {
            b.gate.as_ref().is_some_and(|g| {
                g.generation == s.ledger.generation && g.fence.is_none() && g.state == s.ledger.intent.into()
            })
        })
    }

    /// Every user told "queued" has an order (created, or failed where they can see it) —
    /// unless a Redis loss took its outbox entry after reserve.lua confirmed it (data loss, as
    /// the simulation's exact account excuses it; with the record published it is an order
    /// anyway). A reservation that vanished any other way (a rebuild, a release) is a violation.
    fn queued_resolved(&self, s: &State) -> bool {
        s.purchases.iter().all(|p| match p.told {
            Told::Queued(rid) => s.ledger.orders[rid as usize].is_some() || s.ghost.lost & (1 << rid) != 0,
            _ => true,
        })
    }

    /// No user without a live order is marked a buyer.
    fn nobody_locked_out(&self, s: &State) -> bool {
        let b = &self.bound;
        (0..b.users()).all(|user| {
            let live = b.has_live_order(&s.ledger, user);
            live || s.redis.buckets.iter().all(|k| k.buyers & (1 << user) == 0)
        })
    }
}

impl Recovery {
    /// The possible actions, runners starting a pass while they have fewer than `claims`.
    fn actions_within(&self, s: &State, out: &mut Vec<Action>, claims: u8) {
        let b = &self.bound;

        for (user, p) in s.purchases.iter().enumerate() {
            let user = user as u8;
            match p.told {
                Told::Publishing(..) => {
                    out.push(Action::Published(user));
                    out.push(Action::PublishLost(user));
                    out.push(Action::PublishFailed(user));
                }
                Told::Nothing | Told::Refused if p.attempts < b.attempts_per_user => {
                    out.push(Action::Reserve(user))
                }
                _ => {}
            }
        }
        for m in &s.inflight {
            out.push(Action::Visible(*m));
        }
        for m in &s.topic {
            out.push(Action::Apply(*m));
        }
        for (m, f) in &s.followups {
            out.push(Action::FollowUp(*m, *f));
        }
        for rid in 0..b.rids() {
            if self.republishable(s, rid) {
                out.push(Action::Republish(rid));
            }
        }
        match s.operator {
            Operator::Idle => out.push(Action::Operator(Operator::Pausing(0))),
            Operator::Pausing(k) => out.push(Action::Operator(Operator::Pausing(k + 1))),
            Operator::Paused => out.push(Action::Operator(Operator::Resuming(0))),
            Operator::Resuming(k) => out.push(Action::Operator(Operator::Resuming(k + 1))),
            Operator::Done => {}
        }
        for (r, run) in s.runners.iter().enumerate() {
            let can_start = run.step != Step::Registry || run.claims < claims;
            // The drain returns only once the topic's lag is 0.
            let drained = run.step != Step::Drain && run.step != Step::RescueDrain || s.topic.is_empty();
            if can_start && drained {
                out.push(Action::Runner(r as u8, run.step));
            }
        }
        if s.expiries > 0 && s.redis.meta.as_ref().is_some_and(|m| m.claim.is_some() && m.live) {
            out.push(Action::LeaseExpires);
        }
        if s.losses > 0 {
            out.push(Action::RedisRestartsEmpty);
            if s.replica.is_some() {
                out.push(Action::RedisFailsOver);
            }
        }
    }
}

impl Model for Recovery {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        self.actions_within(s, out, self.bound.claims_per_runner);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let b = &self.bound;
        let mut s = last.clone();
        match action {
            Action::Reserve(user) => self.purchase(&mut s, user),
            Action::Published(user) | Action::PublishLost(user) => {
                let Told::Publishing(rid, generation) = s.purchases[user as usize].told else {
                    unreachable!()
                };
                if action == Action::Published(user) {
                    s.inflight.push(Msg { rid, generation });
                    s.inflight.sort();
                    s.inflight.dedup();
                }
                s.purchases[user as usize].told = Told::Queued(rid);
            }
            Action::PublishFailed(user) => {
                let Told::Publishing(rid, _) = s.purchases[user as usize].told else {
                    unreachable!()
                };
                let released = s.release(b.route(user), rid, user, true);
                // Adopted meanwhile: its order is on its way after all, and the purchase says so.
                s.purchases[user as usize].told = if released {
                    Told::Refused
                } else {
                    Told::Queued(rid)
                };
            }
            Action::Visible(m) => {
                s.inflight.retain(|k| *k != m);
                s.topic.push(m);
                s.topic.sort();
                s.topic.dedup();
            }
            Action::Apply(m) => {
                s.topic.retain(|k| *k != m);
                let followup = match self.apply(&mut s, m) {
                    Outcome::Created | Outcome::Redelivered => FollowUp::Settle,
                    Outcome::OutOfStock | Outcome::StaleGeneration => FollowUp::Free,
                    Outcome::DuplicateBuyer => FollowUp::Release,
                };
                s.followups.push((m, followup));
                s.followups.sort();
                s.followups.dedup();
            }
            Action::FollowUp(m, f) => {
                let (bucket, user) = (b.bucket_of(m.rid), b.user_of(m.rid));
                match f {
                    FollowUp::Settle => s.settle(bucket, m.rid),
                    FollowUp::Release => {
                        s.release(bucket, m.rid, user, false);
                    }
                    // Without the stock key the follow-up fails; it is tried again.
                    FollowUp::Free => {
                        if !s.free_failed(bucket, m.rid, user, m.generation) {
                            return None;
                        }
                    }
                }
                s.followups.retain(|k| *k != (m, f));
            }
            Action::Republish(rid) => {
                let bucket = b.bucket_of(rid);
                s.adopt(bucket, rid);
                let generation = s.entry(bucket, rid).expect("republishable").generation;
                s.inflight.push(Msg { rid, generation });
                s.inflight.sort();
            }
            Action::Operator(next) => {
                let (intent, calls) = match next {
                    Operator::Pausing(k) => (Intent::Paused, k),
                    Operator::Resuming(k) => (Intent::Open, k),
                    _ => unreachable!(),
                };
                if calls == 0 {
                    s.ledger.intent = intent;
                    s.ledger.version += 1;
                    s.ghost.paused = false;
                    s.ghost.call_intact = true;
                    s.operator = next;
                } else {
                    s.set_gate(calls as usize - 1, intent, s.ledger.version);
                    s.operator = next;
                    if calls == b.buckets() {
                        s.operator = match next {
                            Operator::Pausing(_) => {
                                s.ghost.paused = s.ghost.call_intact;
                                Operator::Paused
                            }
                            _ => Operator::Done,
                        };
                    }
                }
            }
            Action::Runner(r, step) => self.runner(&mut s, r as usize, step),
            Action::LeaseExpires => {
                // Time passes for the replica too: whatever claim it holds is older.
                for redis in std::iter::once(&mut s.redis).chain(s.replica.as_mut()) {
                    if let Some(m) = redis.meta.as_mut() {
                        m.live = false;
                    }
                }
                for r in &mut s.runners {
                    r.due = true;
                }
                s.expiries -= 1;
            }
            Action::RedisRestartsEmpty => {
                let empty = Redis {
                    run_id: 0,
                    meta: None,
                    buckets: (0..b.buckets())
                        .map(|_| Bucket {
                            stock: None,
                            buyers: 0,
                            resv: vec![],
                            failed: 0,
                            gate: None,
                        })
                        .collect(),
                };
                self.lose(&mut s, empty);
            }
            Action::RedisFailsOver => {
                let replica = s.replica.clone().expect("a replica");
                self.lose(&mut s, replica);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always("no old-generation order counted after a rebuild", |_, s| {
                !s.ghost.stale_counted
            }),
            Property::<Self>::always(
                "no queued reservation refused as stale unless Redis lost it",
                |_, s| !s.ghost.queued_refused,
            ),
            Property::<Self>::always("an operator's pause holds", |_, s| !s.ghost.sold_while_paused),
            Property::<Self>::always(
                "no bump while a record visible at its close is unapplied",
                |_, s| !s.ghost.drain_skipped,
            ),
            Property::<Self>::always(
                "at quiescence every gate is at the registry's intent and generation",
                |m, s| !m.quiescent(s) || m.gates_current(s),
            ),
            Property::<Self>::always("at quiescence every bucket reconciles (R1)", |m, s| {
                !m.quiescent(s) || m.reconciles(s)
            }),
            Property::<Self>::always(
                "at quiescence every queued reservation is an order (L1)",
                |m, s| !m.quiescent(s) || m.queued_resolved(s),
            ),
            Property::<Self>::always("at quiescence no user is locked out", |m, s| {
                !m.quiescent(s) || m.nobody_locked_out(s)
            }),
            Property::<Self>::always("once faults stop, a fair run settles", |m, s| m.settles(s)),
            Property::<Self>::sometimes("a recovery finishes", |_, s| s.ghost.recoveries > 0),
            Property::<Self>::sometimes("a late record is refused as stale", |_, s| {
                s.ledger
                    .orders
                    .iter()
                    .flatten()
                    .any(|o| o.status == Status::Failed && o.generation < s.ledger.generation)
            }),
        ]
    }
}

/// The names of the safety and liveness properties (the `sometimes` ones are sanity checks
/// that the bound reaches the interesting states).
pub fn checked_properties(model: &Recovery) -> Vec<&'static str> {
    model
        .properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .map(|p| p.name)
        .collect()
}
