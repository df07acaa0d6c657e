//! The order consumer: poll a batch → `Ledger::apply` (one transaction) → release what the
//! ledger refused, settle the rest in Redis → commit the offsets. Always in that order.
//!
//! Kept true: offsets are committed only after the ledger committed the batch, so a crash at any
//! point redelivers instead of losing; redelivery is harmless because the ledger dedupes by
//! reservation id. Redis follow-ups (settle/release) never block the commit: a reservation left
//! open by a failed follow-up is closed by the reconciler, which sees the ledger holds it.
//!
//! And no record is skipped: a batch that failed is delivered again only if the source rewinds
//! (a Kafka consumer's position is already past it), so after a failed rewind nothing more is
//! polled until a rewind succeeds; and a batch that starts past where this member's last batch of
//! a partition began or ended (records skipped, whatever the cause) is never committed.

use crate::domain::{ActivityId, Reservation, ReservationId, StockPlan};
use crate::ports::{
    ApplyOutcome, Delivery, Ledger, OrderSource, PortError, PortResult, ReleaseKind, StockCache,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{debug_span, Instrument, Span};

/// The consumer group that applies orders to the ledger (`seckill audit` reads its lag).
pub const ORDER_GROUP: &str = "seckill-orders";
/// Deliveries per ledger transaction: large enough to amortize the commit (the point of
/// batching), small enough that one transaction holds its row locks only briefly.
pub const DEFAULT_MAX_BATCH: usize = 256;
/// Pause after a failed batch before polling again, so a down ledger is not hammered.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    pub delivered: u64,
    pub created: u64,
    pub redelivered: u64,
    pub duplicate_buyers: u64,
    pub out_of_stock: u64,
    /// Orders refused for an older generation than the activity's (recorded failed).
    pub stale_generation: u64,
    pub dead_lettered: u64,
    /// Settles/releases that failed and were left to the reconciler.
    pub followups_failed: u64,
}

impl BatchReport {
    /// Count the batch in the process's metrics (exported from start, at zero).
    pub fn record(&self) {
        for (outcome, n) in [
            ("created", self.created),
            ("redelivered", self.redelivered),
            ("duplicate_buyer", self.duplicate_buyers),
            ("out_of_stock", self.out_of_stock),
            ("stale_generation", self.stale_generation),
            ("dead_lettered", self.dead_lettered),
        ] {
            metrics::counter!("seckill_consumer_orders_total", "outcome" => outcome).increment(n);
        }
        metrics::counter!("seckill_consumer_followups_failed_total").increment(self.followups_failed);
    }

    pub fn add(&mut self, o: &BatchReport) {
        self.delivered += o.delivered;
        self.created += o.created;
        self.redelivered += o.redelivered;
        self.duplicate_buyers += o.duplicate_buyers;
        self.out_of_stock += o.out_of_stock;
        self.stale_generation += o.stale_generation;
        self.dead_lettered += o.dead_lettered;
        self.followups_failed += o.followups_failed;
    }
}

pub struct OrderConsumer<L, C, S> {
    ledger: L,
    cache: C,
    source: S,
    max_batch: usize,
    /// A batch failed and its rewind did not succeed: the source's position may be past records
    /// nobody applied, so nothing is polled until a rewind succeeds.
    rewind_due: bool,
    /// Per partition, the offset the next batch may start at, at the latest: where the last
    /// committed batch ended, or where the first batch handed out since began. Forgotten at
    /// every rewind (the source starts again at the group's committed offsets). A partition
    /// that moved to another member and came back may start later (the other member committed
    /// past it): that costs one rewind, never a skipped record.
    next: BTreeMap<u32, u64>,
    /// The plans of activities this consumer freed a failed order's user in.
    plans: BTreeMap<ActivityId, StockPlan>,
}

/// What an applied order asks of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FollowUp {
    /// Close the reservation: the ledger holds the order.
    Settle,
    /// Give the units back: the ledger refused it for a duplicate buyer.
    Release,
    /// Free the user: the ledger failed it.
    Free,
}

/// Free the user of an order the ledger failed (the consumer's follow-up, and the reconciler's
/// when that follow-up did not happen).
pub(crate) async fn free_failed<C: StockCache>(
    cache: &C,
    plan: &StockPlan,
    r: &Reservation,
) -> PortResult<bool> {
    if crate::planted::on(crate::planted::Bug::FailedOrderLocksOut) {
        // Planted: closed as if it were an order; the user stays marked a buyer.
        return cache.settle(r).await;
    }
    cache.free_failed(plan, r).await
}

