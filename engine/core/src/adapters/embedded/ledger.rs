//! An in-memory ledger with the MySQL contract of DESIGN §6: `stock_bucket` rows with
//! `remaining >= 0`, `seckill_order` with UNIQUE(reservation_id) and one live order per
//! (activity_id, user_id) (a failed order keeps its reservation id but frees its user, as the
//! generated `live_user` key does in MySQL), the conditional stock update, and a
//! `stock_journal` row for every movement.
//!
//! A batch is one transaction: it is applied under one `std::sync::Mutex` and nothing in it can
//! fail half-way, so either all of it is visible or none of it is.

use crate::domain::{
    Activity, ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId,
};
use crate::ports::{
    ApplyOutcome, CancelOutcome, Intent, JournalEntry, JournalKind, Ledger, LedgerBucket, LedgerView,
    OrderRow, OrderStatus, PayOutcome, PortError, PortResult, ReconcileView, Registered, Transfer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone, Default)]
pub struct EmbeddedLedger {
    state: Arc<Mutex<LedgerState>>,
}

#[derive(Default)]
struct LedgerState {
    /// The registry: each activity with the operator's intent and its generation.
    activities: BTreeMap<ActivityId, Registered>,
    /// `stock_bucket`: (initial, remaining).
    buckets: BTreeMap<(ActivityId, BucketNo), (u64, i64)>,
    /// `seckill_order`, by activity then reservation id: one sale's orders are one range (the
    /// jobs read an activity every few seconds and must not pay for every other sale's orders).
    orders: BTreeMap<(ActivityId, ReservationId), OrderRow>,
    /// The UNIQUE(reservation_id) index.
    activity_of: BTreeMap<ReservationId, ActivityId>,
    /// The UNIQUE(activity_id, live_user) index: each user's live (non-failed) order.
    by_user: BTreeMap<(ActivityId, UserId), ReservationId>,
    /// Each user's latest failed order (what `order_of` shows while there is no live one).
    failed_by_user: BTreeMap<(ActivityId, UserId), ReservationId>,
    /// `seckill_order.payment_id` of paid orders.
    payments: BTreeMap<ReservationId, String>,
    /// `stock_journal`, in insertion order, per activity.
    journal: BTreeMap<ActivityId, Vec<JournalEntry>>,
}

impl EmbeddedLedger {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LedgerState {
    fn apply_one(&mut self, r: &Reservation) -> ApplyOutcome {
        if self.activity_of.contains_key(&r.id) {
            return ApplyOutcome::Redelivered;
        }
        let current = self.activities.get(&r.activity).map(|a| a.intent.generation);
        let current = current.filter(|_| !crate::planted::on(crate::planted::Bug::NoGenerationCheck));
        let stale = current.is_some_and(|g| r.generation < g);
        let existing = self.by_user.get(&(r.activity, r.user)).copied();
        let existing = existing.filter(|_| !crate::planted::on(crate::planted::Bug::NoBuyerUniqueKey));
        if let Some(existing) = existing {
            return ApplyOutcome::DuplicateBuyer { existing };
        }
        let Some((_, remaining)) = self.buckets.get_mut(&(r.activity, r.bucket)) else {
            return ApplyOutcome::UnknownBucket;
        };
        let qty = r.qty as i64;
        let guard = *remaining >= qty;
        let guard = guard || crate::planted::on(crate::planted::Bug::NoStockGuard);
        let (status, outcome) = if stale {
            (OrderStatus::Failed, ApplyOutcome::StaleGeneration)
        } else if guard {
            *remaining -= qty;
            self.journal.entry(r.activity).or_default().push(JournalEntry {
                bucket: r.bucket,
                kind: JournalKind::Order,
                reference: r.id.to_string(),
                delta: -qty,
            });
            (OrderStatus::Created, ApplyOutcome::Created)
        } else {
            (OrderStatus::Failed, ApplyOutcome::OutOfStock)
        };
        self.orders.insert(
            (r.activity, r.id),
            OrderRow {
                reservation: r.clone(),
                status,
            },
        );
        if status == OrderStatus::Failed {
            self.failed_by_user.insert((r.activity, r.user), r.id);
        } else {
            self.by_user.insert((r.activity, r.user), r.id);
        }
        self.activity_of.insert(r.id, r.activity);
        outcome
    }
}

impl LedgerState {
    /// One activity's orders, by reservation id.
    fn orders_of(&self, activity: ActivityId) -> impl Iterator<Item = &OrderRow> {
        self.orders
            .range((activity, ReservationId(0))..=(activity, ReservationId(u128::MAX)))
            .map(|(_, o)| o)
    }

