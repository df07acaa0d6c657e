//! The seckill invariants (DESIGN §8) as pure functions over one observation of the system.
//!
//! Nothing here does I/O or knows a backend: the engine, the simulation, the soak and
//! `seckill audit` all build a [`Snapshot`] from what they can see and hand it to the same
//! checkers, so a verdict means the same thing everywhere. Each checker returns every violation
//! it finds (not just the first), with the bucket and the numbers that disagree.
//!
//! Safety (S1–S4) must hold at every observation; R1 only at quiescence (faults healed, queue
//! drained, jobs ran), because an order in flight is legitimately counted twice for a moment:
//! once as an open reservation in Redis and once in the ledger, until it is settled.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One observation of one activity: the stock cache (Redis), the ledger (MySQL) and the plan.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub activity: u64,
    /// Units the activity sells in all, over every bucket (the plan's total).
    pub total_stock: u64,
    pub buckets: Vec<BucketState>,
    /// Every order row of the activity in the ledger, whatever its status.
    pub orders: Vec<Order>,
}

impl Snapshot {
    /// Each bucket's buyer marks in Redis.
    pub fn buyer_marks(&self) -> BTreeMap<u32, BTreeSet<u64>> {
        self.buckets
            .iter()
            .map(|b| (b.bucket, b.buyers.iter().copied().collect()))
            .collect()
    }

    /// The reservations of the ledger's created and paid orders (those that hold their units).
    pub fn holding_reservations(&self) -> BTreeSet<&str> {
        self.orders
            .iter()
            .filter(|o| o.status.holds_stock())
            .map(|o| o.reservation.as_str())
            .collect()
    }

    /// Units held by the ledger's created and paid orders.
    pub fn units_sold(&self) -> u64 {
        self.orders
            .iter()
            .filter(|o| o.status.holds_stock())
            .map(|o| o.qty)
            .sum()
    }
}

/// One stock bucket as both stores see it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BucketState {
    pub bucket: u32,
    /// Units the plan gave this bucket.
    pub initial: u64,
    /// `sk:{A.b}:stock`; `None` when the key is missing (not warmed, or lost with Redis).
    pub redis_stock: Option<i64>,
    /// Open reservations in `sk:{A.b}:resv` (the outbox).
    pub open: Vec<OpenReservation>,
    /// Users marked in `sk:{A.b}:buyers` (holding a unit, or a fallback attempt, via this bucket).
    pub buyers: Vec<u64>,
    /// Users with a pending-fallback mark here: an attempt that has not resolved (yet).
    pub pending: Vec<u64>,
    /// Cancelled orders' reservations whose units Redis has taken back into this bucket.
    pub released_cancels: Vec<String>,
    /// Units moved into / out of this bucket by rebalancing (DESIGN §4), net of acknowledgement.
    pub transfers_in: u64,
    pub transfers_out: u64,
    /// `stock_bucket` row: `initial` and `remaining`; `None` when the ledger has no row.
    pub ledger_initial: Option<u64>,
    pub ledger_remaining: Option<i64>,
    /// Sum of this bucket's `stock_journal` deltas (negative for orders, positive for cancels).
    pub journal_delta: i64,
    /// Net units the ledger moved into this bucket by transfers (its `transfer` journal rows).
    pub ledger_transfers_net: i64,
}

impl BucketState {
    /// Units of this bucket's open reservations whose order is not among `held` (the ledger's
    /// stock-holding orders, `Snapshot::holding_reservations`): reserved in Redis only.
    pub fn unordered_units(&self, held: &BTreeSet<&str>) -> u64 {
        self.open
            .iter()
            .filter(|r| !held.contains(r.reservation.as_str()))
            .map(|r| r.qty)
            .sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenReservation {
    pub reservation: String,
    pub user: u64,
    pub qty: u64,
    /// The user's own bucket (`route(user)`); differs from the holding bucket for a fallback unit.
    pub own_bucket: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Order {
    pub reservation: String,
    pub user: u64,
    /// The bucket its unit came from.
    pub bucket: u32,
    /// The user's own bucket (`route(user)`); differs from `bucket` for a fallback unit.
    pub own_bucket: u32,
    pub qty: u64,
    pub status: OrderStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Created,
    Paid,
    Cancelled,
    Failed,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 4] = [
        OrderStatus::Created,
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::Failed,
    ];

    /// The name it is stored and answered under (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Created => "created",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Failed => "failed",
        }
    }

    /// Created and paid orders hold stock; cancelled ones gave it back; failed ones never had it.
    pub fn holds_stock(self) -> bool {
        matches!(self, OrderStatus::Created | OrderStatus::Paid)
    }
}

/// Which invariant a violation breaks (names as in DESIGN §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Invariant {
    S1NoOversell,
    S2OneOrderPerUser,
    S3RedisNonNegative,
    S4ConfirmedOrderKept,
    R1Reconciled,
    L1QueuedResolved,
    L2BoundedUndersell,
    /// S5: after a pause or close returned, no reserve answers "reserved" until a resume is
    /// issued (DESIGN §11.2), whatever process the request reached — checked against the
    /// clients' own history, in the registry's order (a resume counts from its registry write:
    /// one issued before the pause returned may be the older intent); and no gate's intent
    /// version goes back while Redis lives (an older intent never undoes a newer one).
    S5PauseHolds,
    /// S6: an open gate carries the registry's current generation (DESIGN §11.3). A recovery
    /// bumps the generation only while its fence holds every gate closed, and reopens with the
    /// new one; an open gate of an older generation answers "reserved" for orders the ledger
    /// already refuses.
    S6GenerationFenced,
    /// S7: what a user is shown is true when shown — an order page names the user's own order
    /// in a state the ledger's order held or has since moved on from (created, then paid or
    /// cancelled; paid, cancelled and failed are final).
    S7AnswersTrue,
    /// L3 at quiescence: no user is locked out — every buyer mark in Redis belongs to a user the
    /// ledger holds an order of (any status: its unique key keeps every such user out). A mark
    /// without an order answers "duplicate" to a user who was told to retry and never bought.
    L3NoLockout,
    /// R2 at quiescence: the buyer marks reconcile with the ledger — every user holding a
    /// created, paid or cancelled order is marked in its own bucket and in the bucket its unit
    /// came from (the dual of L3). An order holder without its mark can reserve again: only the
    /// ledger's unique key stands between it and a second unit.
    R2BuyersMarked,
}