impl<L: Ledger, C: StockCache, S: OrderSource> OrderConsumer<L, C, S> {
    pub fn new(ledger: L, cache: C, source: S, max_batch: usize) -> Self {
        OrderConsumer {
            ledger,
            cache,
            source,
            max_batch: max_batch.max(1),
            rewind_due: false,
            next: BTreeMap::new(),
            plans: BTreeMap::new(),
        }
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// One poll → apply → follow-up → commit cycle. On an error nothing is committed and the
    /// source is rewound, so the same records come again.
    pub async fn run_once(&mut self) -> PortResult<BatchReport> {
        if self.rewind_due {
            self.rewind().await?;
        }
        let batch = match self.source.poll(self.max_batch).await {
            Ok(batch) => batch,
            Err(e) => {
                // A source must not advance past records it did not return; rewinding anyway
                // costs one re-read and guards against one that does.
                self.rewind_after_failure().await;
                return Err(e);
            }
        };
        let mut report = BatchReport {
            delivered: batch.len() as u64,
            ..Default::default()
        };
        if batch.is_empty() {
            return Ok(report);
        }
        let result = match self.skipped(&batch) {
            Some(gap) => Err(gap),
            None => {
                let span = debug_span!("consumer.batch", records = batch.len());
                self.process(&batch, &mut report).instrument(span).await
            }
        };
        if let Err(e) = result {
            self.rewind_after_failure().await;
            return Err(e);
        }
        for d in &batch {
            let next = self.next.entry(d.partition).or_default();
            *next = (*next).max(d.offset + 1);
        }
        Ok(report)
    }

    /// Rewind the source; a failure leaves the rewind due (nothing is polled before it is done).
    async fn rewind(&mut self) -> PortResult<()> {
        self.rewind_due = true;
        self.next.clear();
        self.source.rewind().await?;
        self.rewind_due = false;
        Ok(())
    }

    async fn rewind_after_failure(&mut self) {
        if crate::planted::on(crate::planted::Bug::FailedRewindIgnored) {
            // Planted: best effort, as if the source resynced by itself.
            let _ = self.source.rewind().await;
            return;
        }
        if let Err(e) = self.rewind().await {
            metrics::counter!("seckill_consumer_rewind_failures_total").increment(1);
            tracing::warn!(error = %e, "rewind failed; nothing is polled until one succeeds");
        }
    }

    /// Does `batch` start past a record of its partition that this member has not applied?
    /// (Then committing it would skip that record for good.) Records the start of a partition
    /// seen for the first time since the last rewind.
    fn skipped(&mut self, batch: &[Delivery]) -> Option<PortError> {
        if crate::planted::on(crate::planted::Bug::FailedRewindIgnored) {
            return None;
        }
        let mut first: BTreeMap<u32, u64> = BTreeMap::new();
        for d in batch {
            let f = first.entry(d.partition).or_insert(d.offset);
            *f = (*f).min(d.offset);
        }
        for (p, at) in first {
            match self.next.get(&p) {
                Some(&next) if at > next => {
                    return Some(PortError::determinate(
                        "poll",
                        format!("partition {p}: the batch starts at offset {at}, records from {next} were never applied"),
                    ))
                }
                Some(_) => {}
                None => {
                    self.next.insert(p, at);
                }
            }
        }
        None
    }

    async fn process(
        &mut self,
        batch: &[crate::ports::Delivery],
        report: &mut BatchReport,
    ) -> PortResult<()> {
        let mut events: Vec<Reservation> = Vec::with_capacity(batch.len());
        let mut origin = Vec::with_capacity(batch.len());
        // A record that carries its purchase's trace gets a span continuing it, with the ledger's
        // commit and its settle as children (none when nothing is traced).
        let mut traced: BTreeMap<ReservationId, Span> = BTreeMap::new();
        for d in batch {
            match Reservation::decode(&d.payload) {
                Ok(r) => {
                    if let Some(parent) = &d.trace {
                        let span = debug_span!("order", reservation = %r.id, activity = %r.activity,
                            bucket = r.bucket.0, partition = d.partition, offset = d.offset,
                            outcome = tracing::field::Empty);
                        crate::trace::adopt(&span, parent);
                        traced.insert(r.id, span);
                    }
                    events.push(r);
                    origin.push(d);
                }
                Err(e) => {
                    self.source.dead_letter(d, &e.to_string()).await?;
                    report.dead_lettered += 1;
                }
            }
        }
        if crate::planted::on(crate::planted::Bug::AckBeforeCommit) {
            self.source.commit(batch).await?;
        }
        let outcomes = if events.is_empty() {
            Vec::new()
        } else {
            let started = tokio::time::Instant::now();
            let commits: Vec<Span> = (traced.values())
                .map(|s| debug_span!(parent: s, "ledger.commit", records = events.len()))
                .collect();
            let outcomes = self.ledger.apply(&events).await?;
            drop(commits);
            metrics::histogram!("seckill_apply_seconds").record(started.elapsed().as_secs_f64());
            // Fault point: a worker stalled between the ledger's commit and the settles (the
            // orders exist while their reservations are still open in Redis: the reconciler may
            // settle or republish them meanwhile, and the batch is not committed on the bus).
            // Rare and mostly shorter than the group's session timeout: a worker stalled past it
            // on every tenth batch is kicked from the group faster than it can commit anything.
            crate::planted::stall(50, std::time::Duration::from_millis(1_500)).await;
            outcomes
        };
        if outcomes.len() != events.len() {
            return Err(PortError::indeterminate(
                "apply",
                format!(
                    "ledger returned {} outcomes for {} events",
                    outcomes.len(),
                    events.len()
                ),
            ));
        }
        // What each outcome asks of Redis. Created/Redelivered: the order is durable, close the
        // reservation. OutOfStock / StaleGeneration: the ledger recorded it failed, which frees
        // its user (DESIGN §6): the entry closes with no units back (the unit it claims does not
        // exist in the ledger — Redis was overstating its stock — or is not in the rebuilt Redis)
        // and the buyer mark goes. DuplicateBuyer: the user holds another order, so this
        // reservation's units go back.
        let mut followups = Vec::with_capacity(events.len());
        for ((r, outcome), d) in events.iter().zip(&outcomes).zip(origin) {
            if let Some(span) = traced.get(&r.id) {
                span.record("outcome", tracing::field::debug(outcome));
            }
            let followup = match outcome {
                ApplyOutcome::Created => {
                    report.created += 1;
                    FollowUp::Settle
                }
                ApplyOutcome::Redelivered => {
                    report.redelivered += 1;
                    let planted = crate::planted::on(crate::planted::Bug::RedeliveredAsDuplicate);
                    if planted {
                        FollowUp::Release
                    } else {
                        FollowUp::Settle
                    }
                }
                ApplyOutcome::OutOfStock => {
                    report.out_of_stock += 1;
                    FollowUp::Free
                }
                // Reserved before a recovery and published after it (a process paused past the
                // delivery timeout).
                ApplyOutcome::StaleGeneration => {
                    report.stale_generation += 1;
                    FollowUp::Free
                }
                ApplyOutcome::DuplicateBuyer { .. } => {
                    report.duplicate_buyers += 1;
                    FollowUp::Release
                }
                ApplyOutcome::UnknownBucket => {
                    report.dead_lettered += 1;
                    let reason = format!("activity {} has no bucket {} in the ledger", r.activity, r.bucket);
                    self.source.dead_letter(d, &reason).await?;
                    continue;
                }
            };
            followups.push((r, followup));
        }
        // Freeing a user needs the plan (its own bucket); failed orders are rare, plans fixed.
        for (r, f) in &followups {
            if *f == FollowUp::Free && !self.plans.contains_key(&r.activity) {
                if let Ok(Some(a)) = self.ledger.activity(r.activity).await {
                    self.plans.insert(r.activity, StockPlan::new(&a));
                }
            }
        }
        // Independent reservations: one round trip for the whole batch, not one per order.
        let (cache, plans) = (&self.cache, &self.plans);
        let results = futures::future::join_all(followups.into_iter().map(|(r, followup)| {
            let span = (traced.get(&r.id)).map_or_else(
                Span::none,
                |s| debug_span!(parent: s, "redis.followup", followup = ?followup),
            );
            async move {
                match followup {
                    FollowUp::Settle => cache.settle(r).await.map(drop),
                    FollowUp::Release => cache.release(r, ReleaseKind::Rejected).await.map(drop),
                    // Without its plan, left to the reconciler (which frees what the ledger failed).
                    FollowUp::Free => match plans.get(&r.activity) {
                        Some(plan) => free_failed(cache, plan, r).await.map(drop),
                        None => Err(PortError::determinate(
                            "free failed",
                            "the activity's plan is unknown",
                        )),
                    },
                }
            }
            .instrument(span)
        }))
        .await;
        report.followups_failed += results.iter().filter(|r| r.is_err()).count() as u64;
        self.source.commit(batch).await
    }

    /// Run batches until `stop` is set and a poll comes back empty (so a stop drains what is
    /// already delivered). Failed batches are retried after a short pause.
    pub async fn run(&mut self, stop: &AtomicBool) -> BatchReport {
        let mut total = BatchReport::default();
        loop {
            match self.run_once().await {
                Ok(report) => {
                    report.record();
                    total.add(&report);
                    if report.delivered == 0 && stop.load(Ordering::Acquire) {
                        return total;
                    }
                }
                Err(e) => {
                    metrics::counter!("seckill_consumer_batch_failures_total").increment(1);
                    tracing::warn!(error = %e, "order batch failed; it is delivered again");
                    tokio::time::sleep(RETRY_PAUSE).await
                }
            }
        }
    }
}