    fn order_mut(&mut self, id: ReservationId) -> Option<&mut OrderRow> {
        let activity = *self.activity_of.get(&id)?;
        self.orders.get_mut(&(activity, id))
    }

    fn order(&self, id: ReservationId) -> Option<&OrderRow> {
        let activity = *self.activity_of.get(&id)?;
        self.orders.get(&(activity, id))
    }

    /// Cancel a created order: status, stock back to its bucket, journal row.
    fn cancel_created(&mut self, id: ReservationId) -> Reservation {
        let order = self.order_mut(id).expect("the caller found a created order");
        order.status = OrderStatus::Cancelled;
        let r = order.reservation.clone();
        if let Some((_, remaining)) = self.buckets.get_mut(&(r.activity, r.bucket)) {
            *remaining += r.qty as i64;
        }
        self.journal.entry(r.activity).or_default().push(JournalEntry {
            bucket: r.bucket,
            kind: JournalKind::Cancel,
            reference: r.id.to_string(),
            delta: r.qty as i64,
        });
        r
    }
}

/// An intent is open, paused or closed; `recovering` is a gate's state, never an operator's.
pub fn check_intent(state: ActivityState) -> PortResult<()> {
    match state {
        ActivityState::Recovering => Err(PortError::determinate(
            "set intent",
            "state: an operator sets open, paused or closed",
        )),
        _ => Ok(()),
    }
}

/// Why a transfer of an older generation than the registry's `current` is refused (every ledger
/// says it so).
pub fn stale_transfer(t: &Transfer, current: u64) -> String {
    format!(
        "generation: transfer {} was taken under generation {}, the registry is at {current} \
         (a recovery rebuilt the buckets since, without it)",
        t.id, t.generation
    )
}

impl Ledger for EmbeddedLedger {
    async fn cancel_unpaid(&self, activity: ActivityId, now_ms: u64) -> PortResult<Vec<Reservation>> {
        let mut st = self.lock();
        let Some(timeout) = st
            .activities
            .get(&activity)
            .map(|a| a.activity.spec().pay_timeout_ms)
        else {
            return Ok(Vec::new());
        };
        let due: Vec<ReservationId> = st
            .orders_of(activity)
            .filter(|o| o.status == OrderStatus::Created)
            .filter(|o| o.reservation.reserved_at_ms.saturating_add(timeout) <= now_ms)
            .map(|o| o.reservation.id)
            .collect();
        Ok(due.into_iter().map(|id| st.cancel_created(id)).collect())
    }

    async fn install(&self, activity: &Activity, plan: &StockPlan) -> PortResult<bool> {
        let mut st = self.lock();
        if let Some(existing) = st.activities.get(&activity.id()) {
            let version = StockPlan::new(&existing.activity).version;
            if version != plan.version {
                return Err(PortError::determinate(
                    "install",
                    format!(
                        "activity {} is installed with plan {version}, not {}",
                        activity.id(),
                        plan.version
                    ),
                ));
            }
            return Ok(false);
        }
        st.activities.insert(
            activity.id(),
            Registered {
                activity: activity.clone(),
                intent: Intent::FIRST,
            },
        );
        for b in plan.all_buckets() {
            let units = plan.initial(b);
            st.buckets.insert((activity.id(), b), (units, units as i64));
        }
        Ok(true)
    }

    async fn apply(&self, batch: &[Reservation]) -> PortResult<Vec<ApplyOutcome>> {
        let mut st = self.lock();
        Ok(batch.iter().map(|r| st.apply_one(r)).collect())
    }

    async fn transfer(&self, activity: ActivityId, t: &Transfer) -> PortResult<bool> {
        if t.from == t.to {
            return Err(PortError::determinate(
                "transfer",
                format!("from bucket {} to itself", t.from),
            ));
        }
        let mut st = self.lock();
        let done = st.journal.get(&activity).is_some_and(|j| {
            j.iter()
                .any(|e| e.kind == JournalKind::Transfer && e.reference == t.id)
        });
        if done {
            return Ok(false);
        }
        if let Some(current) = st.activities.get(&activity).map(|a| a.intent.generation) {
            if t.generation < current {
                return Err(PortError::determinate("transfer", stale_transfer(t, current)));
            }
        }
        let units = t.units as i64;
        match st.buckets.get(&(activity, t.from)) {
            Some((_, remaining)) if *remaining >= units => {}
            Some(_) => {
                return Err(PortError::determinate(
                    "transfer",
                    format!("bucket {} lacks {units} units", t.from),
                ))
            }
            None => {
                return Err(PortError::determinate(
                    "transfer",
                    format!("no bucket {}", t.from),
                ))
            }
        }
        if !st.buckets.contains_key(&(activity, t.to)) {
            return Err(PortError::determinate("transfer", format!("no bucket {}", t.to)));
        }
        for (bucket, delta) in [(t.from, -units), (t.to, units)] {
            st.buckets.get_mut(&(activity, bucket)).expect("checked above").1 += delta;
            st.journal.entry(activity).or_default().push(JournalEntry {
                bucket,
                kind: JournalKind::Transfer,
                reference: t.id.clone(),
                delta,
            });
        }
        Ok(true)
    }

