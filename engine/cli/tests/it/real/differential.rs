//! Differential tests of the models (the simulation is only as good as them): one generated
//! sequence of operations runs against the embedded model and against the real store, and every
//! reply and the final state must be identical. On a divergence proptest shrinks the sequence and
//! the test prints the minimal one.
//!
//! - Redis: `StockCache` calls over a recording `ScriptConn`, so what is compared is each script
//!   call (script, keys, arguments) and its raw reply, then the activity's whole keyspace.
//! - Ledger: `Ledger` calls on `EmbeddedLedger` and MariaDB; outcomes (errors by kind: the
//!   wording differs), then buckets, orders and journal.

use super::{mysql, redis_single, unique_id};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use seckill_core::adapters::embedded::{EmbeddedLedger, EmbeddedRedis};
use seckill_core::adapters::script::{
    buyers_key, meta_key, resv_key, stock_key, xfer_key, Reply, Script, ScriptConn, ScriptedStockCache,
};
use seckill_core::domain::{
    Activity, ActivityId, ActivitySpec, ActivityState, BucketNo, Reservation, ReservationId, StockPlan,
    UserId,
};
use seckill_core::ports::{
    BucketImage, Ledger, LedgerView, PortError, PortResult, ReleaseKind, StockCache, Transfer,
};
use seckill_stores::redis::RedisConn;
use seckill_testkit::{activity, intent};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Run `cases` generated sequences through `check`; on failure, panic with the minimal one.
fn differential<S: Strategy>(cases: u32, strategy: S, check: impl Fn(S::Value) -> Result<(), String>)
where
    S::Value: Debug,
{
    // SECKILL_DIFF_CASES runs more (a nightly or a hunt), never fewer.
    let cases = std::env::var("SECKILL_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        .max(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    match runner.run(&strategy, |ops| check(ops).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(reason, minimal)) => {
            panic!("the model and the real store diverge: {reason}\nminimal sequence: {minimal:#?}")
        }
        Err(e) => panic!("{e}"),
    }
}

/// An outcome as compared: the value, or only the kind of error.
fn outcome<T: Debug>(r: &PortResult<T>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(PortError::Determinate { op, .. }) => format!("Determinate({op})"),
        Err(PortError::Indeterminate { op, .. }) => format!("Indeterminate({op})"),
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// Records every script call and its reply; answers `run_id` with a fixed value so that both
/// sides write the same epoch.
#[derive(Clone)]
struct Recording<C> {
    inner: C,
    log: Arc<Mutex<Vec<String>>>,
}

impl<C: ScriptConn> ScriptConn for Recording<C> {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        let reply = self.inner.eval_sha(sha, keys, args).await;
        let script = Script::ALL
            .iter()
            .find(|s| s.sha1() == sha)
            .map_or("?".into(), |s| format!("{s:?}"));
        self.log
            .lock()
            .unwrap()
            .push(format!("{script} {keys:?} {args:?} -> {reply:?}"));
        reply
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        self.inner.script_load(source).await
    }

    async fn run_id(&self) -> PortResult<String> {
        Ok("differential".into())
    }
}

#[derive(Debug, Clone)]
enum CacheOp {
    Warmup,
    Reserve {
        user: u64,
        qty: u32,
    },
    /// Release the `nth` reservation made so far (modulo their number).
    Release {
        nth: usize,
        kind: u8,
    },
    Settle {
        nth: usize,
    },
    Holds {
        user: u64,
    },
    /// Resolve the pending mark of the attempt made `back` ops ago (its id; maybe not the
    /// user's, maybe not pending).
    ResolvePending {
        user: u64,
        keep: bool,
        back: usize,
    },
    GiveUpPending {
        user: u64,
        back: usize,
    },
    SetGates {
        state: u8,
        version: u64,
    },
    CloseGates {
        fence: u8,
        generation: u64,
    },
    Reopen {
        bucket: u32,
        fence: u8,
        version: u64,
    },
    Finish {
        fence: u8,
    },
    Adopt {
        nth: usize,
    },
    Take {
        id: u8,
        from: u32,
        to: u32,
        units: u64,
    },
    Give {
        id: u8,
        from: u32,
        to: u32,
        units: u64,
    },
    Ack {
        id: u8,
        from: u32,
        to: u32,
        units: u64,
    },
    NoteMoves,
    Rebuild {
        bucket: u32,
        fence: u8,
        stock: u64,
        buyer: u64,
    },
    Snapshot,
}

