//! Property test: random interleavings of reserve / publish / failed publish / consume /
//! consumer crash mid-batch / restart / duplicate delivery / a lost buyer mark, over the
//! embedded backend. S1–S3 hold after every step; at quiescence R1 holds, every queued
//! reservation resolved, and nothing is left open.

use proptest::prelude::*;
use seckill_core::adapters::embedded::{
    EmbeddedBackend, EmbeddedBus, EmbeddedConsumer, EmbeddedLedger, EmbeddedStockCache,
};
use seckill_core::adapters::script::buyers_key;
use seckill_core::domain::{Reservation, ReservationId, StockPlan, UserId};
use seckill_core::ports::{Ledger, OrderBus, OrderSource, ReleaseKind, ReserveOutcome, StockCache};
use seckill_core::service::{audit, OrderConsumer};
use seckill_invariants as inv;
use seckill_testkit::activity;
use std::time::Duration;

const USERS: u64 = 8;

#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Publish(usize),
    FailPublish(usize),
    Republish(usize),
    Consume,
    CrashMidBatch(usize),
    Restart,
    ForgetMark(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..USERS).prop_map(Op::Reserve),
        3 => any::<usize>().prop_map(Op::Publish),
        1 => any::<usize>().prop_map(Op::FailPublish),
        1 => any::<usize>().prop_map(Op::Republish),
        3 => Just(Op::Consume),
        1 => (1..4usize).prop_map(Op::CrashMidBatch),
        1 => Just(Op::Restart),
        1 => (0..USERS).prop_map(Op::ForgetMark),
    ]
}

type Consumer = OrderConsumer<EmbeddedLedger, EmbeddedStockCache, EmbeddedConsumer>;

struct World {
    b: EmbeddedBackend,
    plan: StockPlan,
    consumer: Option<Consumer>,
    unpublished: Vec<Reservation>,
    published: Vec<Reservation>,
    next_id: u128,
}

impl World {
    async fn consumer(&mut self) -> &mut Consumer {
        if self.consumer.is_none() {
            let source = self.b.bus.subscribe("prop").await.unwrap();
            self.consumer = Some(OrderConsumer::new(
                self.b.ledger.clone(),
                self.b.cache.clone(),
                source,
                3,
            ));
        }
        self.consumer.as_mut().unwrap()
    }

    async fn step(&mut self, op: &Op) {
        match *op {
            Op::Reserve(u) => {
                self.next_id += 1;
                let id = ReservationId(self.next_id);
                if let ReserveOutcome::Reserved(r) = self
                    .b
                    .cache
                    .reserve(&self.plan, UserId(u), 1, id, 0)
                    .await
                    .unwrap()
                {
                    self.unpublished.push(r);
                }
            }
            Op::Publish(i) if !self.unpublished.is_empty() => {
                let r = self.unpublished.remove(i % self.unpublished.len());
                self.b.bus.publish(&r).await.unwrap();
                self.published.push(r);
            }
            Op::FailPublish(i) if !self.unpublished.is_empty() => {
                let r = self.unpublished.remove(i % self.unpublished.len());
                self.b.cache.release(&r, ReleaseKind::Unpublished).await.unwrap();
            }
            Op::Republish(i) if !self.published.is_empty() => {
                let r = self.published[i % self.published.len()].clone();
                self.b.bus.publish(&r).await.unwrap();
            }
            Op::Consume => {
                self.consumer().await.run_once().await.unwrap();
            }
            Op::CrashMidBatch(max) => {
                let ledger = self.b.ledger.clone();
                let source = self.consumer().await.source_mut();
                let batch = source.poll(max).await.unwrap();
                let events: Vec<_> = batch
                    .iter()
                    .filter_map(|d| Reservation::decode(&d.payload).ok())
                    .collect();
                ledger.apply(&events).await.unwrap();
                self.consumer = None; // dies before follow-ups and commit
            }
            Op::Restart => self.consumer = None,
            Op::ForgetMark(u) => {
                let key = buyers_key(self.plan.activity, self.plan.route(UserId(u)));
                self.b.cache.conn().command(&[
                    b"SREM".to_vec(),
                    key.into_bytes(),
                    u.to_string().into_bytes(),
                ]);
            }
            _ => {}
        }
    }

    async fn snapshot(&self) -> inv::Snapshot {
        audit::snapshot(&self.b.cache, &self.b.ledger, &self.plan)
            .await
            .unwrap()
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let act = activity(1, 5, 2, 20); // buckets of 2 and 2, fallback 1
    let plan = StockPlan::new(&act);
    let b = EmbeddedBackend {
        bus: EmbeddedBus::with_poll_wait(2, 1_000, Duration::ZERO),
        ..EmbeddedBackend::new()
    };
    b.ledger.install(&act, &plan).await.unwrap();
    b.cache
        .warmup(
            &plan,
            &seckill_core::ports::Intent::FIRST,
            seckill_core::ports::WarmFrom::Plan,
        )
        .await
        .unwrap();
    let mut w = World {
        b,
        plan,
        consumer: None,
        unpublished: vec![],
        published: vec![],
        next_id: 0,
    };
    for (i, op) in ops.iter().enumerate() {
        w.step(op).await;
        let v = inv::check_safety(&w.snapshot().await);
        prop_assert!(v.is_empty(), "after step {i} {op:?}: {v:?}");
    }
    // Quiescence: publish what is left, drain everything.
    while let Some(r) = w.unpublished.pop() {
        w.b.bus.publish(&r).await.unwrap();
        w.published.push(r);
    }
    for _ in 0..1_000 {
        if w.b.bus.backlog() == 0 {
            break;
        }
        w.consumer().await.run_once().await.unwrap();
    }
    prop_assert_eq!(w.b.bus.backlog(), 0);
    let snap = w.snapshot().await;
    let queued: Vec<String> = w.published.iter().map(|r| r.id.to_string()).collect();
    let mut v = audit::check(&snap, true);
    v.extend(inv::l1_queued_resolved(&snap, &queued));
    prop_assert!(v.is_empty(), "at quiescence: {v:?}");
    prop_assert!(
        snap.buckets.iter().all(|b| b.open.is_empty()),
        "open reservations left: {:?}",
        snap.buckets
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn interleavings_never_violate_safety(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