impl Invariant {
    pub fn code(self) -> &'static str {
        match self {
            Invariant::S1NoOversell => "S1",
            Invariant::S2OneOrderPerUser => "S2",
            Invariant::S3RedisNonNegative => "S3",
            Invariant::S4ConfirmedOrderKept => "S4",
            Invariant::R1Reconciled => "R1",
            Invariant::L1QueuedResolved => "L1",
            Invariant::L2BoundedUndersell => "L2",
            Invariant::S5PauseHolds => "S5",
            Invariant::S6GenerationFenced => "S6",
            Invariant::S7AnswersTrue => "S7",
            Invariant::L3NoLockout => "L3",
            Invariant::R2BuyersMarked => "R2",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Invariant::S1NoOversell => "no oversell",
            Invariant::S2OneOrderPerUser => "one order per user",
            Invariant::S3RedisNonNegative => "redis stock never negative",
            Invariant::S4ConfirmedOrderKept => "no confirmed order lost",
            Invariant::R1Reconciled => "reconciliation",
            Invariant::L1QueuedResolved => "every queued request resolved",
            Invariant::L2BoundedUndersell => "bounded undersell",
            Invariant::S5PauseHolds => "a pause or close holds everywhere",
            Invariant::S6GenerationFenced => "an open gate carries the current generation",
            Invariant::S7AnswersTrue => "answers true when given",
            Invariant::L3NoLockout => "no user locked out",
            Invariant::R2BuyersMarked => "buyer marks reconciled",
        };
        write!(f, "{} {}", self.code(), name)
    }
}

/// One broken invariant, with enough detail to find the cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: Invariant,
    pub bucket: Option<u32>,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bucket {
            Some(b) => write!(f, "{} (bucket {b}): {}", self.invariant, self.detail),
            None => write!(f, "{}: {}", self.invariant, self.detail),
        }
    }
}

fn violation(invariant: Invariant, bucket: Option<u32>, detail: String) -> Violation {
    Violation {
        invariant,
        bucket,
        detail,
    }
}

/// Units the ledger holds as sold (created + paid) per bucket.
fn ledger_units_by_bucket(s: &Snapshot) -> BTreeMap<u32, u64> {
    let mut by_bucket = BTreeMap::new();
    for o in s.orders.iter().filter(|o| o.status.holds_stock()) {
        *by_bucket.entry(o.bucket).or_insert(0) += o.qty;
    }
    by_bucket
}

/// S1 no oversell: ledger units sold ≤ total stock; every `remaining ≥ 0`; per bucket
/// `initial − remaining = units sold from it − transfers in + transfers out`, and the journal
/// agrees with `remaining − initial`.
pub fn s1_no_oversell(s: &Snapshot) -> Vec<Violation> {
    let mut out = Vec::new();
    let sold = ledger_units_by_bucket(s);
    let total_sold: u64 = sold.values().sum();
    if total_sold > s.total_stock {
        out.push(violation(
            Invariant::S1NoOversell,
            None,
            format!(
                "ledger holds {total_sold} units sold of {} in stock",
                s.total_stock
            ),
        ));
    }
    let known: BTreeSet<u32> = s.buckets.iter().map(|b| b.bucket).collect();
    for (bucket, units) in &sold {
        if !known.contains(bucket) {
            out.push(violation(
                Invariant::S1NoOversell,
                Some(*bucket),
                format!("{units} units sold from a bucket the plan does not have"),
            ));
        }
    }
    for b in &s.buckets {
        let (Some(initial), Some(remaining)) = (b.ledger_initial, b.ledger_remaining) else {
            if sold.get(&b.bucket).copied().unwrap_or(0) > 0 {
                out.push(violation(
                    Invariant::S1NoOversell,
                    Some(b.bucket),
                    "orders exist but the ledger has no stock_bucket row".into(),
                ));
            }
            continue;
        };
        if remaining < 0 {
            out.push(violation(
                Invariant::S1NoOversell,
                Some(b.bucket),
                format!("stock_bucket.remaining = {remaining}"),
            ));
        }
        let units = sold.get(&b.bucket).copied().unwrap_or(0) as i64;
        // The ledger's own transfers: Redis may be mid-transfer while the ledger is not (or back).
        let moved = b.ledger_transfers_net;
        let taken = initial as i64 - remaining;
        if taken != units - moved {
            out.push(violation(
                Invariant::S1NoOversell,
                Some(b.bucket),
                format!(
                    "initial {initial} - remaining {remaining} = {taken}, but orders hold {units} \
                     units and transfers net {moved:+}"
                ),
            ));
        }
        if b.journal_delta != remaining - initial as i64 {
            out.push(violation(
                Invariant::S1NoOversell,
                Some(b.bucket),
                format!(
                    "journal sums to {:+} but remaining - initial = {:+}",
                    b.journal_delta,
                    remaining - initial as i64
                ),
            ));
        }
    }
    out
}

/// S2 one order per user: at most one live (non-failed) order per (activity, user) — the
/// ledger's unique key over live orders (DESIGN §6, §8). A failed order frees its user, who may
/// then hold one live order beside any number of failed ones.
pub fn s2_one_order_per_user(s: &Snapshot) -> Vec<Violation> {
    let mut by_user: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for o in s.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
        by_user.entry(o.user).or_default().push(&o.reservation);
    }
    by_user
        .into_iter()
        .filter(|(_, rs)| rs.len() > 1)
        .map(|(user, rs)| {
            violation(
                Invariant::S2OneOrderPerUser,
                None,
                format!("user {user} has {} orders: {}", rs.len(), rs.join(", ")),
            )
        })
        .collect()
}

