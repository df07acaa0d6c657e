//! One conformance suite per port. Each takes a constructor and checks the contract every
//! implementation must keep; the embedded backend runs them in `cargo test`, the real adapters
//! run them against live services, the simulation against its nodes. If both pass, what the
//! simulation proves about the engine holds in production.
//!
//! The suites panic with a message naming the case (they are test code that lives in the
//! library so other crates can call it). Every case uses its own activity id, counted up from
//! `first_activity`, so a suite can run against a store shared with earlier runs.

use seckill_core::domain::ActivityState;
use seckill_core::domain::{
    Activity, ActivityId, ActivitySpec, BucketNo, Reservation, ReservationId, StockPlan, UserId,
};
use seckill_core::ports::{
    ApplyOutcome, BucketImage, CancelOutcome, Claim, GateWrite, GaveUp, Intent, JournalKind, Ledger,
    OrderBus, OrderSource, OrderStatus, PayOutcome, Rebuilt, ReconcileView, ReleaseKind, ReserveOutcome,
    StockCache, Transfer, WarmFrom,
};
use std::future::Future;

/// An activity of `stock` units in `buckets` buckets with `fallback_pct`% fallback.
pub fn activity(id: u64, stock: u64, buckets: u32, fallback_pct: u8) -> Activity {
    Activity::new(ActivitySpec {
        id: ActivityId(id),
        total_stock: stock,
        buckets,
        fallback_pct,
        per_user_limit: 1,
        start_ms: 0,
        end_ms: u64::MAX,
        pay_timeout_ms: 60_000,
        unit_price_minor: 1_999,
    })
    .expect("conformance activities are valid")
}

/// The first `n` user ids (from 1) that route to bucket `b` of `plan`.
pub fn users_in(plan: &StockPlan, b: BucketNo, n: usize) -> Vec<UserId> {
    (1..)
        .map(UserId)
        .filter(|u| plan.route(*u) == b)
        .take(n)
        .collect()
}

fn rid(n: u128) -> ReservationId {
    ReservationId(0x5eed_0000_0000_0000_0000_0000_0000_0000 | n)
}

async fn reserve<C: StockCache>(c: &C, plan: &StockPlan, u: UserId, n: u128) -> ReserveOutcome {
    c.reserve(plan, u, 1, rid(n), 1_000 + n as u64)
        .await
        .expect("reserve")
}

/// An operator's intent at `version`, generation `generation`.
pub fn intent(state: ActivityState, version: u64, generation: u64) -> Intent {
    Intent {
        state,
        version,
        generation,
    }
}

/// What a new activity's gates start at (the registry's first row).
const OPEN: Intent = Intent::FIRST;

fn reserved(o: ReserveOutcome, case: &str) -> Reservation {
    match o {
        ReserveOutcome::Reserved(r) => r,
        other => panic!("{case}: expected Reserved, got {other:?}"),
    }
}

async fn stock_of<C: StockCache>(c: &C, plan: &StockPlan, b: BucketNo) -> Option<i64> {
    c.snapshot(plan).await.expect("snapshot").buckets[b.0 as usize].stock
}

