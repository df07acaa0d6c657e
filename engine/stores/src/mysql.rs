//! The ledger on MySQL / MariaDB (sqlx, MySQL driver), with the schema of `migrations/`
//! (DESIGN §6). The database is the final word on what was sold: both unique keys of
//! `seckill_order` are the consumer's idempotency, and the conditional `UPDATE … WHERE
//! remaining >= qty` is the last guard against overselling.
//!
//! A batch is ONE transaction of a handful of statements (`apply_batched_once`): it locks the
//! bucket rows it takes stock from and reads what they hold, reads which reservations are orders
//! already and which users hold one, decides every outcome as the ledger model does, then writes
//! all its order rows, stock and journal at once. What those reads could not see meets a unique
//! key in the insert, and the batch runs again order by order (`apply_each_once`): every event
//! inserts its order row first — a duplicate-key error (which InnoDB rolls back per statement,
//! not per transaction) is classified into Redelivered / DuplicateBuyer — then takes the stock
//! conditionally. Errors before COMMIT
//! are `Determinate` (the server rolls the transaction back); an error on COMMIT itself is
//! `Indeterminate`. Queries are built at run time (no `query!` macros): the crate builds without
//! a live database.

use seckill_core::adapters::embedded::ledger::{check_intent, stale_transfer};
use seckill_core::domain::{
    Activity, ActivityId, ActivitySpec, ActivityState, BucketNo, Reservation, ReservationId, StockPlan,
    UserId,
};
use seckill_core::planted::{on as planted, Bug};
use seckill_core::ports::{
    ApplyOutcome, CancelOutcome, Intent, JournalEntry, JournalKind, Ledger, LedgerBucket, LedgerView,
    OrderRow, OrderStatus, PayOutcome, PortError, PortResult, ReconcileView, Registered, Transfer,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{MySql, Row, Transaction};
use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

/// The schema, embedded at build time; `seckill migrate` and `MysqlLedger::migrate` apply it.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// The longest a ledger transaction may sit idle between its statements before the server rolls
/// it back and drops its connection: the producer's delivery timeout (3 s), so that a worker
/// stalled mid-batch frees the activity's locks within the recovery's publish window.
const IDLE_TRANSACTION_S: u32 = 3;
/// The longest a statement waits for a row lock (InnoDB's default is 50 s): a waiter gives up
/// and its transaction runs again from BEGIN (`retrying`).
const LOCK_WAIT_S: u32 = 3;
/// The longest one statement may run (the recovery's snapshot of a whole sale is the longest).
const STATEMENT_S: u32 = 30;

#[derive(Clone, PartialEq, Eq)]
pub struct MysqlConfig {
    pub url: String,
    /// Pool size: one connection per consumer batch in flight plus the jobs; MySQL's own limit
    /// is far above it.
    pub max_connections: u32,
    /// How long a caller waits for a pooled connection before the ledger counts as unavailable.
    pub acquire_timeout: Duration,
}

/// The URL's password is never shown (`mysql://user:***@host/db`).
impl std::fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("url", &super::redacted(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .finish()
    }
}

impl MysqlConfig {
    pub fn new(url: &str) -> Self {
        MysqlConfig {
            url: url.to_string(),
            max_connections: 8,
            acquire_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Clone)]
pub struct MysqlLedger {
    pool: MySqlPool,
}

fn determinate(op: &'static str) -> impl Fn(sqlx::Error) -> PortError {
    move |e| PortError::determinate_from(op, e)
}

fn parse_status(s: &str) -> PortResult<OrderStatus> {
    OrderStatus::ALL
        .into_iter()
        .find(|x| x.as_str() == s)
        .ok_or_else(|| PortError::determinate("read order", format!("unknown status {s:?}")))
}

fn kind_str(k: JournalKind) -> &'static str {
    match k {
        JournalKind::Order => "order",
        JournalKind::Cancel => "cancel",
        JournalKind::Transfer => "transfer",
        JournalKind::Adjust => "adjust",
    }
}

fn parse_kind(s: &str) -> PortResult<JournalKind> {
    Ok(match s {
        "order" => JournalKind::Order,
        "cancel" => JournalKind::Cancel,
        "transfer" => JournalKind::Transfer,
        "adjust" => JournalKind::Adjust,
        other => {
            return Err(PortError::determinate(
                "read journal",
                format!("unknown kind {other:?}"),
            ))
        }
    })
}

const ORDER_COLUMNS: &str =
    "reservation_id, activity_id, user_id, bucket_no, qty, reserved_at_ms, status, generation";
const ACTIVITY_COLUMNS: &str = "id, total_stock, bucket_count, fallback_pct, per_user_limit, start_ms, \
                                end_ms, pay_timeout_ms, unit_price_minor, state, intent_version, generation";
/// The registry: the activity row and its generation's own row (which the batches lock, so that
/// the operator's intent writes on the activity row never wait for them).
const REGISTRY: &str = "activity JOIN activity_generation ON activity_generation.activity_id = activity.id";

fn registered_of_row(row: &MySqlRow) -> PortResult<Registered> {
    let op = "read activity";
    let get = |e: sqlx::Error| PortError::determinate_from(op, e);
    let id = ActivityId(row.try_get("id").map_err(get)?);
    let spec = ActivitySpec {
        id,
        total_stock: row.try_get("total_stock").map_err(get)?,
        buckets: row.try_get("bucket_count").map_err(get)?,
        fallback_pct: row.try_get("fallback_pct").map_err(get)?,
        per_user_limit: row.try_get("per_user_limit").map_err(get)?,
        start_ms: row.try_get("start_ms").map_err(get)?,
        end_ms: row.try_get("end_ms").map_err(get)?,
        pay_timeout_ms: row.try_get("pay_timeout_ms").map_err(get)?,
        unit_price_minor: row.try_get("unit_price_minor").map_err(get)?,
    };
    let activity = Activity::new(spec).map_err(|e| {
        PortError::determinate(op, format!("stored activity {id} is invalid: {e}")).caused_by(e)
    })?;
    let state: String = row.try_get("state").map_err(get)?;
    let state = ActivityState::parse(&state)
        .filter(|s| *s != ActivityState::Recovering)
        .ok_or_else(|| PortError::determinate(op, format!("activity {id}: unknown intent {state:?}")))?;
    Ok(Registered {
        activity,
        intent: Intent {
            state,
            version: row.try_get("intent_version").map_err(get)?,
            generation: row.try_get("generation").map_err(get)?,
        },
    })
}

fn order_of_row(row: &MySqlRow) -> PortResult<OrderRow> {
    let get = |e: sqlx::Error| PortError::determinate_from("read order", e);
    let id: String = row.try_get("reservation_id").map_err(get)?;
    let status: String = row.try_get("status").map_err(get)?;
    Ok(OrderRow {
        reservation: Reservation {
            id: ReservationId::from_str(&id).map_err(|e| PortError::determinate("read order", e))?,
            activity: ActivityId(row.try_get::<u64, _>("activity_id").map_err(get)?),
            user: UserId(row.try_get::<u64, _>("user_id").map_err(get)?),
            bucket: BucketNo(row.try_get::<u32, _>("bucket_no").map_err(get)?),
            qty: row.try_get::<u32, _>("qty").map_err(get)?,
            reserved_at_ms: row.try_get::<u64, _>("reserved_at_ms").map_err(get)?,
            generation: row.try_get::<u64, _>("generation").map_err(get)?,
        },
        status: parse_status(&status)?,
    })
}

/// Is this a duplicate-key error (and nothing else)?
fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::ForeignKeyViolation)
}