/// S2 in Redis: no user holds two open reservations at once (over all buckets). Holds while
/// Redis keeps its buyer marks; a Redis data loss may legitimately break it (the ledger's unique
/// key is then the guard), so callers enable it only where Redis loses nothing.
pub fn s2_redis_one_reservation_per_user(s: &Snapshot) -> Vec<Violation> {
    let mut by_user: BTreeMap<u64, Vec<(u32, &str)>> = BTreeMap::new();
    for b in &s.buckets {
        for r in &b.open {
            by_user
                .entry(r.user)
                .or_default()
                .push((b.bucket, &r.reservation));
        }
    }
    by_user
        .into_iter()
        .filter(|(_, rs)| rs.len() > 1)
        .map(|(user, rs)| {
            let list: Vec<String> = rs.iter().map(|(b, r)| format!("{r}@{b}")).collect();
            violation(
                Invariant::S2OneOrderPerUser,
                Some(rs[0].0),
                format!(
                    "user {user} holds {} open reservations in redis: {}",
                    rs.len(),
                    list.join(", ")
                ),
            )
        })
        .collect()
}

/// S2 in Redis, the fallback protocol: a user holding a unit from another bucket than its own
/// (the fallback) is still marked in its own bucket, so a later refill of that bucket cannot sell
/// it a second unit (DESIGN §4, the pending-fallback mark). Same caveat as above: only while
/// Redis loses nothing.
pub fn s2_redis_fallback_winners_marked(s: &Snapshot) -> Vec<Violation> {
    let marked = s.buyer_marks();
    s.buckets
        .iter()
        .flat_map(|b| b.open.iter().map(move |r| (b.bucket, r)))
        .filter(|(held_in, r)| *held_in != r.own_bucket)
        .filter(|(_, r)| !marked.get(&r.own_bucket).is_some_and(|m| m.contains(&r.user)))
        .map(|(held_in, r)| {
            violation(
                Invariant::S2OneOrderPerUser,
                Some(r.own_bucket),
                format!(
                    "user {} holds {} from bucket {held_in} but has no mark in its own bucket {}",
                    r.user, r.reservation, r.own_bucket
                ),
            )
        })
        .collect()
}

/// S3 Redis never negative: every bucket's stock key is ≥ 0.
pub fn s3_redis_non_negative(s: &Snapshot) -> Vec<Violation> {
    s.buckets
        .iter()
        .filter_map(|b| match b.redis_stock {
            Some(stock) if stock < 0 => Some(violation(
                Invariant::S3RedisNonNegative,
                Some(b.bucket),
                format!("redis stock = {stock}"),
            )),
            _ => None,
        })
        .collect()
}

/// S4 no confirmed order lost: every reservation a client was told is an order (created or
/// paid) is still in the ledger, and still created, paid or cancelled — never gone or failed.
pub fn s4_confirmed_kept(s: &Snapshot, confirmed: &[String]) -> Vec<Violation> {
    let by_id: BTreeMap<&str, &Order> = s.orders.iter().map(|o| (o.reservation.as_str(), o)).collect();
    confirmed
        .iter()
        .filter_map(|rid| match by_id.get(rid.as_str()) {
            None => Some(violation(
                Invariant::S4ConfirmedOrderKept,
                None,
                format!("confirmed order {rid} is missing from the ledger"),
            )),
            Some(o) if o.status == OrderStatus::Failed => Some(violation(
                Invariant::S4ConfirmedOrderKept,
                Some(o.bucket),
                format!("confirmed order {rid} is now failed"),
            )),
            Some(_) => None,
        })
        .collect()
}

/// The safety invariants S1–S3, which need no history. S4 needs the client's history:
/// [`s4_confirmed_kept`].
pub fn check_safety(s: &Snapshot) -> Vec<Violation> {
    let mut out = s1_no_oversell(s);
    out.extend(s2_one_order_per_user(s));
    out.extend(s3_redis_non_negative(s));
    out
}

/// R1 reconciliation, per bucket: `redis stock + open reservations the ledger lacks + ledger
/// units sold − transfers in + transfers out = initial`. An open reservation whose order the
/// ledger already holds counts once (it is merely not settled yet). Only meaningful at
/// quiescence.
pub fn r1_reconciled(s: &Snapshot) -> Vec<Violation> {
    let sold = ledger_units_by_bucket(s);
    let in_ledger = s.holding_reservations();
    let mut out = Vec::new();
    for b in &s.buckets {
        let Some(stock) = b.redis_stock else {
            out.push(violation(
                Invariant::R1Reconciled,
                Some(b.bucket),
                "redis has no stock key for this bucket".into(),
            ));
            continue;
        };
        let open = b.unordered_units(&in_ledger);
        let units = sold.get(&b.bucket).copied().unwrap_or(0);
        // Redis's transfer marks count what moved only if the ledger's journal moved the same: a
        // take the recovery's rebuild undid (its units back in the source, its mark gone) whose
        // ledger step and give came after the snapshot has its units in both buckets, and each
        // bucket's own account above still adds up.
        let marked = b.transfers_in as i64 - b.transfers_out as i64;
        if b.ledger_initial.is_some() && marked != b.ledger_transfers_net {
            out.push(violation(
                Invariant::R1Reconciled,
                Some(b.bucket),
                format!(
                    "redis's transfer marks net {marked:+} units, the ledger's journal {:+}",
                    b.ledger_transfers_net
                ),
            ));
        }
        let lhs = stock + open as i64 + units as i64 - b.transfers_in as i64 + b.transfers_out as i64;
        if lhs != b.initial as i64 {
            out.push(violation(
                Invariant::R1Reconciled,
                Some(b.bucket),
                format!(
                    "redis {stock} + open {open} + sold {units} - in {} + out {} = {lhs}, initial {}",
                    b.transfers_in, b.transfers_out, b.initial
                ),
            ));
        }
    }
    out
}