fn cache_op() -> impl Strategy<Value = CacheOp> {
    let transfer = || (0u8..3, 0u32..4, 0u32..4, 1u64..4);
    prop_oneof![
        1 => Just(CacheOp::Warmup),
        8 => (1u64..=14, 1u32..=2).prop_map(|(user, qty)| CacheOp::Reserve { user, qty }),
        3 => (any::<usize>(), 0u8..3).prop_map(|(nth, kind)| CacheOp::Release { nth, kind }),
        3 => any::<usize>().prop_map(|nth| CacheOp::Settle { nth }),
        1 => (1u64..=14).prop_map(|user| CacheOp::Holds { user }),
        2 => (1u64..=14, any::<bool>(), 0usize..4).prop_map(|(user, keep, back)| CacheOp::ResolvePending { user, keep, back }),
        1 => (1u64..=14, 0usize..4).prop_map(|(user, back)| CacheOp::GiveUpPending { user, back }),
        1 => (0u8..3, 0u64..4).prop_map(|(state, version)| CacheOp::SetGates { state, version }),
        1 => (0u8..2, 0u64..5).prop_map(|(fence, generation)| CacheOp::CloseGates { fence, generation }),
        1 => (0u32..4, 0u8..2, 0u64..4).prop_map(|(bucket, fence, version)| CacheOp::Reopen { bucket, fence, version }),
        1 => (0u8..2).prop_map(|fence| CacheOp::Finish { fence }),
        1 => any::<usize>().prop_map(|nth| CacheOp::Adopt { nth }),
        2 => transfer().prop_map(|(id, from, to, units)| CacheOp::Take { id, from, to, units }),
        2 => transfer().prop_map(|(id, from, to, units)| CacheOp::Give { id, from, to, units }),
        1 => transfer().prop_map(|(id, from, to, units)| CacheOp::Ack { id, from, to, units }),
        1 => Just(CacheOp::NoteMoves),
        1 => (0u32..4, 0u8..2, 0u64..5, 1u64..=14)
            .prop_map(|(bucket, fence, stock, buyer)| CacheOp::Rebuild { bucket, fence, stock, buyer }),
        1 => Just(CacheOp::Snapshot),
    ]
}