impl MysqlLedger {
    /// A lazy pool: nothing is dialled until the first query, so an engine can start (and answer
    /// 503) while the database is down.
    pub fn connect_lazy(cfg: &MysqlConfig) -> PortResult<MysqlLedger> {
        let options = MySqlConnectOptions::from_str(&cfg.url)
            .map_err(|e| PortError::determinate("mysql config", format!("DATABASE_URL: {e}")).caused_by(e))?
            // Room for every statement the ledger runs, prepared once per connection: its
            // batched statements take a few shapes each (`padded`, `in_shapes`), some 70 in all,
            // besides the fixed ones (sqlx keeps 100 by default and evicts the oldest).
            .statement_cache_capacity(256);
        let pool = MySqlPoolOptions::new()
            .max_connections(cfg.max_connections)
            .acquire_timeout(cfg.acquire_timeout)
            // Explicit, whatever the server's default: the recovery's snapshot and the
            // reconciler's view rely on one consistent read view per transaction. And bounded:
            // a client that stalls inside a transaction (a paused worker, a partition: TCP
            // retransmits for minutes) must not hold the activity's locks for the server's
            // `wait_timeout` (8 h) — every other worker, the recovery's drain and the operator's
            // pause would queue behind it (DESIGN §11.3).
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}"
                    )))
                    .execute(&mut *conn)
                    .await?;
                    // MariaDB's: the server rolls back a transaction idle this long (and closes
                    // its connection, releasing its locks), and kills a statement running
                    // longer. MySQL has neither (error 1193, unknown variable): there the lock
                    // wait above bounds only the waiters.
                    let mariadb = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_S}, \
                         max_statement_time = {STATEMENT_S}"
                    )))
                    .execute(&mut *conn)
                    .await;
                    match mariadb {
                        Err(e) if error_number(&e) == Some(1193) => Ok(()),
                        other => other.map(drop),
                    }
                })
            })
            .connect_lazy_with(options);
        Ok(MysqlLedger { pool })
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Per order of `activity`, the milliseconds from its reservation (`reserved_at_ms`: the API
    /// process's clock, just before it answered the buyer 202) to its row (`created_at`: the
    /// database's clock, in the batch that applied it) — how long a buyer's "queued" lasted.
    /// A measure for `seckill load --stages`, meaningful where the engine and the database
    /// share a clock (one machine); no engine path reads it.
    pub async fn queued_to_order_ms(&self, activity: ActivityId) -> PortResult<Vec<i64>> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "SELECT CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED) - CAST(reserved_at_ms AS SIGNED) \
             FROM seckill_order WHERE activity_id = ?",
        )
        .bind(activity.0)
        .fetch_all(&self.pool)
        .await
        .map_err(determinate("queued_to_order_ms"))?;
        Ok(rows.into_iter().map(|(ms,)| ms).collect())
    }

    /// Apply `migrations/` (idempotent: applied versions are recorded in `_sqlx_migrations`).
    pub async fn migrate(&self) -> PortResult<()> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| PortError::determinate_from("migrate", e))
    }

    async fn journal(
        tx: &mut Transaction<'static, MySql>,
        activity: ActivityId,
        e: &JournalEntry,
    ) -> Result<(), sqlx::Error> {
        Self::journal_many(tx, activity, std::slice::from_ref(e)).await
    }

    /// Journal rows in one statement.
    async fn journal_many(
        tx: &mut Transaction<'static, MySql>,
        activity: ActivityId,
        entries: &[JournalEntry],
    ) -> Result<(), sqlx::Error> {
        for entries in in_shapes(entries) {
            let sql = format!(
                "INSERT INTO stock_journal (activity_id, bucket_no, kind, reference, delta) VALUES {}",
                vec!["(?, ?, ?, ?, ?)"; entries.len()].join(", ")
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for e in entries {
                q = q
                    .bind(activity.0)
                    .bind(e.bucket.0)
                    .bind(kind_str(e.kind))
                    .bind(&e.reference)
                    .bind(e.delta);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    async fn apply_one(
        tx: &mut Transaction<'static, MySql>,
        r: &Reservation,
    ) -> Result<ApplyOutcome, sqlx::Error> {
        let id = r.id.to_string();
        let insert = sqlx::query(
            "INSERT INTO seckill_order (reservation_id, activity_id, user_id, bucket_no, qty, reserved_at_ms, \
             status, generation) VALUES (?, ?, ?, ?, ?, ?, 'created', ?)",
        )
        .bind(&id)
        .bind(r.activity.0)
        .bind(r.user.0)
        .bind(r.bucket.0)
        .bind(r.qty)
        .bind(r.reserved_at_ms)
        .bind(r.generation)
        .execute(&mut **tx)
        .await;
        match insert {
            Ok(_) => {}
            Err(e) if is_foreign_key_violation(&e) => return Ok(ApplyOutcome::UnknownBucket),
            Err(e) if is_unique_violation(&e) => {
                // Locking reads: they see the latest committed row (the one the unique key met),
                // where a plain read sees the transaction's read view, which may predate it.
                let same: Option<(String,)> = sqlx::query_as(
                    "SELECT reservation_id FROM seckill_order WHERE reservation_id = ? LOCK IN SHARE MODE",
                )
                .bind(&id)
                .fetch_optional(&mut **tx)
                .await?;
                if same.is_some() {
                    return Ok(ApplyOutcome::Redelivered);
                }
                // The user's live order (uk_activity_live_user: failed orders free their user).
                let (existing,): (String,) = sqlx::query_as(
                    "SELECT reservation_id FROM seckill_order WHERE activity_id = ? AND live_user = ? LOCK IN SHARE MODE",
                )
                .bind(r.activity.0)
                .bind(r.user.0)
                .fetch_one(&mut **tx)
                .await?;
                let existing = ReservationId::from_str(&existing)
                    .map_err(|e| sqlx::Error::Decode(format!("reservation_id: {e}").into()))?;
                return Ok(ApplyOutcome::DuplicateBuyer { existing });
            }
            Err(e) => return Err(e),
        }
        // The activity's generation under a shared lock held to COMMIT: a recovery's bump
        // (an UPDATE of this row) waits for this batch, so its snapshot either holds this order or
        // the order is refused here (DESIGN §11.3).
        let current = generation_shared(tx, r.activity).await?;
        let current = current.filter(|_| !planted(Bug::NoGenerationCheck));
        if current.is_some_and(|g| r.generation < g) {
            sqlx::query("UPDATE seckill_order SET status = 'failed' WHERE reservation_id = ?")
                .bind(&id)
                .execute(&mut **tx)
                .await?;
            return Ok(ApplyOutcome::StaleGeneration);
        }
        let taken = sqlx::query(
            "UPDATE stock_bucket SET remaining = remaining - ? \
             WHERE activity_id = ? AND bucket_no = ? AND remaining >= ?",
        )
        .bind(r.qty)
        .bind(r.activity.0)
        .bind(r.bucket.0)
        .bind(r.qty)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if taken == 0 {
            sqlx::query("UPDATE seckill_order SET status = 'failed' WHERE reservation_id = ?")
                .bind(&id)
                .execute(&mut **tx)
                .await?;
            return Ok(ApplyOutcome::OutOfStock);
        }
        let entry = JournalEntry {
            bucket: r.bucket,
            kind: JournalKind::Order,
            reference: id,
            delta: -(r.qty as i64),
        };
        Self::journal(tx, r.activity, &entry).await?;
        Ok(ApplyOutcome::Created)
    }
}

/// Why one attempt at a transaction failed.
enum TxError {
    /// A statement failed; the server rolled the transaction back.
    Sql(sqlx::Error),
    /// COMMIT failed: the transaction may or may not have committed.
    Commit(sqlx::Error),
    /// The ledger refuses the operation (its precondition does not hold).
    Refused(PortError),
}

impl From<sqlx::Error> for TxError {
    fn from(e: sqlx::Error) -> Self {
        TxError::Sql(e)
    }
}

type TxResult<T> = Result<T, TxError>;

/// Attempts per transaction: InnoDB resolves a deadlock by rolling one transaction back (bucket
/// rows are taken in one order, `lock_buckets`, but order rows and the generation still meet in
/// others), and the victim is expected to run again.
const TX_ATTEMPTS: u32 = 4;

/// The server's error number, if the error is the server's.
fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// Rolled back, safe to run again from BEGIN: a deadlock victim (1213), a lock wait timeout
/// (1205), or a write to a row changed since the transaction's read view was taken (1020: with
/// MariaDB's `innodb_snapshot_isolation`, the default from 11.6).
fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(error_number(e), Some(1213 | 1205 | 1020))
}

/// Run `attempt` (one whole transaction, begin to commit) until it succeeds, is refused, or fails
/// in a way that is not a deadlock.
async fn retrying<T, Fut: std::future::Future<Output = TxResult<T>>>(
    op: &'static str,
    mut attempt: impl FnMut() -> Fut,
) -> PortResult<T> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(TxError::Sql(e)) if is_retryable(&e) && tries < TX_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(5 << tries)).await;
            }
            Err(TxError::Sql(e)) => return Err(PortError::determinate_from(op, e)),
            Err(TxError::Commit(e)) => {
                return Err(PortError::indeterminate(op, format!("commit: {e}")).caused_by(e))
            }
            Err(TxError::Refused(e)) => return Err(e),
        }
    }
}