/// L1 liveness, at quiescence: every reservation a client was told is "queued" resolved — it is
/// an order in the ledger (any status), or it is no longer open in Redis (it was released).
pub fn l1_queued_resolved(s: &Snapshot, queued: &[String]) -> Vec<Violation> {
    let in_ledger: BTreeSet<&str> = s.orders.iter().map(|o| o.reservation.as_str()).collect();
    let open: BTreeMap<&str, u32> = s
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(move |r| (r.reservation.as_str(), b.bucket)))
        .collect();
    queued
        .iter()
        .filter(|rid| !in_ledger.contains(rid.as_str()))
        .filter_map(|rid| {
            open.get(rid.as_str()).map(|bucket| {
                violation(
                    Invariant::L1QueuedResolved,
                    Some(*bucket),
                    format!("queued reservation {rid} is still open and not in the ledger"),
                )
            })
        })
        .collect()
}

/// L1 at quiescence, strongest form: nothing is left open in Redis — every reservation became
/// an order or was released. Holds only where no fault can strand a reservation without the
/// reconciler (lost messages, unknown reserve outcomes, engine crashes mid-request).
pub fn l1_nothing_open(s: &Snapshot) -> Vec<Violation> {
    s.buckets
        .iter()
        .filter(|b| !b.open.is_empty())
        .map(|b| {
            let ids: Vec<&str> = b.open.iter().take(3).map(|r| r.reservation.as_str()).collect();
            violation(
                Invariant::L1QueuedResolved,
                Some(b.bucket),
                format!(
                    "{} reservations still open (e.g. {})",
                    b.open.len(),
                    ids.join(", ")
                ),
            )
        })
        .collect()
}

/// L3 at quiescence (nothing open or pending): every user marked a buyer in some bucket holds a
/// live order in the ledger — a failed order frees its user (DESIGN §6), so a user marked with
/// only failed orders is told "duplicate" while holding nothing.
pub fn l3_no_lockout(s: &Snapshot) -> Vec<Violation> {
    let buyers: std::collections::BTreeSet<u64> = s
        .orders
        .iter()
        .filter(|o| o.status != OrderStatus::Failed)
        .map(|o| o.user)
        .collect();
    s.buckets
        .iter()
        .filter_map(|b| {
            let locked: Vec<u64> = b.buyers.iter().copied().filter(|u| !buyers.contains(u)).collect();
            (!locked.is_empty()).then(|| {
                violation(
                    Invariant::L3NoLockout,
                    Some(b.bucket),
                    format!(
                        "{} users marked buyers without an order in the ledger (e.g. {:?}): told \"duplicate\" for ever",
                        locked.len(),
                        &locked[..locked.len().min(3)]
                    ),
                )
            })
        })
        .collect()
}

/// R2 at quiescence (nothing open or pending): every order of the ledger but a failed one keeps
/// its user marked in its own bucket and in the bucket its unit came from (`rebuild.lua` marks
/// every order's user so; `reserve.lua` and the pending-mark resolution keep them so). A failed
/// order — refused for an older generation — was never a sale of the current Redis: its user
/// may be unmarked (the ledger's unique key still refuses a second order).
pub fn r2_buyers_marked(s: &Snapshot) -> Vec<Violation> {
    let marked = s.buyer_marks();
    let mut unmarked: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for o in s.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
        for b in BTreeSet::from([o.own_bucket, o.bucket]) {
            if !marked.get(&b).is_some_and(|m| m.contains(&o.user)) {
                unmarked.entry(b).or_default().push(o.user);
            }
        }
    }
    unmarked
        .into_iter()
        .map(|(b, users)| {
            violation(
                Invariant::R2BuyersMarked,
                Some(b),
                format!(
                    "{} users holding an order are not marked buyers here (e.g. {:?}): they can reserve again",
                    users.len(),
                    &users[..users.len().min(3)]
                ),
            )
        })
        .collect()
}

/// One gate as read raw from Redis: whether it sells, and the generation it stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateState {
    pub bucket: u32,
    pub open: bool,
    pub generation: u64,
}

/// S6: every open gate carries `generation`, the registry's current one, read at the same
/// instant as the gates. Holds at every moment, not only at quiescence: the bump happens while
/// the bumping claim holds all gates closed, and each reopen writes the new generation.
pub fn s6_open_gates_current(gates: &[GateState], generation: u64) -> Vec<Violation> {
    gates
        .iter()
        .filter(|g| g.open && g.generation != generation)
        .map(|g| {
            violation(
                Invariant::S6GenerationFenced,
                Some(g.bucket),
                format!(
                    "the gate is open at generation {} while the registry is at {generation}: \
                     its reserves answer \"reserved\" for orders the ledger refuses",
                    g.generation
                ),
            )
        })
        .collect()
}

/// R1, its sharpest symptom: no order failed for lack of ledger stock. Redis only reserves what
/// the ledger still has, so an `OutOfStock` order means Redis promised a unit that did not exist —
/// expected only after Redis lost data, so callers enable it where Redis loses nothing.
pub fn r1_no_failed_orders(s: &Snapshot) -> Vec<Violation> {
    s.orders
        .iter()
        .filter(|o| o.status == OrderStatus::Failed)
        .map(|o| {
            violation(
                Invariant::R1Reconciled,
                Some(o.bucket),
                format!(
                    "order {} of user {} failed: redis promised a unit the ledger did not have",
                    o.reservation, o.user
                ),
            )
        })
        .collect()
}