pub async fn stock_cache_conformance<C, F, Fut>(mut make: F, first_activity: u64)
where
    C: StockCache,
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
{
    let mut next_activity = first_activity;
    let mut fresh = |stock, buckets, pct| {
        next_activity += 1;
        StockPlan::new(&activity(next_activity - 1, stock, buckets, pct))
    };

    // warmup: creates every bucket and the meta once; a second warmup changes nothing.
    {
        let c = make().await;
        let plan = fresh(10, 2, 20);
        assert_eq!(
            c.meta(plan.activity).await.unwrap(),
            None,
            "warmup: no meta before warmup"
        );
        let u = users_in(&plan, BucketNo(0), 1)[0];
        assert_eq!(
            reserve(&c, &plan, u, 1).await,
            ReserveOutcome::NotWarmed,
            "reserve before warmup"
        );
        // an installed activity's warmup never writes a stock key from the plan, even where
        // Redis holds nothing of it (it may have lost everything after selling)
        let installed = c.warmup(&plan, &OPEN, WarmFrom::Installed).await.unwrap();
        assert_eq!(
            (installed.created, installed.existing, installed.lost),
            (0, 0, 3),
            "warmup of an installed activity on an empty Redis"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, None, "nothing written");
        assert!(c.meta(plan.activity).await.unwrap().is_none(), "no meta written");
        let first = c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        assert_eq!(
            (first.created, first.existing),
            (3, 0),
            "warmup: creates all buckets"
        );
        reserved(reserve(&c, &plan, u, 2).await, "warmup");
        let again = c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        assert_eq!((again.created, again.existing), (0, 3), "warmup: idempotent");
        assert_eq!(
            stock_of(&c, &plan, BucketNo(0)).await,
            Some(3),
            "warmup: must not refill"
        );
        let meta = c.meta(plan.activity).await.unwrap().expect("meta after warmup");
        assert_eq!((meta.version.as_str(), meta.buckets), (plan.version.as_str(), 2));
        assert_eq!(meta.claim, None);
        assert!(
            c.snapshot(&plan).await.unwrap().buckets.iter().all(|b| b.gate
                == Some(seckill_core::ports::Gate {
                    state: ActivityState::Open,
                    intent: ActivityState::Open,
                    version: 1,
                    generation: 0,
                    fence: None
                })),
            "warmup: every gate at the registry's intent"
        );
        let mut other = plan.clone();
        other.version = "0000000000000000".into();
        assert!(
            c.warmup(&other, &OPEN, WarmFrom::Plan).await.is_err(),
            "warmup: a different plan version is refused"
        );
    }

    // reserve on the own bucket: one unit per user, down to empty, never below zero.
    {
        let c = make().await;
        let plan = fresh(4, 2, 0); // 2 + 2 units, no fallback
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(1), 3);
        let r = reserved(reserve(&c, &plan, users[0], 1).await, "own");
        assert_eq!(
            (r.bucket, r.user, r.qty, r.id),
            (BucketNo(1), users[0], 1, rid(1))
        );
        assert_eq!(
            reserve(&c, &plan, users[0], 2).await,
            ReserveOutcome::Duplicate,
            "same user twice"
        );
        assert_eq!(
            reserve(&c, &plan, users[0], 1).await,
            ReserveOutcome::Reserved(r.clone()),
            "a re-sent reserve (the same attempt) answers what it did and takes nothing more"
        );
        reserved(reserve(&c, &plan, users[1], 3).await, "second user");
        assert_eq!(
            reserve(&c, &plan, users[2], 4).await,
            ReserveOutcome::Empty,
            "bucket empty"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(1)).await, Some(0));
        assert_eq!(
            stock_of(&c, &plan, BucketNo(0)).await,
            Some(2),
            "other bucket untouched"
        );
        assert!(c.holds(&plan, users[0]).await.unwrap());
        assert!(
            !c.holds(&plan, users[2]).await.unwrap(),
            "an empty answer leaves no mark"
        );
        let view = c.snapshot(&plan).await.unwrap();
        let b1 = &view.buckets[1];
        assert_eq!(b1.open.len(), 2, "two open reservations");
        assert_eq!(b1.buyers, {
            let mut v = vec![users[0], users[1]];
            v.sort();
            v
        });
        assert!(b1.open.contains(&r), "the open entry round-trips: {:?}", b1.open);
        assert_eq!(
            c.open_reservation(&plan, BucketNo(1), r.id)
                .await
                .unwrap()
                .as_ref(),
            Some(&r),
            "one open entry, read alone"
        );
        assert_eq!(
            c.open_reservation(&plan, BucketNo(0), r.id).await.unwrap(),
            None,
            "not open in another bucket"
        );
        assert_eq!(
            c.open_reservation(&plan, BucketNo(1), ReservationId(r.id.0 ^ 1))
                .await
                .unwrap(),
            None,
            "no such reservation"
        );
        // The summary is the snapshot without the buyer sets.
        let mut without_buyers = view.clone();
        without_buyers.buckets.iter_mut().for_each(|b| b.buyers.clear());
        assert_eq!(c.summary(&plan).await.unwrap(), without_buyers);
        assert!(
            c.reserve(&plan, users[2], 0, rid(9), 0).await.is_err(),
            "qty 0 is refused"
        );
    }

    // fallback: an empty own bucket falls back; the pending mark protocol leaves no stale marks.
    {
        let c = make().await;
        let plan = fresh(10, 1, 20); // bucket 0: 8 units, fallback (bucket 1): 2
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(0), 12);
        for (i, u) in users[..8].iter().enumerate() {
            reserved(reserve(&c, &plan, *u, i as u128).await, "fill own");
        }
        let f1 = reserved(reserve(&c, &plan, users[8], 8).await, "fallback 1");
        assert_eq!(f1.bucket, BucketNo(1), "taken from the fallback bucket");
        assert_eq!(
            reserve(&c, &plan, users[8], 20).await,
            ReserveOutcome::Duplicate,
            "fallback winner is marked"
        );
        assert_eq!(
            reserve(&c, &plan, users[8], 8).await,
            ReserveOutcome::Reserved(f1.clone()),
            "the fallback attempt re-sent: the own bucket's pending mark is its own, the fallback's unit too"
        );
        // The own bucket's pending mark stays until the caller knows the publish's outcome.
        let pending = &c.snapshot(&plan).await.unwrap().buckets[0].pending;
        assert_eq!(
            pending.len(),
            1,
            "a fallback win keeps its pending mark: {pending:?}"
        );
        assert_eq!((pending[0].user, pending[0].reservation), (users[8], f1.id));
        c.resolve_pending(&plan, users[8], f1.id, true).await.unwrap();
        assert!(
            c.holds(&plan, users[8]).await.unwrap(),
            "kept: the user holds a unit"
        );
        let f2 = reserved(reserve(&c, &plan, users[9], 9).await, "fallback 2");
        // A publish that certainly failed: the unit goes back, then the mark is cleared.
        assert!(c
            .release(&f2, ReleaseKind::Unpublished)
            .await
            .unwrap()
            .is_released());
        c.resolve_pending(&plan, users[9], f2.id, false).await.unwrap();
        assert!(
            !c.holds(&plan, users[9]).await.unwrap(),
            "no lockout after an unpublished fallback win"
        );
        reserved(
            reserve(&c, &plan, users[9], 19).await,
            "the user retries and wins",
        );
        // A late resolve of the first attempt (its process stalled) leaves the new mark alone.
        c.resolve_pending(&plan, users[9], f2.id, false).await.unwrap();
        assert!(
            c.holds(&plan, users[9]).await.unwrap(),
            "a late clear of an old attempt"
        );
        c.resolve_pending(&plan, users[9], rid(19), true).await.unwrap();
        assert_eq!(
            reserve(&c, &plan, users[10], 10).await,
            ReserveOutcome::Empty,
            "both empty"
        );
        assert!(
            !c.holds(&plan, users[10]).await.unwrap(),
            "pending mark cleared after empty fallback"
        );
        // The reconciler gives up old pending marks: a fallback winner's is kept; an attempt
        // with no unit is voided, and its fallback reserve arriving late takes nothing.
        assert_eq!(
            c.give_up_pending(&plan, users[8], f1.id).await.unwrap(),
            GaveUp::InFlight,
            "its unit is open: left to its purchase"
        );
        assert_eq!(
            c.give_up_pending(&plan, users[8], rid(30)).await.unwrap(),
            GaveUp::Kept,
            "the user holds a fallback unit"
        );
        assert!(c.holds(&plan, users[8]).await.unwrap(), "still marked");
        assert_eq!(
            c.give_up_pending(&plan, users[11], rid(11)).await.unwrap(),
            GaveUp::Cleared,
            "voided"
        );
        let late = c.reserve(&plan, users[11], 1, rid(11), 1_011).await;
        assert!(
            matches!(&late, Err(e) if e.to_string().contains("gave it up")),
            "a voided attempt's late reserve is refused: {late:?}"
        );
        assert_eq!(
            c.give_up_pending(&plan, users[11], rid(11)).await.unwrap(),
            GaveUp::Cleared,
            "voided again"
        );
        assert!(!c.holds(&plan, users[11]).await.unwrap(), "and its mark cleared");
        let view = c.snapshot(&plan).await.unwrap();
        assert!(
            view.buckets.iter().all(|b| b.pending.is_empty()),
            "no pending marks left: {view:?}"
        );
        assert_eq!(view.buckets[1].stock, Some(0));
        assert_eq!(view.buckets[1].open.len(), 2);
        // release of a fallback unit goes back to the fallback, never to route(user)
        assert!(c.release(&f1, ReleaseKind::Rejected).await.unwrap().is_released());
        assert_eq!(stock_of(&c, &plan, BucketNo(1)).await, Some(1));
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(0));
    }

    // gates: only an open gate sells; newer intents win; releases and settles ignore the gate.
    {
        let c = make().await;
        let plan = fresh(6, 1, 0);
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(0), 3);
        let a = reserved(reserve(&c, &plan, users[0], 1).await, "open gate");
        assert_eq!(a.generation, 0, "stamped with the gate's generation");
        let paused = intent(ActivityState::Paused, 2, 0);
        assert_eq!(
            c.set_gates(&plan, &paused).await.unwrap(),
            vec![GateWrite::Applied; 2]
        );
        assert_eq!(
            reserve(&c, &plan, users[1], 2).await,
            ReserveOutcome::Gated(ActivityState::Paused),
            "a paused gate refuses"
        );
        assert_eq!(
            c.set_gates(&plan, &OPEN).await.unwrap(),
            vec![GateWrite::Stale; 2],
            "an older intent never overrides a newer one"
        );
        assert!(
            c.release(&a, ReleaseKind::Unpublished)
                .await
                .unwrap()
                .is_released(),
            "a release ignores the gate"
        );
        let closed = intent(ActivityState::Closed, 3, 0);
        assert_eq!(
            c.set_gates(&plan, &closed).await.unwrap(),
            vec![GateWrite::Applied; 2]
        );
        c.warmup(&plan, &intent(ActivityState::Open, 9, 0), WarmFrom::Plan)
            .await
            .unwrap();
        assert_eq!(
            reserve(&c, &plan, users[1], 3).await,
            ReserveOutcome::Gated(ActivityState::Closed),
            "warmup never rewrites an existing gate"
        );
        c.set_gates(&plan, &intent(ActivityState::Open, 4, 0))
            .await
            .unwrap();
        reserved(reserve(&c, &plan, users[1], 4).await, "resumed");
    }

    // recovery: claim with a fence on Redis's clock, gates closed with it, fenced rebuild and
    // reopen, finish; an intent written meanwhile is recorded and applied by the reopen.
    {
        let c = make().await;
        let plan = fresh(6, 1, 0);
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let epoch = c.epoch().await.unwrap();
        assert_eq!(
            c.epoch().await.unwrap(),
            epoch,
            "the run id is stable while Redis runs"
        );
        let meta = c.meta(plan.activity).await.unwrap().unwrap();
        assert_eq!(
            meta.epoch.as_deref(),
            Some(epoch.as_str()),
            "warmup records the epoch"
        );
        let users = users_in(&plan, BucketNo(0), 3);
        let a = reserved(reserve(&c, &plan, users[0], 1).await, "before the recovery");

        assert_eq!(
            c.claim(&plan, "f1", 60_000).await.unwrap(),
            Claim::Claimed { previous: None }
        );
        match c.claim(&plan, "f2", 60_000).await.unwrap() {
            Claim::Busy { fence, ms_left } => {
                assert_eq!(fence, "f1");
                assert!(ms_left > 0 && ms_left <= 60_000, "{ms_left}");
            }
            other => panic!("a live claim is left alone: {other:?}"),
        }
        assert_eq!(
            c.meta(plan.activity).await.unwrap().unwrap().claim.as_deref(),
            Some("f1")
        );
        assert!(c.close_gates(&plan, "f1", 0).await.unwrap());
        assert_eq!(
            reserve(&c, &plan, users[1], 2).await,
            ReserveOutcome::Gated(ActivityState::Recovering),
            "a recovering gate refuses"
        );
        let t = Transfer {
            id: "t-r".into(),
            from: BucketNo(0),
            to: BucketNo(1),
            units: 1,
            generation: 0,
        };
        assert!(
            !c.take(&plan, &t).await.unwrap(),
            "no transfer out of a recovering bucket"
        );
        let paused = intent(ActivityState::Paused, 2, 0);
        assert_eq!(
            c.set_gates(&plan, &paused).await.unwrap(),
            vec![GateWrite::Recorded; 2],
            "a pause during the recovery is recorded in the gates"
        );
        let image = BucketImage {
            stock: 2,
            buyers: vec![users[1]],
            held: vec![a.id],
            cancelled_released: vec![(a.id, 1)],
            ..Default::default()
        };
        assert_eq!(
            c.rebuild(&plan, BucketNo(0), "f2", &image).await.unwrap(),
            Rebuilt::Fenced
        );
        let without = BucketImage {
            held: vec![],
            ..image.clone()
        };
        assert_eq!(
            c.rebuild(&plan, BucketNo(0), "f1", &without).await.unwrap(),
            Rebuilt::Open(a.id),
            "an open reservation the ledger lacks is never deleted"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(5), "nothing written");
        assert_eq!(
            c.rebuild(&plan, BucketNo(0), "f1", &image).await.unwrap(),
            Rebuilt::Done
        );
        let b0 = &c.snapshot(&plan).await.unwrap().buckets[0];
        assert_eq!(
            (b0.stock, b0.buyers.clone(), b0.open.len()),
            (Some(2), vec![users[1]], 0),
            "rebuilt"
        );
        assert_eq!(b0.cancelled_released, vec![a.id]);
        assert!(
            !c.release(&a, ReleaseKind::Cancelled).await.unwrap().is_released(),
            "idempotent across a rebuild"
        );
        let back = intent(ActivityState::Open, 1, 5);
        assert!(
            !c.reopen(&plan, BucketNo(0), "f2", &back).await.unwrap(),
            "fenced reopen"
        );
        for b in plan.all_buckets() {
            assert!(c.reopen(&plan, b, "f1", &back).await.unwrap());
        }
        assert!(
            c.reopen(&plan, BucketNo(0), "f1", &back).await.unwrap(),
            "a re-sent reopen answers what its first run did"
        );
        assert!(
            !c.reopen(&plan, BucketNo(0), "f1", &intent(ActivityState::Open, 1, 4))
                .await
                .unwrap(),
            "a reopen at another generation than the gate's is fenced"
        );
        let gate = c.snapshot(&plan).await.unwrap().buckets[0].gate.clone().unwrap();
        assert_eq!(
            (gate.state, gate.version, gate.generation, gate.fence),
            (ActivityState::Paused, 2, 5, None),
            "the newer intent (the pause) stands, with the new generation"
        );
        assert!(!c.renew(&plan, "f2", 1_000).await.unwrap());
        assert!(
            !c.finish(&plan, "f2", "e2").await.unwrap(),
            "only the claim's holder finishes"
        );
        assert!(c.finish(&plan, "f1", "e2").await.unwrap());
        assert!(
            c.finish(&plan, "f1", "e2").await.unwrap(),
            "a re-sent finish answers what its first run did"
        );
        assert!(
            !c.finish(&plan, "f2", "e2").await.unwrap(),
            "a claim taken over is lost, even once its successor finished under the same epoch"
        );
        assert!(
            !c.finish(&plan, "f1", "e3").await.unwrap(),
            "nothing to finish under another epoch"
        );
        let meta = c.meta(plan.activity).await.unwrap().unwrap();
        assert_eq!((meta.claim, meta.epoch.as_deref()), (None, Some("e2")));
        c.set_gates(&plan, &intent(ActivityState::Open, 3, 5))
            .await
            .unwrap();
        let r = reserved(reserve(&c, &plan, users[2], 3).await, "reopened");
        assert_eq!(r.generation, 5, "reservations carry the new generation");
        assert_eq!(
            reserve(&c, &plan, users[1], 4).await,
            ReserveOutcome::Duplicate,
            "marks rebuilt"
        );
        // An expired claim is taken over (the deadline is Redis's TIME).
        assert_eq!(
            c.claim(&plan, "f3", 1).await.unwrap(),
            Claim::Claimed { previous: None }
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(
            c.claim(&plan, "f4", 60_000).await.unwrap(),
            Claim::Claimed {
                previous: Some("f3".into())
            },
            "an expired claim is taken over"
        );
        assert!(
            !c.renew(&plan, "f3", 1_000).await.unwrap(),
            "the old holder has lost it"
        );
    }

    // adopt: the reconciler takes an open reservation over; an unpublished release then refuses it.
    {
        let c = make().await;
        let plan = fresh(6, 1, 0);
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(0), 1);
        let e = reserved(reserve(&c, &plan, users[0], 4).await, "e");
        assert!(c.adopt(&e).await.unwrap(), "adopt an open reservation");
        assert!(c.adopt(&e).await.unwrap(), "adopt is idempotent");
        assert!(
            c.release(&e, ReleaseKind::Unpublished).await.unwrap() == seckill_core::ports::Released::Adopted,
            "an adopted reservation is not the purchase's to give back"
        );
        assert!(
            c.snapshot(&plan).await.unwrap().buckets[0].open.contains(&e),
            "still open, as it was"
        );
        assert!(c.settle(&e).await.unwrap());
        assert!(!c.adopt(&e).await.unwrap(), "a settled reservation is not open");
    }

    // transfers: take / give / ack, each idempotent; a take never overdraws.
    {
        let c = make().await;
        let plan = fresh(10, 2, 0); // 5 + 5
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let t = Transfer {
            id: "t-1".into(),
            from: BucketNo(0),
            to: BucketNo(1),
            units: 3,
            generation: 0,
        };
        assert!(c.take(&plan, &t).await.unwrap());
        assert!(c.take(&plan, &t).await.unwrap(), "take is idempotent");
        let too_much = Transfer {
            id: "t-2".into(),
            units: 3,
            ..t.clone()
        };
        assert!(!c.take(&plan, &too_much).await.unwrap(), "only 2 left: short");
        let view = c.snapshot(&plan).await.unwrap();
        assert_eq!(
            (view.buckets[0].stock, view.buckets[0].transfers_out),
            (Some(2), 3)
        );
        assert_eq!(
            view.buckets[0].transfers_in_flight,
            vec![t.clone()],
            "taken, not acknowledged"
        );
        c.give(&plan, &t).await.unwrap();
        c.give(&plan, &t).await.unwrap();
        c.ack(&plan, &t).await.unwrap();
        let view = c.snapshot(&plan).await.unwrap();
        assert_eq!(
            (view.buckets[1].stock, view.buckets[1].transfers_in),
            (Some(8), 3),
            "given once"
        );
        assert!(view.buckets[0].transfers_in_flight.is_empty(), "acknowledged");
    }

    // a take is refused under another generation than the gate's, and its mark keeps its own
    {
        let c = make().await;
        let plan = fresh(10, 2, 0);
        c.warmup(&plan, &intent(ActivityState::Open, 1, 3), WarmFrom::Plan)
            .await
            .unwrap();
        let t = Transfer {
            id: "t-g".into(),
            from: BucketNo(0),
            to: BucketNo(1),
            units: 2,
            generation: 2,
        };
        assert!(
            !c.take(&plan, &t).await.unwrap(),
            "planned before a recovery: refused"
        );
        let t = Transfer { generation: 3, ..t };
        assert!(c.take(&plan, &t).await.unwrap());
        let view = c.snapshot(&plan).await.unwrap();
        assert_eq!(
            view.buckets[0].transfers_in_flight,
            vec![t],
            "the generation reads back"
        );
        // a runner that read generation 2 before its claim finds gates of 3 (a recovery it did
        // not see reopened them): its close is refused and leaves every gate open
        assert!(!c.close_gates(&plan, "f2", 2).await.unwrap(), "a stale close");
        let view = c.snapshot(&plan).await.unwrap();
        assert!(
            view.buckets
                .iter()
                .all(|b| b.gate.as_ref().map(|g| g.state) == Some(ActivityState::Open)),
            "no gate closed: {view:?}"
        );
        assert!(c.close_gates(&plan, "f3", 3).await.unwrap(), "a current close");
    }

    // a failed order frees its user (DESIGN §6): its entry closes with no units back, its mark
    // goes in its own bucket and in the bucket its unit came from — once per reservation, and
    // only a mark left under its generation.
    {
        let c = make().await;
        let plan = fresh(10, 1, 20); // bucket 0: 8 units, fallback (bucket 1): 2
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(0), 9);
        let mut own = Vec::new();
        for (i, u) in users[..8].iter().enumerate() {
            own.push(reserved(
                reserve(&c, &plan, *u, 100 + i as u128).await,
                "fill own",
            ));
        }
        let f = reserved(reserve(&c, &plan, users[8], 108).await, "fallback");
        assert_eq!(f.bucket, BucketNo(1));
        assert!(c.free_failed(&plan, &own[0]).await.unwrap(), "freed");
        assert!(!c.holds(&plan, users[0]).await.unwrap(), "the mark is gone");
        let view = c.snapshot(&plan).await.unwrap();
        assert!(!view.buckets[0].open.contains(&own[0]), "the entry is closed");
        assert_eq!(view.buckets[0].stock, Some(0), "no units back");
        assert!(!c.free_failed(&plan, &own[0]).await.unwrap(), "once");
        let again = reserved(
            reserve(&c, &plan, users[0], 120).await,
            "the freed user buys again",
        );
        assert!(
            !c.free_failed(&plan, &own[0]).await.unwrap() && c.holds(&plan, users[0]).await.unwrap(),
            "a late free leaves the new reservation's mark"
        );
        assert_eq!(again.bucket, BucketNo(1));
        let newer = Reservation {
            generation: own[1].generation + 1,
            ..own[1].clone()
        };
        assert!(!c.free_failed(&plan, &newer).await.unwrap());
        assert!(
            c.holds(&plan, users[1]).await.unwrap(),
            "a mark of another generation is not this reservation's"
        );
        assert!(
            c.free_failed(&plan, &f).await.unwrap(),
            "a fallback winner is freed"
        );
        let view = c.snapshot(&plan).await.unwrap();
        assert!(!c.holds(&plan, users[8]).await.unwrap(), "in its own bucket");
        assert!(!view.buckets[1].buyers.contains(&users[8]), "and in the fallback");
        assert_eq!(
            view.buckets[1].open,
            vec![again],
            "only the new reservation is open"
        );
        assert_eq!(view.buckets[1].stock, Some(0), "no units back");
    }

    // release and settle: each kind, each idempotent.
    {
        let c = make().await;
        let plan = fresh(6, 1, 0);
        c.warmup(&plan, &OPEN, WarmFrom::Plan).await.unwrap();
        let users = users_in(&plan, BucketNo(0), 3);
        let a = reserved(reserve(&c, &plan, users[0], 1).await, "a");
        let b = reserved(reserve(&c, &plan, users[1], 2).await, "b");
        let d = reserved(reserve(&c, &plan, users[2], 3).await, "d");
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(3));

        assert!(
            c.release(&a, ReleaseKind::Unpublished)
                .await
                .unwrap()
                .is_released(),
            "unpublished release"
        );
        assert!(
            !c.release(&a, ReleaseKind::Unpublished)
                .await
                .unwrap()
                .is_released(),
            "second release is a no-op"
        );
        assert!(
            !c.holds(&plan, users[0]).await.unwrap(),
            "unpublished clears the mark"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(4));

        assert!(
            c.release(&b, ReleaseKind::Rejected).await.unwrap().is_released(),
            "rejected release"
        );
        assert!(!c.release(&b, ReleaseKind::Rejected).await.unwrap().is_released());
        assert!(c.holds(&plan, users[1]).await.unwrap(), "rejected keeps the mark");
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(5));

        assert!(c.open_reservation(&plan, d.bucket, d.id).await.unwrap().is_some());
        assert!(c.settle(&d).await.unwrap(), "settle closes the reservation");
        assert!(!c.settle(&d).await.unwrap(), "settle is idempotent");
        assert_eq!(
            c.open_reservation(&plan, d.bucket, d.id).await.unwrap(),
            None,
            "a settled reservation is not open"
        );
        assert!(
            !c.release(&d, ReleaseKind::Rejected).await.unwrap().is_released(),
            "a settled order is not open"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(5));
        assert!(
            c.release(&d, ReleaseKind::Cancelled).await.unwrap().is_released(),
            "a cancelled order comes back"
        );
        assert!(
            !c.release(&d, ReleaseKind::Cancelled).await.unwrap().is_released(),
            "exactly once"
        );
        assert_eq!(stock_of(&c, &plan, BucketNo(0)).await, Some(6));
        let view = c.snapshot(&plan).await.unwrap();
        assert!(view.buckets[0].open.is_empty());
        assert_eq!(view.buckets[0].cancelled_released, vec![d.id]);
    }
}