/// Run `ops` on `cache` for `plan`; the outcomes, one per op.
async fn run_cache_ops<C: ScriptConn>(
    cache: &ScriptedStockCache<C>,
    plan: &StockPlan,
    ops: &[CacheOp],
) -> Vec<String> {
    let mut reserved: Vec<Reservation> = Vec::new();
    let mut out = Vec::new();
    let transfer = |id: u8, from: u32, to: u32, units: u64| Transfer {
        id: format!("t{id}"),
        from: BucketNo(from),
        to: BucketNo(to),
        units,
        generation: 0,
    };
    for (i, op) in ops.iter().enumerate() {
        let line = match op {
            CacheOp::Warmup => outcome(
                &cache
                    .warmup(
                        plan,
                        &seckill_core::ports::Intent::FIRST,
                        seckill_core::ports::WarmFrom::Plan,
                    )
                    .await,
            ),
            CacheOp::Reserve { user, qty } => {
                let r = cache
                    .reserve(
                        plan,
                        UserId(*user),
                        *qty,
                        ReservationId(i as u128 + 1),
                        1_000 + i as u64,
                    )
                    .await;
                if let Ok(seckill_core::ports::ReserveOutcome::Reserved(res)) = &r {
                    reserved.push(res.clone());
                }
                outcome(&r)
            }
            CacheOp::Release { nth, kind } if !reserved.is_empty() => {
                let kind = [
                    ReleaseKind::Unpublished,
                    ReleaseKind::Rejected,
                    ReleaseKind::Cancelled,
                ][*kind as usize];
                outcome(&cache.release(&reserved[nth % reserved.len()], kind).await)
            }
            CacheOp::Settle { nth } if !reserved.is_empty() => {
                outcome(&cache.settle(&reserved[nth % reserved.len()]).await)
            }
            CacheOp::Release { .. } | CacheOp::Settle { .. } => "no reservation yet".into(),
            CacheOp::Holds { user } => outcome(&cache.holds(plan, UserId(*user)).await),
            CacheOp::ResolvePending { user, keep, back } => {
                let attempt = ReservationId(i.saturating_sub(*back) as u128 + 1);
                outcome(&cache.resolve_pending(plan, UserId(*user), attempt, *keep).await)
            }
            CacheOp::GiveUpPending { user, back } => {
                let attempt = ReservationId(i.saturating_sub(*back) as u128 + 1);
                outcome(&cache.give_up_pending(plan, UserId(*user), attempt).await)
            }
            CacheOp::SetGates { state, version } => {
                let state =
                    [ActivityState::Open, ActivityState::Paused, ActivityState::Closed][*state as usize];
                outcome(&cache.set_gates(plan, &intent(state, *version, 0)).await)
            }
            CacheOp::CloseGates { fence, generation } => {
                outcome(&cache.close_gates(plan, &format!("f{fence}"), *generation).await)
            }
            CacheOp::Reopen {
                bucket,
                fence,
                version,
            } => outcome(
                &cache
                    .reopen(
                        plan,
                        BucketNo(*bucket),
                        &format!("f{fence}"),
                        &intent(ActivityState::Open, *version, 3),
                    )
                    .await,
            ),
            CacheOp::Finish { fence } => {
                outcome(&cache.finish(plan, &format!("f{fence}"), "differential").await)
            }
            CacheOp::Adopt { nth } if !reserved.is_empty() => {
                outcome(&cache.adopt(&reserved[nth % reserved.len()]).await)
            }
            CacheOp::Adopt { .. } => "no reservation yet".into(),
            CacheOp::Take { id, from, to, units } => {
                outcome(&cache.take(plan, &transfer(*id, *from, *to, *units)).await)
            }
            CacheOp::Give { id, from, to, units } => {
                outcome(&cache.give(plan, &transfer(*id, *from, *to, *units)).await)
            }
            CacheOp::Ack { id, from, to, units } => {
                outcome(&cache.ack(plan, &transfer(*id, *from, *to, *units)).await)
            }
            CacheOp::NoteMoves => outcome(&cache.note_moves(plan.activity).await),
            CacheOp::Rebuild {
                bucket,
                fence,
                stock,
                buyer,
            } => {
                let image = BucketImage {
                    stock: *stock,
                    buyers: vec![UserId(*buyer)],
                    held: reserved.iter().map(|r| r.id).collect(),
                    ..BucketImage::default()
                };
                outcome(
                    &cache
                        .rebuild(plan, BucketNo(*bucket), &format!("f{fence}"), &image)
                        .await,
                )
            }
            CacheOp::Snapshot => outcome(&cache.snapshot(plan).await),
        };
        out.push(format!("{op:?} -> {line}"));
    }
    out
}

/// Every key of the activity, read back with plain commands and normalized (sets and hashes
/// sorted).
async fn keyspace(
    plan: &StockPlan,
    mut cmd: impl AsyncFnMut(Vec<String>) -> Reply,
) -> BTreeMap<String, String> {
    let mut keys = vec![meta_key(plan.activity)];
    for b in plan.all_buckets() {
        let a = plan.activity;
        keys.extend([stock_key(a, b), buyers_key(a, b), resv_key(a, b), xfer_key(a, b)]);
    }
    let mut out = BTreeMap::new();
    for key in keys {
        let kind = match cmd(vec!["TYPE".into(), key.clone()]).await {
            Reply::Status(s) => s,
            other => format!("{other:?}"),
        };
        let value = match kind.as_str() {
            "none" => continue,
            "string" => format!("{:?}", cmd(vec!["GET".into(), key.clone()]).await),
            "set" => format!("{:?}", sorted(cmd(vec!["SMEMBERS".into(), key.clone()]).await, 1)),
            "hash" => format!("{:?}", sorted(cmd(vec!["HGETALL".into(), key.clone()]).await, 2)),
            other => format!("unexpected type {other}"),
        };
        out.insert(key, format!("{kind} {value}"));
    }
    out
}