/// R1 at every look, not only at quiescence, while Redis loses nothing: in each bucket, Redis's
/// stock, the open reservations the ledger lacks, the ledger's units sold, the cancelled units
/// on their way back (cancelled in the ledger, neither open nor taken back by Redis), and the
/// transfers out less the transfers in add up to the bucket's initial stock. Every step of the
/// protocol moves units within one store at a time, in an order that keeps this sum (the
/// reconciler's own account), so with both stores read at one instant a step that loses or
/// doubles a unit shows at once, before a backstop (the reconciler, a recovery's rebuild) or the
/// final look could hide it. A bucket without its stock key is left to [`r1_reconciled`].
pub fn r1_units_conserved(s: &Snapshot) -> Vec<Violation> {
    let open: BTreeSet<&str> = s
        .buckets
        .iter()
        .flat_map(|b| b.open.iter().map(|r| r.reservation.as_str()))
        .collect();
    let held = s.holding_reservations();
    s.buckets
        .iter()
        .filter_map(|b| {
            let released: BTreeSet<&str> = b.released_cancels.iter().map(String::as_str).collect();
            let unordered = b.unordered_units(&held);
            let orders = || s.orders.iter().filter(|o| o.bucket == b.bucket);
            let sold: u64 = orders().filter(|o| o.status.holds_stock()).map(|o| o.qty).sum();
            let returning: u64 = orders()
                .filter(|o| o.status == OrderStatus::Cancelled)
                .filter(|o| !released.contains(o.reservation.as_str()) && !open.contains(o.reservation.as_str()))
                .map(|o| o.qty)
                .sum();
            let stock = b.redis_stock?;
            let sum = stock + (unordered + sold + returning + b.transfers_out) as i64 - b.transfers_in as i64;
            (sum != b.initial as i64).then(|| {
                violation(
                    Invariant::R1Reconciled,
                    Some(b.bucket),
                    format!(
                        "redis {stock} + open unordered {unordered} + sold {sold} + cancelled on their way back \
                         {returning} + out {} - in {} = {sum}, initial {}",
                        b.transfers_out, b.transfers_in, b.initial
                    ),
                )
            })
        })
        .collect()
}

/// R1, bounded failures: an order fails for want of a unit only where Redis sold one it did not
/// have, and only a loss of Redis data makes Redis hold more than the ledger can sell — so no
/// more orders of a bucket fail (`failed`, per bucket) than Redis's losses gave it units. What a
/// loss gave: the units Redis came back with above what it held (`restored`: a key it lost
/// counts whole), or, where that is more, the units of the reserves it lost whose orders the
/// ledger took (`sold_twice`: a release lost in the same window can make the stock come back no
/// higher while those units are sold twice). Besides those, each reservation a loss brought back
/// open after it had been released (`revived`: the image predates its release, whose unit went
/// back to the stock and on to another buyer or a transfer) asks the ledger once more for a unit
/// that may be gone: the reconciler republishes it or a recovery rescues it, and it may fail.
/// A unit given back to Redis after its order failed is sold and fails again: a bug in that
/// follow-up shows here.
pub fn r1_failed_orders_bounded(
    failed: &BTreeMap<u32, u64>,
    restored: &BTreeMap<u32, u64>,
    sold_twice: &BTreeMap<u32, u64>,
    revived: &BTreeMap<u32, u64>,
) -> Vec<Violation> {
    failed
        .iter()
        .filter_map(|(&bucket, &failed)| {
            let units = |m: &BTreeMap<u32, u64>| m.get(&bucket).copied().unwrap_or(0);
            let gained = units(restored).max(units(sold_twice));
            let revived = units(revived);
            (failed > gained + revived).then(|| {
                violation(
                    Invariant::R1Reconciled,
                    Some(bucket),
                    format!(
                        "{failed} orders failed for want of a unit, and Redis restarts gave the \
                         bucket {gained} units more than it held and revived {revived} released \
                         reservations"
                    ),
                )
            })
        })
        .collect()
}

/// L2 bounded undersell, at quiescence of a sale whose demand exceeded its stock: no unit is left
/// unsold in Redis.
pub fn l2_bounded_undersell(s: &Snapshot) -> Vec<Violation> {
    let unsold: i64 = s.buckets.iter().filter_map(|b| b.redis_stock).sum();
    if unsold <= 0 {
        return Vec::new();
    }
    vec![violation(
        Invariant::L2BoundedUndersell,
        None,
        format!(
            "{unsold} units left unsold although demand exceeded stock (per bucket: {:?})",
            s.buckets
                .iter()
                .map(|b| b.redis_stock.unwrap_or(0))
                .collect::<Vec<_>>()
        ),
    )]
}

/// S5's ground: a gate's intent version (per bucket, read at two looks, `before` and `now`)
/// never goes back while Redis lives. The gates enforce the operator's latest intent only
/// because an older write — a call that was overtaken, a recovery's reopen with the intent it
/// read before a pause — never overrides a newer one; a version going back is a newer intent
/// undone (a pause lifted, a resume lost). The caller starts over after a Redis restart, which
/// may bring back an older gate (its write was past the AOF window) that the recovery reopens.
pub fn s5_intents_move_forward(before: &BTreeMap<u32, u64>, now: &BTreeMap<u32, u64>) -> Vec<Violation> {
    now.iter()
        .filter_map(|(&b, &v)| {
            let before = before.get(&b).copied().filter(|before| *before > v)?;
            Some(violation(
                Invariant::S5PauseHolds,
                Some(b),
                format!(
                    "the gate's intent went from version {before} back to {v}: an older intent \
                     overrode a newer one"
                ),
            ))
        })
        .collect()
}

