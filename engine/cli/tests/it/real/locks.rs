//! Ledger transactions are bounded on MariaDB, and the operator's pause does not wait for them
//! (DESIGN §11.3). A worker stalled inside a batch's transaction (paused by the OS, or behind a
//! partition where TCP retransmits for minutes) holds the shared lock every batch takes on the
//! activity's generation. Before the engine set `idle_transaction_timeout` per connection it held
//! that lock for `wait_timeout` (8 h); and while the generation lived in the activity row, the
//! operator's pause (an UPDATE of that row) queued behind it, and every other worker's batch
//! behind the pause (tried on 5435bff, where the generation was a column of `activity`: the pause
//! returned only after the server rolled the stalled transaction back, and the stalled
//! transaction's next statement failed). And transactions that race on the same bucket rows
//! neither deadlock on every attempt nor trip MariaDB's snapshot isolation; batches that meet on
//! the same reservations or users create one order per user.

use super::{mysql, unique_id};
use seckill_core::domain::{ActivityState, StockPlan};
use seckill_core::ports::Ledger;
use seckill_testkit::activity;
use std::time::Duration;

/// A connection of the ledger's own pool (its session settings) inside a batch's transaction,
/// holding the shared lock `apply` takes on the activity's generation — then silent.
async fn stalled_worker(
    ledger: &seckill_stores::mysql::MysqlLedger,
    a: &seckill_core::domain::Activity,
) -> sqlx::Transaction<'static, sqlx::MySql> {
    let mut stalled = ledger.pool().begin().await.unwrap();
    sqlx::query("SELECT generation FROM activity_generation WHERE activity_id = ? LOCK IN SHARE MODE")
        .bind(a.id().0)
        .fetch_one(&mut *stalled)
        .await
        .unwrap();
    stalled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_pause_does_not_wait_for_a_stalled_worker() {
    let Some(ledger) = mysql().await else { return };
    let a = activity(unique_id(), 10, 2, 0);
    ledger.install(&a, &StockPlan::new(&a)).await.unwrap();
    let mut stalled = stalled_worker(&ledger, &a).await;

    // The pause writes the activity row, which no batch locks. (The timeout is a liveness bound
    // far from both sides; the assertion that matters is the next one.)
    let paused = tokio::time::timeout(
        Duration::from_secs(40),
        ledger.set_intent(a.id(), ActivityState::Paused),
    )
    .await
    .expect("the operator's pause never returned")
    .unwrap()
    .expect("installed");
    assert_eq!(paused.state, ActivityState::Paused);
    // The stalled transaction is still there: the pause did not wait for the server to roll it
    // back (which it does after `idle_transaction_timeout`, seconds).
    sqlx::query("SELECT 1")
        .execute(&mut *stalled)
        .await
        .expect("the pause waited until the server rolled the stalled worker's transaction back");
    stalled.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalled_mid_transaction_does_not_hold_the_generation() {
    let Some(ledger) = mysql().await else { return };
    let a = activity(unique_id(), 10, 2, 0);
    ledger.install(&a, &StockPlan::new(&a)).await.unwrap();
    let stalled = stalled_worker(&ledger, &a).await;

    // A recovery's bump must wait for the batches in flight — for this one only until the
    // server rolls it back. (A liveness bound: seconds with the session settings, hours
    // without; a lock-wait timeout in between is retried by the adapter.)
    let bumped = tokio::time::timeout(Duration::from_secs(40), ledger.bump_generation(a.id(), 0))
        .await
        .expect("the bump waited on a stalled worker's transaction")
        .unwrap()
        .expect("the generation was 0");
    assert_eq!(bumped.generation, 1);
    assert_eq!(
        ledger.registry(a.id()).await.unwrap().unwrap().intent.generation,
        1
    );
    // The stalled worker's transaction is gone with its connection: whatever it did is not
    // committed (its batch is delivered again).
    assert!(
        stalled.commit().await.is_err(),
        "the stalled transaction outlived the server's idle timeout"
    );
}

/// MariaDB from 11.6 refuses a write to a row another transaction changed since this one's read
/// view was taken (error 1020, `innodb_snapshot_isolation`: on in CI's server, as it will be in
/// production's); 10.x lets the write work on rows the view does not show. Batches, payment
/// timeouts, cancels and transfers race here on the same bucket rows: every call must succeed
/// (a conflict is retried from BEGIN, and a read-modify-write path locks before it reads), and
/// the ledger's units must reconcile. On caf8794 the transfer failed with 1020 on all four
/// attempts (its plain read of the journal came before its bucket writes); with that read moved
/// after them, with 1213 on all four (a transfer and a batch took two buckets in opposite
/// orders) — until every transaction took its bucket rows in ascending order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_transactions_hold_under_snapshot_isolation() {
    use seckill_core::domain::{BucketNo, Reservation, ReservationId, UserId};
    use seckill_core::ports::{OrderStatus, Transfer};
    let Some(ledger) = mysql().await else { return };
    let (strict,): (i64,) = sqlx::query_as("SELECT @@innodb_snapshot_isolation")
        .fetch_one(ledger.pool())
        .await
        .expect("a MariaDB that knows innodb_snapshot_isolation (10.6.18, 10.11.8, 11.x)");
    assert_eq!(
        strict, 1,
        "the server runs with innodb_snapshot_isolation=ON (ci/services.sh sets it)"
    );
    let a = activity(unique_id(), 1_000, 2, 0);
    ledger.install(&a, &StockPlan::new(&a)).await.unwrap();
    let id = a.id();
    let reservation = |n: u64| Reservation {
        id: ReservationId(((id.0 as u128) << 64) | n as u128),
        activity: id,
        user: UserId(n),
        bucket: BucketNo((n % 2) as u32),
        qty: 1,
        reserved_at_ms: 5,
        generation: 0,
    };
    const ROUNDS: u64 = 40;
    let batches = async {
        for round in 0..ROUNDS {
            let batch: Vec<_> = (0..8).map(|i| reservation(1 + round * 8 + i)).collect();
            ledger.apply(&batch).await.expect("a batch");
        }
    };
    // Every order is due at once (reserved at 5 ms, a 60 s timeout): the payment timeout's
    // cancels give units back to the rows the batches take them from.
    let timeouts = async {
        for _ in 0..ROUNDS {
            ledger
                .cancel_unpaid(id, 1_000_000)
                .await
                .expect("the payment timeout's cancels");
        }
    };
    let moves = async {
        for round in 0..ROUNDS {
            let t = Transfer {
                id: format!("race-{round}"),
                from: BucketNo((round % 2) as u32),
                to: BucketNo(((round + 1) % 2) as u32),
                units: 1,
                generation: 0,
            };
            ledger.transfer(id, &t).await.expect("a transfer");
            ledger
                .cancel(reservation(1 + round * 8).id)
                .await
                .expect("a buyer's cancel");
        }
    };
    tokio::join!(batches, timeouts, moves);

    let view = ledger.snapshot(id).await.unwrap();
    let remaining: i64 = view.buckets.iter().map(|b| b.remaining).sum();
    let held = view
        .orders
        .iter()
        .filter(|o| matches!(o.status, OrderStatus::Created | OrderStatus::Paid))
        .count() as i64;
    assert_eq!(
        remaining + held,
        1_000,
        "units in the buckets and held by orders: the initial stock"
    );
    assert_eq!(view.orders.len() as u64, ROUNDS * 8, "every order of every batch");
}