/// The items of an array reply, grouped `n` at a time, sorted.
fn sorted(reply: Reply, n: usize) -> Vec<Vec<Reply>> {
    let Reply::Array(items) = reply else {
        return vec![vec![reply]];
    };
    let mut groups: Vec<Vec<Reply>> = items.chunks(n).map(|c| c.to_vec()).collect();
    groups.sort_by_key(|g| format!("{g:?}"));
    groups
}

#[test]
fn redis_model_matches_real_redis() {
    let rt = runtime();
    let Some(real) = rt.block_on(redis_single()) else {
        return;
    };
    let real_conn: RedisConn = real.conn().clone();
    differential(128, proptest::collection::vec(cache_op(), 1..40), |ops| {
        rt.block_on(async {
            // A fresh activity per case: the same id on both sides, new to the real server.
            let plan = StockPlan::new(&activity(unique_id(), 12, 3, 20));
            let model = EmbeddedRedis::new();
            let model_log = Arc::new(Mutex::new(Vec::new()));
            let real_log = Arc::new(Mutex::new(Vec::new()));
            let on_model = ScriptedStockCache::new(Recording {
                inner: model.clone(),
                log: model_log.clone(),
            });
            let on_real = ScriptedStockCache::new(Recording {
                inner: real_conn.clone(),
                log: real_log.clone(),
            });
            for s in Script::ALL {
                model.script_load(s.source()).await.unwrap();
                real_conn.script_load(s.source()).await.unwrap();
            }
            let model_out = run_cache_ops(&on_model, &plan, &ops).await;
            let real_out = run_cache_ops(&on_real, &plan, &ops).await;
            let (model_calls, real_calls) = (
                model_log.lock().unwrap().clone(),
                real_log.lock().unwrap().clone(),
            );
            for (i, (m, r)) in model_calls.iter().zip(&real_calls).enumerate() {
                if m != r {
                    return Err(format!("script call {i}:\n  model: {m}\n  redis: {r}"));
                }
            }
            if model_calls.len() != real_calls.len() || model_out != real_out {
                return Err(format!(
                    "outcomes differ:\n  model: {model_out:#?}\n  redis: {real_out:#?}"
                ));
            }
            let model_keys = keyspace(&plan, async |argv: Vec<String>| {
                model.command(&argv.iter().map(|a| a.as_bytes().to_vec()).collect::<Vec<_>>())
            })
            .await;
            let real_keys = keyspace(&plan, async |argv: Vec<String>| {
                let mut cmd = redis::cmd(&argv[0]);
                cmd.arg(&argv[1..]);
                real_conn.query("read", &cmd).await.expect("read the keyspace")
            })
            .await;
            if model_keys != real_keys {
                return Err(format!(
                    "final keyspaces differ:\n  model: {model_keys:#?}\n  redis: {real_keys:#?}"
                ));
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Ledger

#[derive(Debug, Clone)]
enum LedgerOp {
    /// One batch: (reservation number, user, bucket, qty, reserved at); bucket 4 does not exist.
    Apply(Vec<(u8, u64, u32, u32, u64)>),
    Pay {
        rid: u8,
    },
    Cancel {
        rid: u8,
    },
    CancelUnpaid {
        now_ms: u64,
    },
    Transfer {
        id: u8,
        from: u32,
        to: u32,
        units: u64,
    },
    OrderOf {
        user: u64,
    },
}

fn ledger_op() -> impl Strategy<Value = LedgerOp> {
    let event = (0u8..12, 1u64..=6, 0u32..5, 1u32..=2, 0u64..100);
    prop_oneof![
        6 => proptest::collection::vec(event, 1..5).prop_map(LedgerOp::Apply),
        2 => (0u8..12).prop_map(|rid| LedgerOp::Pay { rid }),
        1 => (0u8..12).prop_map(|rid| LedgerOp::Cancel { rid }),
        1 => (0u64..250).prop_map(|now_ms| LedgerOp::CancelUnpaid { now_ms }),
        2 => (0u8..3, 0u32..5, 0u32..5, 1u64..4).prop_map(|(id, from, to, units)| LedgerOp::Transfer { id, from, to, units }),
        1 => (1u64..=6).prop_map(|user| LedgerOp::OrderOf { user }),
    ]
}

/// Reservation ids are unique across the whole ledger, so each activity gets its own.
fn rid_of(a: ActivityId, n: u8) -> ReservationId {
    ReservationId((a.0 as u128) << 8 | n as u128)
}

async fn run_ledger_ops<L: Ledger>(ledger: &L, a: &Activity, ops: &[LedgerOp]) -> Vec<String> {
    let id = a.id();
    let mut out = vec![outcome(&ledger.install(a, &StockPlan::new(a)).await)];
    out.push(outcome(&ledger.activity(id).await));
    for op in ops {
        let line = match op {
            LedgerOp::Apply(events) => {
                let batch: Vec<Reservation> = events
                    .iter()
                    .map(|&(rid, user, bucket, qty, at)| Reservation {
                        id: rid_of(id, rid),
                        activity: id,
                        user: UserId(user),
                        bucket: BucketNo(bucket),
                        qty,
                        reserved_at_ms: at,
                        generation: 0,
                    })
                    .collect();
                outcome(&ledger.apply(&batch).await)
            }
            LedgerOp::Pay { rid } => outcome(&ledger.pay(rid_of(id, *rid), "p-1").await),
            LedgerOp::Cancel { rid } => outcome(&ledger.cancel(rid_of(id, *rid)).await),
            LedgerOp::CancelUnpaid { now_ms } => {
                outcome(&ledger.cancel_unpaid(id, *now_ms).await.map(|mut v| {
                    v.sort_by_key(|r| r.id);
                    v
                }))
            }
            LedgerOp::Transfer {
                id: t,
                from,
                to,
                units,
            } => {
                let t = Transfer {
                    id: format!("t{t}"),
                    from: BucketNo(*from),
                    to: BucketNo(*to),
                    units: *units,
                    generation: 0,
                };
                outcome(&ledger.transfer(id, &t).await)
            }
            LedgerOp::OrderOf { user } => outcome(&ledger.order_of(id, UserId(*user)).await),
        };
        out.push(format!("{op:?} -> {line}"));
    }
    out
}

/// The ledger's state in a comparable order (the journal's row order within one transaction is
/// an implementation detail; its contents are not).
fn normalized(mut v: LedgerView) -> LedgerView {
    v.orders.sort_by_key(|o| o.reservation.id);
    v.journal
        .sort_by_key(|j| (j.bucket, format!("{:?}", j.kind), j.reference.clone(), j.delta));
    v
}

#[test]
fn ledger_model_matches_mariadb() {
    let rt = runtime();
    let Some(real) = rt.block_on(mysql()) else { return };
    differential(128, proptest::collection::vec(ledger_op(), 1..25), |ops| {
        rt.block_on(async {
            let a = Activity::new(ActivitySpec {
                id: ActivityId(unique_id()),
                total_stock: 10,
                buckets: 3,
                fallback_pct: 20,
                per_user_limit: 1,
                start_ms: 0,
                end_ms: 1_000_000,
                pay_timeout_ms: 50,
                unit_price_minor: 0,
            })
            .unwrap();
            let model = EmbeddedLedger::new();
            let model_out = run_ledger_ops(&model, &a, &ops).await;
            let real_out = run_ledger_ops(&real, &a, &ops).await;
            if model_out != real_out {
                let first = model_out
                    .iter()
                    .zip(&real_out)
                    .position(|(m, r)| m != r)
                    .unwrap_or(0);
                return Err(format!(
                    "outcome {first} differs:\n  model:   {}\n  mariadb: {}",
                    model_out[first], real_out[first]
                ));
            }
            let m = normalized(model.snapshot(a.id()).await.unwrap());
            let r = normalized(real.snapshot(a.id()).await.unwrap());
            if m != r {
                return Err(format!(
                    "final ledgers differ:\n  model:   {m:?}\n  mariadb: {r:?}"
                ));
            }
            Ok(())
        })
    });
}