    async fn pay(&self, id: ReservationId, payment: &str) -> PortResult<PayOutcome> {
        let mut st = self.lock();
        let Some(order) = st.order_mut(id) else {
            return Ok(PayOutcome::NotFound);
        };
        Ok(match order.status {
            OrderStatus::Created => {
                order.status = OrderStatus::Paid;
                st.payments.insert(id, payment.to_string());
                PayOutcome::Paid
            }
            OrderStatus::Paid => match st.payments.get(&id) {
                Some(p) if p != payment => PayOutcome::PaidWithOther(p.clone()),
                _ => PayOutcome::AlreadyPaid,
            },
            other => PayOutcome::NotPayable(other),
        })
    }

    async fn order(&self, id: ReservationId) -> PortResult<Option<OrderRow>> {
        Ok(self.lock().order(id).cloned())
    }

    async fn cancel(&self, id: ReservationId) -> PortResult<CancelOutcome> {
        let mut st = self.lock();
        Ok(match st.order(id).map(|o| o.status) {
            None => CancelOutcome::NotFound,
            Some(OrderStatus::Created) => CancelOutcome::Cancelled(st.cancel_created(id)),
            Some(OrderStatus::Cancelled) => CancelOutcome::AlreadyCancelled,
            Some(other) => CancelOutcome::NotCancellable(other),
        })
    }

    async fn activity(&self, id: ActivityId) -> PortResult<Option<Activity>> {
        Ok(self.lock().activities.get(&id).map(|r| r.activity.clone()))
    }

    async fn registry(&self, id: ActivityId) -> PortResult<Option<Registered>> {
        Ok(self.lock().activities.get(&id).cloned())
    }

    async fn registered(&self) -> PortResult<Vec<Registered>> {
        Ok(self.lock().activities.values().cloned().collect())
    }

    async fn set_intent(&self, id: ActivityId, state: ActivityState) -> PortResult<Option<Intent>> {
        check_intent(state)?;
        let mut st = self.lock();
        Ok(st.activities.get_mut(&id).map(|r| {
            r.intent.state = state;
            r.intent.version += 1;
            r.intent.clone()
        }))
    }

    async fn bump_generation(&self, id: ActivityId, from: u64) -> PortResult<Option<Intent>> {
        let mut st = self.lock();
        let r = st.activities.get_mut(&id).ok_or_else(|| {
            PortError::determinate("bump generation", format!("activity {id} is not installed"))
        })?;
        // Planted: the UPDATE without its condition, bumping whatever the registry holds when
        // it arrives (a runner's bump delivered after another runner's moves it past the gates).
        let from = match crate::planted::on(crate::planted::Bug::UnfencedBump) {
            true => r.intent.generation,
            false => from,
        };
        if r.intent.generation != from {
            return Ok(None);
        }
        r.intent.generation += 1;
        Ok(Some(r.intent.clone()))
    }

    async fn order_of(&self, activity: ActivityId, user: UserId) -> PortResult<Option<OrderRow>> {
        let st = self.lock();
        Ok(st
            .by_user
            .get(&(activity, user))
            .or_else(|| st.failed_by_user.get(&(activity, user)))
            .and_then(|id| st.order(*id))
            .cloned())
    }

    async fn reconcile_view(
        &self,
        activity: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> PortResult<ReconcileView> {
        Ok(ReconcileView::of(self.lock().orders_of(activity), mentioned))
    }

    async fn snapshot(&self, activity: ActivityId) -> PortResult<LedgerView> {
        let st = self.lock();
        Ok(LedgerView {
            buckets: st
                .buckets
                .range((activity, BucketNo(0))..=(activity, BucketNo(u32::MAX)))
                .map(|(&(_, bucket), &(initial, remaining))| LedgerBucket {
                    bucket,
                    initial,
                    remaining,
                })
                .collect(),
            orders: st.orders_of(activity).cloned().collect(),
            journal: st.journal.get(&activity).cloned().unwrap_or_default(),
        })
    }
}