async fn commit(tx: Transaction<'static, MySql>) -> TxResult<()> {
    tx.commit().await.map_err(TxError::Commit)
}

/// The activity's generation under a shared lock held to COMMIT (every order and transfer takes
/// it): a recovery's bump, which takes it exclusive, waits for the transaction.
async fn generation_shared(
    tx: &mut Transaction<'static, MySql>,
    activity: ActivityId,
) -> Result<Option<u64>, sqlx::Error> {
    let row: Option<(u64,)> =
        sqlx::query_as("SELECT generation FROM activity_generation WHERE activity_id = ? LOCK IN SHARE MODE")
            .bind(activity.0)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(row.map(|(g,)| g))
}

/// Lock the bucket rows of `activity` a transaction is about to write, in ascending order,
/// before it writes any: batches, transfers and payment timeouts each write several buckets in
/// an order of their own (a batch's, a transfer's direction), and two that take the same rows in
/// opposite orders deadlock — in a busy sale on every attempt (seen on MariaDB: a transfer and a
/// batch, four victims in a row). One row has no order to get wrong.
async fn lock_buckets(
    tx: &mut Transaction<'static, MySql>,
    activity: ActivityId,
    buckets: &BTreeSet<BucketNo>,
) -> Result<(), sqlx::Error> {
    if buckets.len() < 2 {
        return Ok(());
    }
    bucket_stock(tx, activity, buckets).await.map(drop)
}