/// Publishes `n` reservations of activity `a` spread over `buckets` buckets.
fn events(a: u64, n: u128, buckets: u32) -> Vec<Reservation> {
    (0..n)
        .map(|i| Reservation {
            id: rid(i),
            activity: ActivityId(a),
            user: UserId(i as u64 + 1),
            bucket: BucketNo((i % buckets as u128) as u32),
            qty: 1,
            reserved_at_ms: 0,
            generation: 0,
        })
        .collect()
}

/// Poll until `want` deliveries arrived or a poll comes back empty.
async fn drain<S: OrderSource>(s: &mut S, want: usize) -> Vec<seckill_core::ports::Delivery> {
    let mut got = Vec::new();
    while got.len() < want {
        let batch = s.poll(want - got.len()).await.expect("poll");
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    got
}

pub async fn order_bus_conformance<B, F, Fut>(mut make: F, first_activity: u64)
where
    B: OrderBus,
    F: FnMut() -> Fut,
    Fut: Future<Output = B>,
{
    let group = format!("conformance-{first_activity}");
    // delivery: everything published arrives, per-key order kept, uncommitted comes back.
    {
        let bus = make().await;
        let sent = events(first_activity, 40, 4);
        for e in &sent {
            bus.publish(e).await.expect("publish");
        }
        let mut s = bus.subscribe(&group).await.expect("subscribe");
        let got = drain(&mut s, sent.len()).await;
        assert_eq!(
            got.len(),
            sent.len(),
            "every record is delivered once per poll cycle"
        );
        assert!(
            bus.lag(&group).await.unwrap() >= sent.len() as u64,
            "uncommitted records are lag"
        );
        let decoded: Vec<Reservation> = got
            .iter()
            .map(|d| Reservation::decode(&d.payload).unwrap())
            .collect();
        for key in ["0", "1", "2", "3"] {
            let key = format!("{first_activity}.{key}");
            let want: Vec<_> = sent.iter().filter(|e| e.bus_key() == key).map(|e| e.id).collect();
            let have: Vec<_> = decoded
                .iter()
                .filter(|e| e.bus_key() == key)
                .map(|e| e.id)
                .collect();
            assert_eq!(have, want, "key {key}: order within a key is kept");
        }
        assert!(got
            .iter()
            .all(|d| d.key == Reservation::decode(&d.payload).unwrap().bus_key()));

        s.rewind().await.expect("rewind");
        let again = drain(&mut s, sent.len()).await;
        assert_eq!(
            again.len(),
            sent.len(),
            "after rewind, uncommitted records come again"
        );
        s.commit(&again[..10]).await.expect("commit part");
        drop(s);
        let mut s = bus.subscribe(&group).await.expect("resubscribe");
        let rest = drain(&mut s, sent.len()).await;
        // What was committed is not delivered again; per partition, commits cover a prefix.
        for d in &again[..10] {
            assert!(
                !rest
                    .iter()
                    .any(|r| r.partition == d.partition && r.offset == d.offset),
                "committed record {}@{} came back",
                d.partition,
                d.offset
            );
        }
        assert_eq!(
            rest.len(),
            sent.len() - 10,
            "the uncommitted rest comes back after a restart"
        );
        s.commit(&rest).await.expect("commit rest");
        drop(s);
        let mut s = bus.subscribe(&group).await.expect("resubscribe");
        assert!(
            drain(&mut s, 1).await.is_empty(),
            "nothing left after committing all"
        );
        assert_eq!(bus.lag(&group).await.unwrap(), 0, "drained");
    }

    // malformed bytes are delivered raw, can be dead-lettered, and do not block what follows.
    {
        let bus = make().await;
        bus.publish_raw(&format!("{}.0", first_activity + 1), b"{not json")
            .await
            .expect("publish raw");
        let good = events(first_activity + 1, 1, 1).remove(0);
        bus.publish(&good).await.expect("publish");
        let mut s = bus.subscribe(&format!("{group}-dlq")).await.expect("subscribe");
        let got = drain(&mut s, 2).await;
        assert_eq!(got.len(), 2);
        assert!(Reservation::decode(&got[0].payload).is_err());
        s.dead_letter(&got[0], "not JSON").await.expect("dead letter");
        assert_eq!(Reservation::decode(&got[1].payload).unwrap(), good);
        s.commit(&got).await.expect("commit");
    }
}

pub async fn ledger_conformance<L, F, Fut>(mut make: F, first_activity: u64)
where
    L: Ledger,
    F: FnMut() -> Fut,
    Fut: Future<Output = L>,
{
    let l = make().await;
    let act = activity(first_activity, 3, 1, 0); // one bucket of 3 units
    let plan = StockPlan::new(&act);
    assert!(l.install(&act, &plan).await.unwrap(), "install creates");
    assert!(!l.install(&act, &plan).await.unwrap(), "install is idempotent");
    let other = activity(first_activity, 4, 1, 0);
    assert!(
        l.install(&other, &StockPlan::new(&other)).await.is_err(),
        "the same id with another plan is refused"
    );
    let a = act.id();
    // Reservation ids are unique across a whole ledger, which may be a real database that outlives
    // this run: derive them from the (fresh) activity id.
    let rid = |n: u128| ReservationId(((a.0 as u128) << 64) | n);
    let ev = |n: u128, user: u64| Reservation {
        id: rid(n),
        activity: a,
        user: UserId(user),
        bucket: BucketNo(0),
        qty: 1,
        reserved_at_ms: 5,
        generation: 0,
    };

    // one batch: created, redelivered inside the batch, duplicate buyer, unknown bucket
    let mut stray = ev(9, 90);
    stray.bucket = BucketNo(7);
    let batch = vec![ev(1, 10), ev(1, 10), ev(2, 10), ev(3, 11), stray];
    let out = l.apply(&batch).await.unwrap();
    assert_eq!(
        out,
        vec![
            ApplyOutcome::Created,
            ApplyOutcome::Redelivered,
            ApplyOutcome::DuplicateBuyer { existing: rid(1) },
            ApplyOutcome::Created,
            ApplyOutcome::UnknownBucket,
        ]
    );
    // a redelivered batch changes nothing
    let again = l.apply(&batch[..1]).await.unwrap();
    assert_eq!(again, vec![ApplyOutcome::Redelivered]);
    // out of stock: one unit left, two new buyers
    let out = l.apply(&[ev(4, 12), ev(5, 13)]).await.unwrap();
    assert_eq!(out, vec![ApplyOutcome::Created, ApplyOutcome::OutOfStock]);
    assert_eq!(
        l.apply(&[ev(6, 13)]).await.unwrap(),
        vec![ApplyOutcome::OutOfStock],
        "a failed order frees its user (DESIGN §6): the next order is judged on its own"
    );
    assert_eq!(
        l.order_of(a, UserId(13)).await.unwrap().map(|o| o.reservation.id),
        Some(rid(6)),
        "with only failed orders, the latest"
    );

    let view = l.snapshot(a).await.unwrap();
    assert_eq!(
        view.buckets.len(),
        2,
        "stock_bucket rows: the bucket and the (empty) fallback"
    );
    // The reconciler's read agrees with the snapshot: created and failed orders here.
    let mentioned = [rid(4), rid(5), rid(999)].into_iter().collect();
    assert_eq!(
        l.reconcile_view(a, &mentioned).await.unwrap(),
        ReconcileView::of(&view.orders, &mentioned)
    );
    assert_eq!((view.buckets[0].initial, view.buckets[0].remaining), (3, 0));
    let status = |id| {
        view.orders
            .iter()
            .find(|o| o.reservation.id == rid(id))
            .map(|o| o.status)
    };
    assert_eq!(status(1), Some(OrderStatus::Created));
    assert_eq!(status(5), Some(OrderStatus::Failed));
    assert_eq!(status(6), Some(OrderStatus::Failed));
    assert_eq!(status(2), None);
    assert_eq!(view.orders.len(), 5);
    assert_eq!(view.journal.len(), 3, "a journal row per stock movement");
    assert!(view
        .journal
        .iter()
        .all(|j| j.kind == JournalKind::Order && j.delta == -1));
    assert_eq!(
        view.orders
            .iter()
            .find(|o| o.reservation.id == rid(1))
            .unwrap()
            .reservation,
        ev(1, 10)
    );

    // pay
    assert_eq!(l.pay(rid(1), "p-1").await.unwrap(), PayOutcome::Paid);
    assert_eq!(
        l.pay(rid(1), "p-1").await.unwrap(),
        PayOutcome::AlreadyPaid,
        "the same payment again"
    );
    assert_eq!(
        l.pay(rid(1), "p-2").await.unwrap(),
        PayOutcome::PaidWithOther("p-1".into()),
        "a second payment for a paid order is told apart"
    );
    assert_eq!(
        l.order(rid(1)).await.unwrap().map(|o| o.status),
        Some(OrderStatus::Paid)
    );
    assert_eq!(l.order(rid(77)).await.unwrap(), None);
    assert_eq!(
        l.pay(rid(5), "p-1").await.unwrap(),
        PayOutcome::NotPayable(OrderStatus::Failed)
    );
    assert_eq!(l.pay(rid(77), "p-1").await.unwrap(), PayOutcome::NotFound);
    let o = l
        .order_of(a, UserId(10))
        .await
        .unwrap()
        .expect("user 10 has an order");
    assert_eq!((o.reservation.id, o.status), (rid(1), OrderStatus::Paid));
    assert_eq!(l.order_of(a, UserId(99)).await.unwrap(), None);
    assert_eq!(
        l.snapshot(ActivityId(first_activity + 1000))
            .await
            .unwrap()
            .orders
            .len(),
        0
    );

    // payment timeout: created orders past the window are cancelled once, stock and journal back
    let act = activity(first_activity + 1, 2, 1, 0);
    let plan = StockPlan::new(&act);
    l.install(&act, &plan).await.unwrap();
    let mut unpaid = ev(20, 30);
    unpaid.activity = act.id();
    let mut paid = ev(21, 31);
    paid.activity = act.id();
    assert_eq!(
        l.apply(&[unpaid.clone(), paid.clone()]).await.unwrap(),
        vec![ApplyOutcome::Created; 2]
    );
    l.pay(paid.id, "p-1").await.unwrap();
    assert_eq!(
        l.cancel_unpaid(act.id(), 5 + 59_999).await.unwrap(),
        vec![],
        "not due yet"
    );
    assert_eq!(
        l.cancel_unpaid(act.id(), 5 + 60_000).await.unwrap(),
        vec![unpaid.clone()]
    );
    assert_eq!(
        l.cancel_unpaid(act.id(), 10_000_000).await.unwrap(),
        vec![],
        "once"
    );
    let view = l.snapshot(act.id()).await.unwrap();
    assert_eq!(
        view.buckets[0].remaining, 1,
        "the cancelled unit is back in the ledger"
    );
    // ... and with a cancelled and a paid order.
    let mentioned = [unpaid.id, paid.id].into_iter().collect();
    let rv = l.reconcile_view(act.id(), &mentioned).await.unwrap();
    assert_eq!(rv, ReconcileView::of(&view.orders, &mentioned));
    assert_eq!((rv.cancelled, rv.held.len()), (vec![unpaid.clone()], 2));
    assert!(view
        .journal
        .iter()
        .any(|j| j.kind == JournalKind::Cancel && j.delta == 1));
    assert_eq!(
        l.pay(unpaid.id, "p-1").await.unwrap(),
        PayOutcome::NotPayable(OrderStatus::Cancelled)
    );

    // transfers move ledger stock once, with a journal row on each side
    let act = activity(first_activity + 2, 10, 2, 0); // 5 + 5
    let plan = StockPlan::new(&act);
    l.install(&act, &plan).await.unwrap();
    let t = Transfer {
        id: "t-9".into(),
        from: BucketNo(0),
        to: BucketNo(1),
        units: 4,
        generation: 0,
    };
    assert!(l.transfer(act.id(), &t).await.unwrap());
    assert!(!l.transfer(act.id(), &t).await.unwrap(), "idempotent by id");
    let over = Transfer {
        id: "t-10".into(),
        units: 2,
        ..t.clone()
    };
    assert!(
        l.transfer(act.id(), &over).await.is_err(),
        "the source has 1 unit left"
    );
    let view = l.snapshot(act.id()).await.unwrap();
    assert_eq!((view.buckets[0].remaining, view.buckets[1].remaining), (1, 9));
    let rows: Vec<i64> = view
        .journal
        .iter()
        .filter(|j| j.kind == JournalKind::Transfer)
        .map(|j| j.delta)
        .collect();
    assert_eq!(rows, vec![-4, 4]);
    assert!(
        l.transfer(
            act.id(),
            &Transfer {
                id: "t-11".into(),
                to: BucketNo(0),
                ..t.clone()
            }
        )
        .await
        .is_err(),
        "a transfer needs two different buckets"
    );

    // the installed activity reads back; a buyer's cancel moves stock back once
    assert_eq!(l.activity(act.id()).await.unwrap(), Some(act.clone()));
    assert_eq!(l.activity(ActivityId(first_activity + 99)).await.unwrap(), None);
    let buyer = Reservation {
        id: rid(30),
        activity: act.id(),
        user: UserId(40),
        bucket: BucketNo(1),
        qty: 1,
        reserved_at_ms: 5,
        generation: 0,
    };
    assert_eq!(
        l.apply(std::slice::from_ref(&buyer)).await.unwrap(),
        vec![ApplyOutcome::Created]
    );
    assert_eq!(
        l.cancel(buyer.id).await.unwrap(),
        CancelOutcome::Cancelled(buyer.clone())
    );
    assert_eq!(l.cancel(buyer.id).await.unwrap(), CancelOutcome::AlreadyCancelled);
    assert_eq!(l.cancel(rid(31)).await.unwrap(), CancelOutcome::NotFound);
    assert_eq!(
        l.pay(buyer.id, "p-1").await.unwrap(),
        PayOutcome::NotPayable(OrderStatus::Cancelled)
    );
    let view = l.snapshot(act.id()).await.unwrap();
    assert_eq!(view.buckets[1].remaining, 9, "the cancelled unit is back");
    let mut payer = buyer.clone();
    (payer.id, payer.user) = (rid(32), UserId(41));
    l.apply(std::slice::from_ref(&payer)).await.unwrap();
    l.pay(payer.id, "p-1").await.unwrap();
    assert_eq!(
        l.cancel(payer.id).await.unwrap(),
        CancelOutcome::NotCancellable(OrderStatus::Paid)
    );

    // after a recovery's bump, a transfer taken under the old generation is refused (its take was
    // undone by the rebuild); one already recorded still answers "done"; a new one goes through
    // the bump is a compare-and-set: a runner that read generation 0 bumps it once; a second
    // runner (or the same one, late) that read 0 too finds 1 and is refused, changing nothing
    assert_eq!(
        l.bump_generation(act.id(), 0)
            .await
            .unwrap()
            .map(|i| i.generation),
        Some(1)
    );
    assert_eq!(
        l.bump_generation(act.id(), 0).await.unwrap(),
        None,
        "a late bump from 0"
    );
    assert_eq!(l.registry(act.id()).await.unwrap().unwrap().intent.generation, 1);
    let missing = l
        .bump_generation(ActivityId(act.id().0 + 1000), 0)
        .await
        .unwrap_err();
    assert!(!missing.is_indeterminate(), "{missing}");
    let stale = Transfer {
        id: "t-12".into(),
        units: 1,
        ..t.clone()
    };
    let refused = l.transfer(act.id(), &stale).await.unwrap_err();
    assert!(
        !refused.is_indeterminate() && refused.to_string().contains("generation"),
        "{refused}"
    );
    assert!(
        !l.transfer(act.id(), &t).await.unwrap(),
        "t-9 is done, whatever its generation"
    );
    assert!(l
        .transfer(
            act.id(),
            &Transfer {
                generation: 1,
                ..stale
            }
        )
        .await
        .unwrap());
    let view = l.snapshot(act.id()).await.unwrap();
    assert_eq!((view.buckets[0].remaining, view.buckets[1].remaining), (0, 9));

    // one live order per user (DESIGN §6): user 43's order of generation 0 is refused as stale
    // and frees the user, whose order of generation 1 then goes through — in the same batch; a
    // cancelled order keeps its user (user 40 stays a buyer)
    let mut stale_order = buyer.clone();
    (stale_order.id, stale_order.user) = (rid(33), UserId(43));
    let bought_again = Reservation {
        id: rid(34),
        generation: 1,
        ..stale_order.clone()
    };
    let cancelled_buyer_again = Reservation {
        id: rid(35),
        generation: 1,
        ..buyer.clone()
    };
    assert_eq!(
        l.apply(&[stale_order, bought_again, cancelled_buyer_again])
            .await
            .unwrap(),
        vec![
            ApplyOutcome::StaleGeneration,
            ApplyOutcome::Created,
            ApplyOutcome::DuplicateBuyer { existing: rid(30) },
        ]
    );
    let o = l
        .order_of(act.id(), UserId(43))
        .await
        .unwrap()
        .expect("user 43 bought");
    assert_eq!(
        (o.reservation.id, o.status),
        (rid(34), OrderStatus::Created),
        "the live order first"
    );
    let mentioned = [rid(33), rid(34)].into_iter().collect();
    let view = l.reconcile_view(act.id(), &mentioned).await.unwrap();
    assert_eq!(
        (view.held.len(), view.failed.into_iter().collect::<Vec<_>>()),
        (2, vec![rid(33)]),
        "the reconciler tells the failed apart"
    );
    assert_eq!(l.snapshot(act.id()).await.unwrap().buckets[1].remaining, 8);
}
