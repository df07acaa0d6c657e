//! Ledger transactions are bounded on MariaDB, and the operator's pause does not wait for them
//! (DESIGN §11.3). A worker stalled inside a batch's transaction (paused by the OS, or behind a
//! partition where TCP retransmits for minutes) holds the shared lock every batch takes on the
//! activity's generation. Before the engine set `idle_transaction_timeout` per connection it held
//! that lock for `wait_timeout` (8 h); and while the generation lived in the activity row, the
//! operator's pause (an UPDATE of that row) queued behind it, and every other worker's batch
//! behind the pause (tried on 5435bff, where the generation was a column of `activity`: the pause
//! returned only after the server rolled the stalled transaction back, and the stalled
//! transaction's next statement failed).

use super::{mysql, unique_id};
use seckill_engine::conformance::activity;
use seckill_engine::domain::{ActivityState, StockPlan};
use seckill_engine::ports::Ledger;
use std::time::Duration;

/// A connection of the ledger's own pool (its session settings) inside a batch's transaction,
/// holding the shared lock `apply` takes on the activity's generation — then silent.
async fn stalled_worker(
    ledger: &seckill_engine::adapters::mysql::MysqlLedger,
    a: &seckill_engine::domain::Activity,
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