/// Workers apply batches that meet at once: the same records twice (a redelivery across a
/// consumer group's rebalance) and the same users' other reservations in other buckets (a user
/// Redis marked twice after losing data). Each user gets one order and takes one unit; the same
/// reservation again is Redelivered, the other one DuplicateBuyer of the order that won. Batches
/// that share bucket rows wait for each other and read the winner's rows; those that share none
/// meet them in their multi-row insert (not yet committed when they read) and classify their
/// records one by one instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_applying_batches_that_meet_create_one_order_per_user() {
    use seckill_core::domain::{BucketNo, Reservation, ReservationId, UserId};
    use seckill_core::ports::{ApplyOutcome, OrderStatus};
    let Some(ledger) = mysql().await else { return };
    let a = activity(unique_id(), 1_000, 4, 0);
    ledger.install(&a, &StockPlan::new(&a)).await.unwrap();
    let id = a.id();
    // User n's reservation in bucket n % 2 (first) or 2 + n % 2 (second).
    let reservation = |n: u64, second: bool| Reservation {
        id: ReservationId(((id.0 as u128) << 64) | (n as u128) << 1 | second as u128),
        activity: id,
        user: UserId(n),
        bucket: BucketNo((n % 2) as u32 + if second { 2 } else { 0 }),
        qty: 1,
        reserved_at_ms: 5,
        generation: 0,
    };
    const ROUNDS: u64 = 20;
    const USERS: u64 = 16;
    let (second_worker, third_worker) = (ledger.clone(), ledger.clone());
    for round in 0..ROUNDS {
        let users: Vec<u64> = (0..USERS).map(|i| 1 + round * USERS + i).collect();
        let first: Vec<_> = users.iter().map(|&n| reservation(n, false)).collect();
        let second: Vec<_> = users.iter().map(|&n| reservation(n, true)).collect();
        let (x, y, z) = tokio::join!(
            ledger.apply(&first),
            second_worker.apply(&first),
            third_worker.apply(&second)
        );
        let (x, y, z) = (
            x.expect("a batch"),
            y.expect("the same again"),
            z.expect("the other buckets'"),
        );
        for (i, &n) in users.iter().enumerate() {
            let outcomes = [(&first[i], &x[i]), (&first[i], &y[i]), (&second[i], &z[i])];
            let created: Vec<ReservationId> = outcomes
                .iter()
                .filter(|(_, o)| **o == ApplyOutcome::Created)
                .map(|(r, _)| r.id)
                .collect();
            assert_eq!(created.len(), 1, "user {n}: one order ({outcomes:?})");
            for (r, o) in outcomes {
                match o {
                    ApplyOutcome::Created => {}
                    ApplyOutcome::Redelivered => assert_eq!(r.id, created[0], "user {n}: {outcomes:?}"),
                    ApplyOutcome::DuplicateBuyer { existing } => {
                        assert_ne!(r.id, created[0], "user {n}: {outcomes:?}");
                        assert_eq!(*existing, created[0], "user {n}: {outcomes:?}");
                    }
                    other => panic!("user {n}: {other:?} ({outcomes:?})"),
                }
            }
        }
    }
    let view = ledger.snapshot(id).await.unwrap();
    let remaining: i64 = view.buckets.iter().map(|b| b.remaining).sum();
    let users = (ROUNDS * USERS) as i64;
    assert_eq!(remaining, 1_000 - users, "one unit per user");
    assert_eq!(view.orders.len() as i64, users, "one order per user");
    assert!(view.orders.iter().all(|o| o.status == OrderStatus::Created));
    assert_eq!(view.journal.len() as i64, users, "one journal row per order");
}
