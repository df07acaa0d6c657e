//! Settle: wait, after the heal, until every queued reservation is an order or a failure and
//! the bus is drained — or say what never settled.

use super::{Fault, World, ACTIVITY, SETTLE_LIMIT};
use crate::nodes::GROUP;
use seckill_core::planted;
use seckill_core::ports::{Ledger, StockCache};
use std::time::Duration;

impl World {
    /// Wait until the consumers have committed everything on the bus (three looks in a row).
    /// Wait for quiescence: the bus drained, nothing open or pending in Redis, every cancelled
    /// unit back, and the activity open on the current Redis epoch — three looks in a row.
    pub(super) async fn settle(&self) -> bool {
        let mut deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
        let mut quiet = 0;
        let mut why = String::new();
        let operated = self.cfg.scenario.faults().contains(&Fault::OperatorPause);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // A sleep at a long fault point (each fires once at most) or a zombie held until a
            // bump (at most its hold) is the faults' time, not the engine's.
            if planted::stalled() > 0 || self.zombie.lock().expect("zombie").is_some() {
                deadline += Duration::from_millis(50);
            }
            // An operator's pause still in flight when the nemesis stopped can land after the
            // heal's resume (its caller gave up, the API node carried on): the operator sees the
            // registry paused and resumes again, as one would.
            if operated {
                let intent = self.god.ledger.registry(ACTIVITY).await.expect("in-process");
                if intent.is_some_and(|r| r.intent.state != seckill_core::domain::ActivityState::Open) {
                    self.faults
                        .event("operator: the registry is not open after the heal".into());
                    self.resume().await;
                }
            }
            why = self.unsettled().await;
            quiet = if why.is_empty() { quiet + 1 } else { 0 };
            if quiet >= 3 {
                self.faults.event("settled".into());
                return true;
            }
        }
        self.faults.event(format!("not settled: {why}"));
        false
    }

    /// Why the world is not quiescent yet ("" when it is).
    pub(super) async fn unsettled(&self) -> String {
        // A process asleep at a fault point wakes up as a zombie and goes on where it was: the
        // world is not settled before it did.
        let stalled = planted::stalled();
        if stalled > 0 {
            return format!("{stalled} processes asleep at a fault point");
        }
        if self.zombie.lock().expect("zombie").is_some() {
            return "an API node paused until a recovery's bump".into();
        }
        let held = self.faults.held_back_left();
        if !held.is_zero() {
            return format!(
                "a request held back by the network lands in {} ms",
                held.as_millis()
            );
        }
        let lag = self.kafka.lag(GROUP);
        if lag > 0 {
            return format!("bus lag {lag}");
        }
        if !self.cfg.jobs {
            return String::new(); // without the jobs, a drained bus is all that can settle
        }
        let view = self.god.raw_redis();
        let meta = self.god.cache.meta(ACTIVITY).await.expect("in-process");
        let epoch = self.god.cache.epoch().await.expect("in-process");
        match &meta {
            Some(m) if m.claim.is_none() && m.epoch.as_deref() == Some(&epoch) => {}
            other => return format!("activity not recovered: {other:?}"),
        }
        if let Some(b) = view.buckets.iter().find(|b| b.stock.is_none()) {
            return format!("bucket {} has no stock key", b.bucket);
        }
        let shut: Vec<String> = view
            .buckets
            .iter()
            .filter(|b| {
                b.gate
                    .as_ref()
                    .is_none_or(|g| g.state != seckill_core::domain::ActivityState::Open)
            })
            .map(|b| format!("{}: {:?}", b.bucket, b.gate))
            .collect();
        if !shut.is_empty() {
            return format!("gates not open: {}", shut.join(", "));
        }
        // An operator call overtaken between its registry write and its gates leaves gates on an
        // older intent; the reconciler writes the registry's to them.
        if let Some(reg) = self.god.ledger.registry(ACTIVITY).await.expect("in-process") {
            let behind: Vec<String> = view
                .buckets
                .iter()
                .filter_map(|b| b.gate.as_ref().map(|g| (b.bucket, g.version)))
                .filter(|(_, v)| *v < reg.intent.version)
                .map(|(b, v)| format!("{b}: version {v}"))
                .collect();
            if !behind.is_empty() {
                return format!(
                    "gates behind the registry's intent (version {}): {}",
                    reg.intent.version,
                    behind.join(", ")
                );
            }
        }
        let open: usize = view.buckets.iter().map(|b| b.open.len() + b.pending.len()).sum();
        if open > 0 {
            return format!("{open} reservations or pending marks open");
        }
        let moving: usize = view.buckets.iter().map(|b| b.transfers_in_flight.len()).sum();
        if moving > 0 {
            return format!("{moving} transfers in flight");
        }
        let released: std::collections::BTreeSet<_> = view
            .buckets
            .iter()
            .flat_map(|b| b.cancelled_released.iter().copied())
            .collect();
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let unreleased = db
            .orders
            .iter()
            .filter(|o| o.status == seckill_core::ports::OrderStatus::Cancelled)
            .filter(|o| !released.contains(&o.reservation.id))
            .count();
        if unreleased > 0 {
            return format!("{unreleased} cancelled units not back");
        }
        // Every order ends paid or cancelled by the payment timeout.
        let unpaid = db
            .orders
            .iter()
            .filter(|o| o.status == seckill_core::ports::OrderStatus::Created)
            .count();
        if unpaid > 0 {
            return format!("{unpaid} orders awaiting payment or their timeout");
        }
        String::new()
    }
}