/// The stock of `activity`'s `buckets` (those it has), their rows locked exclusive in ascending
/// order (`lock_buckets` is this, for the lock alone).
async fn bucket_stock(
    tx: &mut Transaction<'static, MySql>,
    activity: ActivityId,
    buckets: &BTreeSet<BucketNo>,
) -> Result<Vec<(BucketNo, i64)>, sqlx::Error> {
    let (buckets, marks) = in_list(buckets.iter());
    let sql = format!(
        "SELECT bucket_no, remaining FROM stock_bucket WHERE activity_id = ? AND bucket_no IN ({marks}) \
         ORDER BY bucket_no FOR UPDATE"
    );
    let mut q = sqlx::query_as::<_, (u32, i64)>(sqlx::AssertSqlSafe(sql)).bind(activity.0);
    for b in buckets {
        q = q.bind(b.0);
    }
    Ok(q.fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|(b, remaining)| (BucketNo(b), remaining))
        .collect())
}

/// Which of the batch's reservations are orders already (of any activity: the key is global).
async fn known_reservations(
    tx: &mut Transaction<'static, MySql>,
    batch: &[Reservation],
) -> Result<BTreeSet<ReservationId>, sqlx::Error> {
    let ids: BTreeSet<String> = batch.iter().map(|r| r.id.to_string()).collect();
    let (ids, marks) = in_list(ids.iter());
    let sql = format!("SELECT reservation_id FROM seckill_order WHERE reservation_id IN ({marks})");
    let mut q = sqlx::query_as::<_, (String,)>(sqlx::AssertSqlSafe(sql));
    for id in &ids {
        q = q.bind(id);
    }
    q.fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|(id,)| reservation_id(&id))
        .collect()
}

/// The live order (any but a failed one) of each of `users` that has one in `activity`.
async fn live_orders(
    tx: &mut Transaction<'static, MySql>,
    activity: ActivityId,
    users: &BTreeSet<UserId>,
) -> Result<Vec<(UserId, ReservationId)>, sqlx::Error> {
    let (users, marks) = in_list(users.iter());
    let sql = format!(
        "SELECT live_user, reservation_id FROM seckill_order WHERE activity_id = ? AND live_user IN ({marks})"
    );
    let mut q = sqlx::query_as::<_, (u64, String)>(sqlx::AssertSqlSafe(sql)).bind(activity.0);
    for u in users {
        q = q.bind(u.0);
    }
    q.fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|(user, id)| Ok((UserId(user), reservation_id(&id)?)))
        .collect()
}

fn reservation_id(text: &str) -> Result<ReservationId, sqlx::Error> {
    ReservationId::from_str(text).map_err(|e| sqlx::Error::Decode(format!("reservation_id: {e}").into()))
}