/// S7 for a "duplicate" answer to `user`, checked against a look taken when the answer arrived:
/// "you already have one" is true while the user holds a live order or an open reservation. A
/// user marked a buyer in some bucket, with no open reservation or pending mark anywhere and no
/// live order in the ledger, holds a mark nothing justifies — a lockout the answer passed on.
/// Every way a mark goes or stays moves it with the entry in one script, so this holds until
/// Redis loses data; callers check it only where no loss is left unrepaired.
pub fn s7_duplicate_true(s: &Snapshot, user: u64) -> Vec<Violation> {
    if s.orders
        .iter()
        .any(|o| o.user == user && o.status != OrderStatus::Failed)
    {
        return Vec::new();
    }
    let marked: Vec<u32> = (s.buckets.iter())
        .filter(|b| b.buyers.contains(&user))
        .map(|b| b.bucket)
        .collect();
    let open = (s.buckets.iter()).any(|b| b.open.iter().any(|r| r.user == user) || b.pending.contains(&user));
    if marked.is_empty() || open {
        return Vec::new();
    }
    vec![violation(
        Invariant::S7AnswersTrue,
        marked.first().copied(),
        format!(
            "user {user} was told \"duplicate\" and is marked a buyer in buckets \
             {marked:?}, yet holds no live order and no open reservation"
        ),
    )]
}

