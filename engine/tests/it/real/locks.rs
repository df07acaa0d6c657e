//! Ledger transactions are bounded on MariaDB (DESIGN §11.3): a client stalled inside one (a
//! worker paused by the OS, a partition where TCP retransmits for minutes) does not hold the
//! activity's locks past the server's `idle_transaction_timeout`. Before the engine set it per
//! connection, a worker stalled mid-batch held its shared lock on the activity row for
//! `wait_timeout` (8 h): the operator's pause queued behind it (and every other worker's batch
//! behind the pause) until four lock-wait timeouts of 50 s each had failed it.

use super::{mysql, unique_id};
use seckill_engine::conformance::activity;
use seckill_engine::domain::{ActivityState, StockPlan};
use seckill_engine::ports::Ledger;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalled_mid_transaction_does_not_hold_the_activity() {
    let Some(ledger) = mysql().await else { return };
    let a = activity(unique_id(), 10, 2, 0);
    ledger.install(&a, &StockPlan::new(&a)).await.unwrap();

    // The stalled worker: a connection of the ledger's own pool (its session settings), inside a
    // batch's transaction, holding the shared lock `apply` takes on the activity row — then
    // silent.
    let mut stalled = ledger.pool().begin().await.unwrap();
    sqlx::query("SELECT generation FROM activity WHERE id = ? LOCK IN SHARE MODE")
        .bind(a.id().0)
        .fetch_one(&mut *stalled)
        .await
        .unwrap();

    // The operator pauses the sale: its write waits for that lock only until the server rolls
    // the stalled transaction back. (The bound is a liveness bound, far from both sides: seconds
    // with the session settings, minutes without.)
    let paused = tokio::time::timeout(
        Duration::from_secs(40),
        ledger.set_intent(a.id(), ActivityState::Paused),
    )
    .await
    .expect("the operator's pause waited on a stalled worker's transaction")
    .unwrap()
    .expect("installed");
    assert_eq!(paused.state, ActivityState::Paused);
    assert_eq!(
        ledger.registry(a.id()).await.unwrap().unwrap().intent.state,
        ActivityState::Paused
    );
    // The stalled worker's transaction is gone with its connection: whatever it did is not
    // committed (its batch is delivered again).
    assert!(
        stalled.commit().await.is_err(),
        "the stalled transaction outlived the server's idle timeout"
    );
}