/// The batch's new order rows in one statement, each with its status.
async fn insert_orders(
    tx: &mut Transaction<'static, MySql>,
    rows: &[(&Reservation, &'static str)],
) -> Result<(), sqlx::Error> {
    for rows in in_shapes(rows) {
        let sql = format!(
            "INSERT INTO seckill_order (reservation_id, activity_id, user_id, bucket_no, qty, reserved_at_ms, \
             status, generation) VALUES {}",
            vec!["(?, ?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ")
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (r, status) in rows {
            q = q
                .bind(r.id.to_string())
                .bind(r.activity.0)
                .bind(r.user.0)
                .bind(r.bucket.0)
                .bind(r.qty)
                .bind(r.reserved_at_ms)
                .bind(*status)
                .bind(r.generation);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// `values` repeated at the end up to a power of two: the statement that lists them (`IN (…)`,
/// where a repeated value changes nothing) then has one of a few shapes, each prepared once per
/// connection and kept in sqlx's statement cache. Without it a batch of every size was a
/// statement of its own: prepared anew (a round trip, and MariaDB's answer carries one packet per
/// placeholder) and evicting another from the cache.
fn padded<T: Clone>(values: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let n = values.len().next_power_of_two();
    let mut v: Vec<T> = values.collect();
    if let Some(last) = v.last().cloned() {
        v.resize(n, last);
    }
    v
}

/// An `IN` list's values, `padded`, and its placeholders.
fn in_list<T: Clone>(values: impl ExactSizeIterator<Item = T>) -> (Vec<T>, String) {
    let values = padded(values);
    let marks = vec!["?"; values.len()].join(", ");
    (values, marks)
}

/// `rows` in pieces whose sizes are powers of two, largest first (its size's binary digits):
/// a multi-row insert cannot repeat a row, so it keeps to the few shapes `padded` gives an
/// `IN` list by running one statement per piece — in the same transaction, rows in order.
fn in_shapes<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let n = rows.len();
        if n == 0 {
            return None;
        }
        let (piece, rest) = rows.split_at(1 << n.ilog2());
        rows = rest;
        Some(piece)
    })
}

/// Take `deltas` (units per bucket) from `activity`'s stock in one statement. The rows are
/// locked and their stock was read in this transaction; the condition is the last guard all the
/// same (a bucket that would go below zero is not updated, and the batch fails).
async fn take_stock(
    tx: &mut Transaction<'static, MySql>,
    activity: ActivityId,
    deltas: &[(BucketNo, i64)],
) -> TxResult<()> {
    if deltas.is_empty() {
        return Ok(());
    }
    // A bucket repeated (`padded`) repeats its own case: the same update.
    let (all, marks) = in_list(deltas.iter());
    let cases = "CASE bucket_no ".to_string() + &"WHEN ? THEN ? ".repeat(all.len()) + "END";
    let sql = format!(
        "UPDATE stock_bucket SET remaining = remaining - {cases} \
         WHERE activity_id = ? AND bucket_no IN ({marks}) AND remaining >= {cases}"
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (b, units) in &all {
        q = q.bind(b.0).bind(*units);
    }
    q = q.bind(activity.0);
    for (b, _) in &all {
        q = q.bind(b.0);
    }
    for (b, units) in &all {
        q = q.bind(b.0).bind(*units);
    }
    let updated = q.execute(&mut **tx).await?.rows_affected();
    if updated != deltas.len() as u64 {
        return Err(TxError::Refused(PortError::determinate(
            "apply",
            format!(
                "{updated} of {} buckets took their units: the stock read under lock moved",
                deltas.len()
            ),
        )));
    }
    Ok(())
}

impl MysqlLedger {
    async fn cancel_unpaid_once(&self, activity: ActivityId, now_ms: u64) -> TxResult<Vec<Reservation>> {
        let mut tx = self.pool.begin().await?;
        // Only locking reads here: each sees the latest committed rows, where a plain read would
        // fix a read view that the cancels' writes below then contradict (rows the consumer
        // changed since: error 1020 under MariaDB's snapshot isolation).
        let timeout: Option<(u64,)> =
            sqlx::query_as("SELECT pay_timeout_ms FROM activity WHERE id = ? LOCK IN SHARE MODE")
                .bind(activity.0)
                .fetch_optional(&mut *tx)
                .await?;
        // Due: reserved_at + timeout <= now (nothing is due before the first timeout has passed).
        let Some(cutoff) = timeout.and_then(|(timeout,)| now_ms.checked_sub(timeout)) else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM seckill_order \
             WHERE activity_id = ? AND status = 'created' AND reserved_at_ms <= ? ORDER BY id FOR UPDATE"
        );
        let due = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(activity.0)
            .bind(cutoff)
            .fetch_all(&mut *tx)
            .await?;
        let due = due
            .iter()
            .map(|row| order_of_row(row).map(|o| o.reservation))
            .collect::<PortResult<Vec<_>>>()
            .map_err(TxError::Refused)?;
        lock_buckets(&mut tx, activity, &due.iter().map(|r| r.bucket).collect()).await?;
        for r in &due {
            Self::cancel_row(&mut tx, r).await?;
        }
        commit(tx).await?;
        Ok(due)
    }

    /// Cancel one created order inside `tx`: status, stock back to its bucket, journal row.
    async fn cancel_row(tx: &mut Transaction<'static, MySql>, r: &Reservation) -> Result<(), sqlx::Error> {
        let id = r.id.to_string();
        sqlx::query(
            "UPDATE seckill_order SET status = 'cancelled' WHERE reservation_id = ? AND status = 'created'",
        )
        .bind(&id)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "UPDATE stock_bucket SET remaining = remaining + ? WHERE activity_id = ? AND bucket_no = ?",
        )
        .bind(r.qty)
        .bind(r.activity.0)
        .bind(r.bucket.0)
        .execute(&mut **tx)
        .await?;
        let entry = JournalEntry {
            bucket: r.bucket,
            kind: JournalKind::Cancel,
            reference: id,
            delta: r.qty as i64,
        };
        Self::journal(tx, r.activity, &entry).await
    }

    async fn cancel_once(&self, id: ReservationId) -> TxResult<CancelOutcome> {
        let mut tx = self.pool.begin().await?;
        let sql = format!("SELECT {ORDER_COLUMNS} FROM seckill_order WHERE reservation_id = ? FOR UPDATE");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(CancelOutcome::NotFound);
        };
        let order = order_of_row(&row).map_err(TxError::Refused)?;
        let outcome = match order.status {
            OrderStatus::Created => {
                Self::cancel_row(&mut tx, &order.reservation).await?;
                CancelOutcome::Cancelled(order.reservation)
            }
            OrderStatus::Cancelled => CancelOutcome::AlreadyCancelled,
            other => CancelOutcome::NotCancellable(other),
        };
        commit(tx).await?;
        Ok(outcome)
    }

    async fn install_once(&self, activity: &Activity, plan: &StockPlan) -> TxResult<bool> {
        let s = activity.spec();
        let mut tx = self.pool.begin().await?;
        let created = sqlx::query(
            "INSERT IGNORE INTO activity (id, total_stock, bucket_count, fallback_pct, per_user_limit, \
             start_ms, end_ms, pay_timeout_ms, unit_price_minor, plan_version) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(s.id.0)
        .bind(s.total_stock)
        .bind(s.buckets)
        .bind(s.fallback_pct)
        .bind(s.per_user_limit)
        .bind(s.start_ms)
        .bind(s.end_ms)
        .bind(s.pay_timeout_ms)
        .bind(s.unit_price_minor)
        .bind(&plan.version)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !created {
            let (version,): (String,) = sqlx::query_as("SELECT plan_version FROM activity WHERE id = ?")
                .bind(s.id.0)
                .fetch_one(&mut *tx)
                .await?;
            if version != plan.version {
                return Err(TxError::Refused(PortError::determinate(
                    "install",
                    format!(
                        "activity {} is installed with plan {version}, not {}",
                        s.id, plan.version
                    ),
                )));
            }
            return Ok(false);
        }
        sqlx::query("INSERT INTO activity_generation (activity_id) VALUES (?)")
            .bind(s.id.0)
            .execute(&mut *tx)
            .await?;
        for b in plan.all_buckets() {
            sqlx::query(
                "INSERT INTO stock_bucket (activity_id, bucket_no, initial, remaining) VALUES (?, ?, ?, ?)",
            )
            .bind(s.id.0)
            .bind(b.0)
            .bind(plan.initial(b))
            .bind(plan.initial(b) as i64)
            .execute(&mut *tx)
            .await?;
        }
        commit(tx).await?;
        Ok(true)
    }

    /// A read-only transaction with one consistent read view for all its statements, taken at
    /// its start. Every pooled connection runs REPEATABLE READ (set at connect): under READ
    /// COMMITTED each statement would get its own view, and a cancel between two reads would
    /// lose a unit.
    async fn consistent_read(&self) -> Result<Transaction<'static, MySql>, sqlx::Error> {
        self.pool
            .begin_with("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await
    }

    /// A batch in a handful of statements, whatever its size: the locking reads of the
    /// generation and of the bucket rows with their stock, one read of which reservations are
    /// orders already and one of which users hold a live order, the outcomes decided here in the
    /// batch's order exactly as the ledger model decides them (`EmbeddedLedger`), then one
    /// multi-row insert of the orders, one update of the buckets' stock and one of the journal.
    /// What the reads could not see (another worker's insert of the same reservation or user,
    /// committed since or not yet) fails the insert: the batch then runs again order by order
    /// (`apply_each_once`), each insert classified by the key it met.
    async fn apply_once(&self, batch: &[Reservation]) -> TxResult<Vec<ApplyOutcome>> {
        match self.apply_batched_once(batch).await {
            Err(TxError::Sql(e)) if is_unique_violation(&e) || is_foreign_key_violation(&e) => {
                // Counted: many mean batches that share users or reservations but no bucket.
                metrics::counter!("seckill_ledger_batch_fallbacks_total").increment(1);
                self.apply_each_once(batch).await
            }
            other => other,
        }
    }

    async fn apply_batched_once(&self, batch: &[Reservation]) -> TxResult<Vec<ApplyOutcome>> {
        let mut tx = self.pool.begin().await?;
        let mut activities: BTreeMap<ActivityId, (BTreeSet<BucketNo>, BTreeSet<UserId>)> = BTreeMap::new();
        for r in batch {
            let (buckets, users) = activities.entry(r.activity).or_default();
            buckets.insert(r.bucket);
            users.insert(r.user);
        }
        // Locking reads first (they fix no read view): per activity its generation, shared to
        // COMMIT as every order takes it, then its bucket rows, exclusive and in ascending
        // order as transfers take them, with the stock they hold.
        let mut generation = BTreeMap::new();
        let mut stock: BTreeMap<(ActivityId, BucketNo), i64> = BTreeMap::new();
        for (activity, (buckets, _)) in &activities {
            generation.insert(*activity, generation_shared(&mut tx, *activity).await?);
            for (b, remaining) in bucket_stock(&mut tx, *activity, buckets).await? {
                stock.insert((*activity, b), remaining);
            }
        }
        // Then plain reads, after the rows this batch writes to are locked: which reservations
        // are orders already, and each user's live order.
        let mut known = known_reservations(&mut tx, batch).await?;
        let mut live: BTreeMap<(ActivityId, UserId), ReservationId> = BTreeMap::new();
        for (activity, (_, users)) in &activities {
            for (user, existing) in live_orders(&mut tx, *activity, users).await? {
                live.insert((*activity, user), existing);
            }
        }
        // The outcomes, in the batch's order, as `EmbeddedLedger::apply_one` decides them.
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut rows: Vec<(&Reservation, &'static str)> = Vec::with_capacity(batch.len());
        let mut taken: BTreeMap<(ActivityId, BucketNo), i64> = BTreeMap::new();
        for r in batch {
            let outcome = if known.contains(&r.id) {
                ApplyOutcome::Redelivered
            } else if let Some(existing) = live.get(&(r.activity, r.user)) {
                ApplyOutcome::DuplicateBuyer { existing: *existing }
            } else if let Some(remaining) = stock.get_mut(&(r.activity, r.bucket)) {
                let stale = generation[&r.activity].is_some_and(|g| r.generation < g)
                    && !planted(Bug::NoGenerationCheck);
                let outcome = if stale {
                    ApplyOutcome::StaleGeneration
                } else if *remaining >= r.qty as i64 {
                    *remaining -= r.qty as i64;
                    *taken.entry((r.activity, r.bucket)).or_default() += r.qty as i64;
                    live.insert((r.activity, r.user), r.id);
                    ApplyOutcome::Created
                } else {
                    ApplyOutcome::OutOfStock
                };
                let status = match outcome {
                    ApplyOutcome::Created => "created",
                    _ => "failed",
                };
                rows.push((r, status));
                known.insert(r.id);
                outcome
            } else {
                ApplyOutcome::UnknownBucket
            };
            outcomes.push(outcome);
        }
        insert_orders(&mut tx, &rows).await?;
        for activity in activities.keys() {
            let deltas: Vec<(BucketNo, i64)> = taken
                .range((*activity, BucketNo(0))..=(*activity, BucketNo(u32::MAX)))
                .map(|((_, b), units)| (*b, *units))
                .collect();
            take_stock(&mut tx, *activity, &deltas).await?;
            let entries: Vec<JournalEntry> = rows
                .iter()
                .filter(|(r, status)| r.activity == *activity && *status == "created")
                .map(|(r, _)| JournalEntry {
                    bucket: r.bucket,
                    kind: JournalKind::Order,
                    reference: r.id.to_string(),
                    delta: -(r.qty as i64),
                })
                .collect();
            Self::journal_many(&mut tx, *activity, &entries).await?;
        }
        commit(tx).await?;
        Ok(outcomes)
    }

    /// The batch order by order: every order inserts its row first and is classified by the key
    /// its insert meets (the way of every ledger before batched statements).
    async fn apply_each_once(&self, batch: &[Reservation]) -> TxResult<Vec<ApplyOutcome>> {
        let mut tx = self.pool.begin().await?;
        // Per activity, its generation (shared, as every order takes it) and then its buckets,
        // in the order transfers take them.
        let mut buckets: BTreeMap<ActivityId, BTreeSet<BucketNo>> = Default::default();
        for r in batch {
            buckets.entry(r.activity).or_default().insert(r.bucket);
        }
        for (activity, buckets) in buckets.iter().filter(|(_, b)| b.len() > 1) {
            generation_shared(&mut tx, *activity).await?;
            lock_buckets(&mut tx, *activity, buckets).await?;
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for r in batch {
            outcomes.push(Self::apply_one(&mut tx, r).await?);
        }
        commit(tx).await?;
        Ok(outcomes)
    }

    async fn transfer_once(&self, activity: ActivityId, t: &Transfer) -> TxResult<bool> {
        let refused = |reason: String| TxError::Refused(PortError::determinate("transfer", reason));
        if t.from == t.to {
            return Err(refused(format!("from bucket {} to itself", t.from)));
        }
        let mut tx = self.pool.begin().await?;
        // The generation under a shared lock held to COMMIT, as for an order: a recovery's bump
        // waits for this transfer, so its snapshot holds it or it is refused here.
        let current = generation_shared(&mut tx, activity).await?;
        // The bucket rows are written before anything is read without a lock: a plain read first
        // would fix a read view that the batches' writes to these rows since then contradict
        // (error 1020 under MariaDB's snapshot isolation, on every attempt in a busy sale).
        // Whether to keep the writes is decided after, and a refusal rolls them back.
        lock_buckets(&mut tx, activity, &[t.from, t.to].into_iter().collect()).await?;
        let taken = sqlx::query(
            "UPDATE stock_bucket SET remaining = remaining - ? WHERE activity_id = ? AND bucket_no = ? AND remaining >= ?",
        )
        .bind(t.units)
        .bind(activity.0)
        .bind(t.from.0)
        .bind(t.units)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let given = sqlx::query(
            "UPDATE stock_bucket SET remaining = remaining + ? WHERE activity_id = ? AND bucket_no = ?",
        )
        .bind(t.units)
        .bind(activity.0)
        .bind(t.to.0)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Both bucket rows locked: a transfer of this id committed before is seen here, one
        // committed since would have waited for those locks. (Dropping `tx` rolls back.)
        let done: Option<(u64,)> = sqlx::query_as(
            "SELECT id FROM stock_journal WHERE activity_id = ? AND kind = 'transfer' AND reference = ? LIMIT 1",
        )
        .bind(activity.0)
        .bind(&t.id)
        .fetch_optional(&mut *tx)
        .await?;
        if done.is_some() {
            return Ok(false);
        }
        if let Some(current) = current.filter(|g| t.generation < *g) {
            return Err(refused(stale_transfer(t, current)));
        }
        if taken == 0 {
            return Err(refused(format!(
                "bucket {} is missing or lacks {} units",
                t.from, t.units
            )));
        }
        if given == 0 {
            return Err(refused(format!("no bucket {}", t.to)));
        }
        for (bucket, delta) in [(t.from, -(t.units as i64)), (t.to, t.units as i64)] {
            let entry = JournalEntry {
                bucket,
                kind: JournalKind::Transfer,
                reference: t.id.clone(),
                delta,
            };
            match Self::journal(&mut tx, activity, &entry).await {
                // The same transfer committed by another runner since this one's read: done
                // (dropping the transaction rolls this attempt back).
                Err(e) if is_unique_violation(&e) => return Ok(false),
                other => other?,
            }
        }
        commit(tx).await?;
        Ok(true)
    }
}

impl Ledger for MysqlLedger {
    async fn cancel_unpaid(&self, activity: ActivityId, now_ms: u64) -> PortResult<Vec<Reservation>> {
        retrying("cancel unpaid", || self.cancel_unpaid_once(activity, now_ms)).await
    }

    async fn install(&self, activity: &Activity, plan: &StockPlan) -> PortResult<bool> {
        retrying("install", || self.install_once(activity, plan)).await
    }

    async fn apply(&self, batch: &[Reservation]) -> PortResult<Vec<ApplyOutcome>> {
        retrying("apply", || self.apply_once(batch)).await
    }

    async fn cancel(&self, id: ReservationId) -> PortResult<CancelOutcome> {
        retrying("cancel", || self.cancel_once(id)).await
    }

    async fn activity(&self, id: ActivityId) -> PortResult<Option<Activity>> {
        Ok(self.registry(id).await?.map(|r| r.activity))
    }

    async fn registry(&self, id: ActivityId) -> PortResult<Option<Registered>> {
        let sql = format!("SELECT {ACTIVITY_COLUMNS} FROM {REGISTRY} WHERE id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(determinate("read activity"))?;
        row.as_ref().map(registered_of_row).transpose()
    }

    async fn registered(&self) -> PortResult<Vec<Registered>> {
        let sql = format!("SELECT {ACTIVITY_COLUMNS} FROM {REGISTRY} ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(determinate("read activities"))?;
        rows.iter().map(registered_of_row).collect()
    }

    async fn set_intent(&self, id: ActivityId, state: ActivityState) -> PortResult<Option<Intent>> {
        check_intent(state)?;
        retrying("set intent", || async {
            let mut tx = self.pool.begin().await?;
            let changed = sqlx::query(
                "UPDATE activity SET state = ?, intent_version = intent_version + 1 WHERE id = ?",
            )
            .bind(state.as_str())
            .bind(id.0)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed == 0 {
                return Ok(None);
            }
            let (version, generation): (u64, u64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT intent_version, generation FROM {REGISTRY} WHERE id = ?"
            )))
            .bind(id.0)
            .fetch_one(&mut *tx)
            .await?;
            commit(tx).await?;
            Ok(Some(Intent {
                state,
                version,
                generation,
            }))
        })
        .await
    }

    async fn bump_generation(&self, id: ActivityId, from: u64) -> PortResult<Option<Intent>> {
        retrying("bump generation", || async {
            let mut tx = self.pool.begin().await?;
            // Planted: the UPDATE without its condition (a late bump moves the generation past
            // the gates a successor reopened).
            let unfenced = planted(Bug::UnfencedBump);
            let condition = if unfenced { "" } else { " AND generation = ?" };
            let bump = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE activity_generation SET generation = generation + 1 WHERE activity_id = ?{condition}"
            )))
            .bind(id.0);
            let bumped = if unfenced { bump } else { bump.bind(from) }
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            let sql = format!("SELECT {ACTIVITY_COLUMNS} FROM {REGISTRY} WHERE id = ?");
            let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id.0)
                .fetch_optional(&mut *tx)
                .await?
            else {
                return Err(TxError::Refused(PortError::determinate(
                    "bump generation",
                    format!("activity {id} is not installed"),
                )));
            };
            commit(tx).await?;
            let intent = registered_of_row(&row).map_err(TxError::Refused)?.intent;
            Ok(bumped.then_some(intent))
        })
        .await
    }

    async fn transfer(&self, activity: ActivityId, t: &Transfer) -> PortResult<bool> {
        retrying("transfer", || self.transfer_once(activity, t)).await
    }

    async fn pay(&self, id: ReservationId, payment: &str) -> PortResult<PayOutcome> {
        let op = "pay";
        let id = id.to_string();
        let paid = sqlx::query(
            "UPDATE seckill_order SET status = 'paid', payment_id = ? \
             WHERE reservation_id = ? AND status = 'created'",
        )
        .bind(payment)
        .bind(&id)
        .execute(&self.pool)
        .await
        // A single autocommit statement whose reply was lost may have committed.
        .map_err(|e| PortError::indeterminate_from(op, e))?
        .rows_affected();
        if paid == 1 {
            return Ok(PayOutcome::Paid);
        }
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT status, payment_id FROM seckill_order WHERE reservation_id = ?")
                .bind(&id)
                .fetch_optional(&self.pool)
                .await
                .map_err(determinate(op))?;
        Ok(match row {
            None => PayOutcome::NotFound,
            Some((s, by)) => match parse_status(&s)? {
                OrderStatus::Paid => match by {
                    Some(other) if other != payment => PayOutcome::PaidWithOther(other),
                    _ => PayOutcome::AlreadyPaid,
                },
                other => PayOutcome::NotPayable(other),
            },
        })
    }

    async fn order(&self, id: ReservationId) -> PortResult<Option<OrderRow>> {
        let sql = format!("SELECT {ORDER_COLUMNS} FROM seckill_order WHERE reservation_id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(determinate("read order"))?;
        row.as_ref().map(order_of_row).transpose()
    }

    async fn order_of(&self, activity: ActivityId, user: UserId) -> PortResult<Option<OrderRow>> {
        // The live order when there is one, else the latest failed one.
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM seckill_order WHERE activity_id = ? AND user_id = ? \
             ORDER BY status = 'failed', id DESC LIMIT 1"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(activity.0)
            .bind(user.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(determinate("order of"))?;
        row.as_ref().map(order_of_row).transpose()
    }

    async fn reconcile_view(
        &self,
        activity: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> PortResult<ReconcileView> {
        let op = "reconcile view";
        let get = |e: sqlx::Error| PortError::determinate_from(op, e);
        let mut tx = self.consistent_read().await.map_err(determinate(op))?;
        let sold = sqlx::query(
            "SELECT bucket_no, CAST(SUM(qty) AS UNSIGNED) AS sold FROM seckill_order \
             WHERE activity_id = ? AND status IN ('created', 'paid') GROUP BY bucket_no",
        )
        .bind(activity.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(determinate(op))?;
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM seckill_order WHERE activity_id = ? AND status = 'cancelled'"
        );
        let cancelled = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(activity.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(determinate(op))?;
        let ids: Vec<ReservationId> = mentioned.iter().copied().collect();
        let (mut held, mut failed) = (BTreeSet::new(), BTreeSet::new());
        // Bounded statements: at most this many ids per IN list.
        for chunk in ids.chunks(512) {
            let (chunk, marks) = in_list(chunk.iter());
            let sql = format!(
                "SELECT reservation_id, status FROM seckill_order WHERE activity_id = ? AND reservation_id IN ({marks})"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(activity.0);
            for id in chunk {
                q = q.bind(id.to_string());
            }
            for row in q.fetch_all(&mut *tx).await.map_err(determinate(op))? {
                let id: String = row.try_get("reservation_id").map_err(get)?;
                let id = ReservationId::from_str(&id).map_err(|e| PortError::determinate(op, e))?;
                if parse_status(&row.try_get::<String, _>("status").map_err(get)?)? == OrderStatus::Failed {
                    failed.insert(id);
                }
                held.insert(id);
            }
        }
        drop(tx);
        let mut cancelled = cancelled
            .iter()
            .map(|row| order_of_row(row).map(|o| o.reservation))
            .collect::<PortResult<Vec<_>>>()?;
        cancelled.sort_by_key(|r| r.id);
        Ok(ReconcileView {
            sold: sold
                .iter()
                .map(|row| {
                    Ok((
                        BucketNo(row.try_get("bucket_no").map_err(get)?),
                        row.try_get::<u64, _>("sold").map_err(get)?,
                    ))
                })
                .collect::<PortResult<_>>()?,
            cancelled,
            held,
            failed,
        })
    }

    async fn snapshot(&self, activity: ActivityId) -> PortResult<LedgerView> {
        let op = "ledger snapshot";
        let mut tx = self.consistent_read().await.map_err(determinate(op))?;
        let buckets = sqlx::query(
            "SELECT bucket_no, initial, remaining FROM stock_bucket WHERE activity_id = ? ORDER BY bucket_no",
        )
        .bind(activity.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(determinate(op))?;
        let sql = format!("SELECT {ORDER_COLUMNS} FROM seckill_order WHERE activity_id = ? ORDER BY id");
        let orders = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(activity.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(determinate(op))?;
        let journal = sqlx::query(
            "SELECT bucket_no, kind, reference, delta FROM stock_journal WHERE activity_id = ? ORDER BY id",
        )
        .bind(activity.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(determinate(op))?;
        drop(tx);
        let get = |e: sqlx::Error| PortError::determinate_from(op, e);
        Ok(LedgerView {
            buckets: buckets
                .iter()
                .map(|row| {
                    Ok(LedgerBucket {
                        bucket: BucketNo(row.try_get("bucket_no").map_err(get)?),
                        initial: row.try_get("initial").map_err(get)?,
                        remaining: row.try_get("remaining").map_err(get)?,
                    })
                })
                .collect::<PortResult<_>>()?,
            orders: orders.iter().map(order_of_row).collect::<PortResult<_>>()?,
            journal: journal
                .iter()
                .map(|row| {
                    Ok(JournalEntry {
                        bucket: BucketNo(row.try_get("bucket_no").map_err(get)?),
                        kind: parse_kind(&row.try_get::<String, _>("kind").map_err(get)?)?,
                        reference: row.try_get("reference").map_err(get)?,
                        delta: row.try_get("delta").map_err(get)?,
                    })
                })
                .collect::<PortResult<_>>()?,
        })
    }
}

#[cfg(test)]
mod shapes {
    use super::{in_shapes, padded};

    #[test]
    fn an_in_list_is_padded_to_a_power_of_two_with_its_last_value() {
        assert_eq!(padded([1, 2, 3].iter()), [&1, &2, &3, &3]);
        assert_eq!(padded([7].iter()), [&7]);
        assert_eq!(padded((1..=5).collect::<Vec<_>>().iter()).len(), 8);
        assert!(padded(Vec::<u8>::new().iter()).is_empty());
    }

    #[test]
    fn rows_go_in_pieces_of_powers_of_two_largest_first_in_order() {
        let rows: Vec<u32> = (0..256).collect();
        let pieces: Vec<&[u32]> = in_shapes(&rows[..200]).collect();
        assert_eq!(pieces.iter().map(|p| p.len()).collect::<Vec<_>>(), [128, 64, 8]);
        assert_eq!(pieces.concat(), rows[..200]);
        assert_eq!(in_shapes(&rows).count(), 1);
        assert_eq!(in_shapes(&rows[..0]).count(), 0);
        // Every size up to a batch's maximum uses at most 9 shapes.
        let shapes: std::collections::BTreeSet<usize> = (1..=256)
            .flat_map(|n| in_shapes(&rows[..n]).map(|p| p.len()).collect::<Vec<_>>())
            .collect();
        assert_eq!(shapes.len(), 9, "{shapes:?}");
    }
}