/// A short verdict line: `ok`, or `VIOLATED S1,R1`.
pub fn verdict(violations: &[Violation]) -> String {
    if violations.is_empty() {
        return "ok".into();
    }
    let codes: BTreeSet<&str> = violations.iter().map(|v| v.invariant.code()).collect();
    format!("VIOLATED {}", codes.into_iter().collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s6_flags_only_an_open_gate_of_another_generation() {
        let gate = |bucket, open, generation| GateState {
            bucket,
            open,
            generation,
        };
        assert!(s6_open_gates_current(&[gate(0, true, 3), gate(1, false, 2)], 3).is_empty());
        let v = s6_open_gates_current(&[gate(0, true, 3), gate(1, true, 2)], 3);
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].invariant, v[0].bucket),
            (Invariant::S6GenerationFenced, Some(1))
        );
    }

    /// Two buckets of 5 units; bucket 0 sold 2 (one paid), one open reservation in bucket 1.
    fn healthy() -> Snapshot {
        let order = |r: &str, user, bucket, status| Order {
            reservation: r.into(),
            user,
            bucket,
            own_bucket: bucket,
            qty: 1,
            status,
        };
        Snapshot {
            activity: 1,
            total_stock: 10,
            buckets: vec![
                BucketState {
                    bucket: 0,
                    initial: 5,
                    redis_stock: Some(3),
                    ledger_initial: Some(5),
                    ledger_remaining: Some(3),
                    journal_delta: -2,
                    buyers: vec![1, 2],
                    ..Default::default()
                },
                BucketState {
                    bucket: 1,
                    initial: 5,
                    redis_stock: Some(4),
                    open: vec![OpenReservation {
                        reservation: "c".into(),
                        user: 3,
                        qty: 1,
                        own_bucket: 1,
                    }],
                    buyers: vec![3],
                    ledger_initial: Some(5),
                    ledger_remaining: Some(5),
                    ..Default::default()
                },
            ],
            orders: vec![
                order("a", 1, 0, OrderStatus::Created),
                order("b", 2, 0, OrderStatus::Paid),
                order("f", 9, 1, OrderStatus::Failed),
            ],
        }
    }

    fn codes(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(|v| v.invariant.code()).collect()
    }

    #[test]
    fn healthy_snapshot_passes_everything() {
        let s = healthy();
        assert_eq!(check_safety(&s), vec![]);
        assert_eq!(r1_reconciled(&s), vec![]);
        assert_eq!(s4_confirmed_kept(&s, &["a".into(), "b".into()]), vec![]);
        assert_eq!(verdict(&[]), "ok");
    }

    #[test]
    fn r2_catches_an_order_holder_left_unmarked() {
        let mut s = healthy();
        s.buckets[1].open.clear();
        assert_eq!(
            r2_buyers_marked(&s),
            vec![],
            "the failed order's user may be unmarked"
        );
        // a fallback winner: user 4 of bucket 0 holds a unit of bucket 1, marked only there
        s.orders.push(Order {
            reservation: "w".into(),
            user: 4,
            bucket: 1,
            own_bucket: 0,
            qty: 1,
            status: OrderStatus::Cancelled,
        });
        s.buckets[1].buyers.push(4);
        let v = r2_buyers_marked(&s);
        assert_eq!((codes(&v), v[0].bucket), (vec!["R2"], Some(0)));
        assert!(v[0].detail.contains("[4]"), "{}", v[0].detail);
        s.buckets[0].buyers.push(4);
        assert_eq!(r2_buyers_marked(&s), vec![]);
    }

    #[test]
    fn l3_catches_a_user_marked_with_only_a_failed_order() {
        let mut s = healthy();
        s.buckets[1].open.clear();
        s.buckets[1].buyers = vec![9]; // user 9's only order failed
        assert_eq!(codes(&l3_no_lockout(&s)), vec!["L3"]);
        s.orders.push(Order {
            reservation: "g".into(),
            user: 9,
            bucket: 1,
            own_bucket: 1,
            qty: 1,
            status: OrderStatus::Created,
        }); // bought again after the failure
        assert_eq!(l3_no_lockout(&s), vec![]);
    }

    #[test]
    fn s1_catches_ledger_selling_more_than_its_rows_say() {
        let mut s = healthy();
        s.orders.push(Order {
            reservation: "x".into(),
            user: 7,
            bucket: 0,
            own_bucket: 0,
            qty: 1,
            status: OrderStatus::Created,
        });
        let v = s1_no_oversell(&s);
        assert_eq!(codes(&v), vec!["S1"]);
        assert_eq!(v[0].bucket, Some(0));
    }

    #[test]
    fn s1_catches_negative_remaining_and_total_oversell() {
        let mut s = healthy();
        s.total_stock = 1;
        s.buckets[0].ledger_remaining = Some(-1);
        let v = s1_no_oversell(&s);
        assert!(v
            .iter()
            .any(|v| v.bucket.is_none() && v.detail.contains("2 units sold of 1")));
        assert!(v.iter().any(|v| v.detail.contains("remaining = -1")));
    }

    #[test]
    fn s1_catches_a_journal_that_disagrees() {
        let mut s = healthy();
        s.buckets[0].journal_delta = -1;
        let v = s1_no_oversell(&s);
        assert_eq!(codes(&v), vec!["S1"]);
        assert!(v[0].detail.contains("journal"));
    }

    #[test]
    fn s2_catches_two_live_orders_for_one_user() {
        let mut s = healthy();
        s.orders[1].user = 1;
        let v = s2_one_order_per_user(&s);
        assert_eq!(codes(&v), vec!["S2"]);
        assert!(v[0].detail.contains("user 1 has 2 orders"));
        // a failed order beside a live one is not a second order: it freed its user
        s.orders[1].user = 9;
        assert_eq!(s2_one_order_per_user(&s), vec![]);
        s.orders[2].status = OrderStatus::Cancelled; // a cancelled one does not free
        assert_eq!(codes(&s2_one_order_per_user(&s)), vec!["S2"]);
        s.orders[2].status = OrderStatus::Failed;
        s.orders[1].user = 2;
        assert_eq!(s2_one_order_per_user(&s), vec![]);
    }

    #[test]
    fn s3_catches_negative_redis_stock() {
        let mut s = healthy();
        s.buckets[1].redis_stock = Some(-2);
        let v = s3_redis_non_negative(&s);
        assert_eq!(codes(&v), vec!["S3"]);
        assert_eq!(v[0].bucket, Some(1));
    }

    #[test]
    fn s4_catches_a_lost_or_failed_confirmed_order() {
        let mut s = healthy();
        s.orders.retain(|o| o.reservation != "a"); // "a" is lost
        s.orders[0].status = OrderStatus::Failed; // "b" turned failed
        let v = s4_confirmed_kept(&s, &["a".into(), "b".into()]);
        assert_eq!(codes(&v), vec!["S4", "S4"]);
        assert!(v[0].detail.contains("missing"));
        assert!(v[1].detail.contains("now failed"));
    }

    #[test]
    fn r1_catches_lost_units_and_missing_keys() {
        let mut s = healthy();
        s.buckets[1].open.clear(); // the open unit vanished from Redis
        s.buckets[0].redis_stock = None;
        let v = r1_reconciled(&s);
        assert_eq!(codes(&v), vec!["R1", "R1"]);
        assert!(v[0].detail.contains("no stock key"));
        assert!(v[1].detail.contains("= 4, initial 5"));
        assert_eq!(verdict(&v), "VIOLATED R1");
    }

    #[test]
    fn r1_counts_an_unsettled_open_reservation_once() {
        let mut s = healthy();
        // the open reservation "c" reached the ledger but is not settled yet
        s.orders.push(Order {
            reservation: "c".into(),
            user: 3,
            bucket: 1,
            own_bucket: 1,
            qty: 1,
            status: OrderStatus::Created,
        });
        assert_eq!(r1_reconciled(&s), vec![]);
    }

    #[test]
    fn l1_catches_a_queued_reservation_left_open() {
        let s = healthy();
        // "a" is an order; "c" is still open in Redis and unknown to the ledger
        assert_eq!(l1_queued_resolved(&s, &["a".into()]), vec![]);
        let v = l1_queued_resolved(&s, &["a".into(), "c".into()]);
        assert_eq!(codes(&v), vec!["L1"]);
        assert_eq!(v[0].bucket, Some(1));
        // released (gone from Redis, never in the ledger) counts as resolved
        assert_eq!(l1_queued_resolved(&s, &["zz".into()]), vec![]);
    }

    #[test]
    fn s2_redis_catches_one_user_holding_two_reservations() {
        let mut s = healthy();
        assert_eq!(s2_redis_one_reservation_per_user(&s), vec![]);
        s.buckets[0].open.push(OpenReservation {
            reservation: "d".into(),
            user: 3,
            qty: 1,
            own_bucket: 1,
        });
        let v = s2_redis_one_reservation_per_user(&s);
        assert_eq!(codes(&v), vec!["S2"]);
        assert!(
            v[0].detail.contains("user 3 holds 2 open reservations"),
            "{}",
            v[0].detail
        );
    }

    #[test]
    fn s2_redis_catches_a_fallback_winner_without_its_own_mark() {
        let mut s = healthy();
        // user 3 holds "c" in bucket 1 but bucket 1 is really the fallback of its own bucket 0
        s.buckets[1].open[0].own_bucket = 0;
        let v = s2_redis_fallback_winners_marked(&s);
        assert_eq!(codes(&v), vec!["S2"]);
        assert!(
            v[0].detail.contains("no mark in its own bucket 0"),
            "{}",
            v[0].detail
        );
        s.buckets[0].buyers.push(3);
        assert_eq!(s2_redis_fallback_winners_marked(&s), vec![]);
    }

    #[test]
    fn l1_nothing_open_catches_a_stranded_reservation() {
        let mut s = healthy();
        let v = l1_nothing_open(&s);
        assert_eq!(codes(&v), vec!["L1"]);
        assert_eq!(v[0].bucket, Some(1));
        s.buckets[1].open.clear();
        assert_eq!(l1_nothing_open(&s), vec![]);
    }

    #[test]
    fn s1_uses_the_ledgers_own_transfers() {
        let mut s = healthy();
        // the ledger moved two units out of bucket 0: remaining 1, journal -2 orders -2 transfer
        s.buckets[0].ledger_remaining = Some(1);
        s.buckets[0].journal_delta = -4;
        assert_eq!(
            codes(&s1_no_oversell(&s)),
            vec!["S1"],
            "unexplained without the transfer"
        );
        s.buckets[0].ledger_transfers_net = -2;
        assert_eq!(s1_no_oversell(&s), vec![]);
    }

    #[test]
    fn r1_no_failed_orders_catches_a_unit_redis_promised_twice() {
        let s = healthy();
        let v = r1_no_failed_orders(&s);
        assert_eq!(codes(&v), vec!["R1"]);
        assert!(
            v[0].detail.contains("order f of user 9 failed"),
            "{}",
            v[0].detail
        );
        let mut s = s;
        s.orders.retain(|o| o.status != OrderStatus::Failed);
        assert_eq!(r1_no_failed_orders(&s), vec![]);
    }

    #[test]
    fn r1_accounts_for_transfers() {
        let mut s = healthy();
        s.buckets[0].redis_stock = Some(1); // two units moved out of bucket 0 ...
        s.buckets[0].transfers_out = 2;
        s.buckets[1].redis_stock = Some(6); // ... into bucket 1
        s.buckets[1].transfers_in = 2;
        (
            s.buckets[0].ledger_transfers_net,
            s.buckets[1].ledger_transfers_net,
        ) = (-2, 2);
        assert_eq!(r1_reconciled(&s), vec![]);
        s.buckets[1].transfers_in = 1;
        assert_eq!(codes(&r1_reconciled(&s)), vec!["R1", "R1"]);
        // A take undone by a rebuild (mark gone, units back in the source) whose give came after:
        // each bucket adds up on its own, but the units are in Redis twice.
        s.buckets[0].redis_stock = Some(3);
        s.buckets[0].transfers_out = 0;
        s.buckets[1].transfers_in = 2;
        assert_eq!(codes(&r1_reconciled(&s)), vec!["R1"]);
        assert!(r1_reconciled(&s)[0].detail.contains("ledger's journal -2"));
    }

    #[test]
    fn r1_units_conserved_counts_a_cancel_on_its_way_back_once() {
        let mut s = healthy();
        assert_eq!(r1_units_conserved(&s), vec![]);
        // order a is cancelled: its unit is on its way back until Redis takes it in
        s.orders[0].status = OrderStatus::Cancelled;
        assert_eq!(r1_units_conserved(&s), vec![]);
        s.buckets[0].redis_stock = Some(4);
        assert_eq!(
            codes(&r1_units_conserved(&s)),
            vec!["R1"],
            "taken back, but not marked so"
        );
        s.buckets[0].released_cancels.push("a".into());
        assert_eq!(r1_units_conserved(&s), vec![]);
        s.buckets[1].redis_stock = None; // a lost key is the final look's business
        assert_eq!(r1_units_conserved(&s), vec![]);
    }

    #[test]
    fn r1_failed_orders_bounded_by_what_the_losses_gave() {
        let m = |pairs: &[(u32, u64)]| pairs.iter().copied().collect::<BTreeMap<u32, u64>>();
        let failed = m(&[(0, 2), (1, 1)]);
        let none = m(&[]);
        assert_eq!(
            r1_failed_orders_bounded(&failed, &m(&[(0, 2)]), &m(&[(1, 1)]), &none),
            vec![]
        );
        let v = r1_failed_orders_bounded(&failed, &m(&[(0, 1)]), &m(&[(0, 1), (1, 3)]), &none);
        assert_eq!((codes(&v), v[0].bucket), (vec!["R1"], Some(0)));
        assert!(v[0].detail.starts_with("2 orders failed"), "{}", v[0].detail);
        // A revived reservation excuses one more failure, on top of what the stock gained.
        assert_eq!(
            r1_failed_orders_bounded(&failed, &m(&[(0, 1)]), &none, &m(&[(0, 1), (1, 1)])),
            vec![]
        );
        let v = r1_failed_orders_bounded(&m(&[(0, 3)]), &m(&[(0, 1)]), &m(&[(0, 1)]), &m(&[(0, 1)]));
        assert_eq!((codes(&v), v[0].bucket), (vec!["R1"], Some(0)));
    }

    #[test]
    fn l2_flags_units_left_unsold() {
        let mut s = healthy();
        assert_eq!(codes(&l2_bounded_undersell(&s)), vec!["L2"]);
        s.buckets[0].redis_stock = Some(0);
        s.buckets[1].redis_stock = None;
        assert_eq!(l2_bounded_undersell(&s), vec![]);
    }

    #[test]
    fn s5_flags_an_intent_version_going_back() {
        let before = BTreeMap::from([(0, 3), (1, 5)]);
        assert_eq!(
            s5_intents_move_forward(&before, &BTreeMap::from([(0, 3), (1, 6), (2, 1)])),
            vec![]
        );
        let v = s5_intents_move_forward(&before, &BTreeMap::from([(0, 4), (1, 4)]));
        assert_eq!((codes(&v), v[0].bucket), (vec!["S5"], Some(1)));
    }

    #[test]
    fn s7_duplicate_is_true_only_for_a_holder() {
        let mut s = healthy();
        assert_eq!(s7_duplicate_true(&s, 1), vec![], "user 1 holds order a");
        assert_eq!(
            s7_duplicate_true(&s, 3),
            vec![],
            "user 3 holds an open reservation"
        );
        assert_eq!(
            s7_duplicate_true(&s, 8),
            vec![],
            "user 8 is not marked: the answer was stale, not a lockout"
        );
        s.buckets[1].buyers.push(9); // user 9's only order failed, its mark stayed
        let v = s7_duplicate_true(&s, 9);
        assert_eq!((codes(&v), v[0].bucket), (vec!["S7"], Some(1)));
        s.buckets[0].pending.push(9); // ... unless an attempt of its own is pending
        assert_eq!(s7_duplicate_true(&s, 9), vec![]);
    }
}
