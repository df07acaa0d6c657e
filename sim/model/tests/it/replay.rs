//! A trace of the model, replayed against the engine. The recovery runs as production runs it —
//! `jobs::recover::recover_if_needed` over the embedded Redis (the real Lua scripts) and the
//! embedded ledger — but every store call of a runner waits for its turn: the replay lets a
//! runner make exactly the calls of the model's step (`spec`), in the trace's order, and the
//! other actors (purchases, the worker, the reconciler, the operator) call the same ports
//! directly. After every step the stores must hold what the model's state says they hold
//! (`View`): a difference is the model and the code disagreeing, and the test prints both.
//!
//! The bus is the replay's own (`ReplayBus`): the model lets a late record overtake another,
//! which a partition log would not, and the recovery asks the bus only for its lag.

use seckill_core::adapters::embedded::{
    EmbeddedBus, EmbeddedConsumer, EmbeddedLedger, EmbeddedRedis, Keyspace, RedisModel,
};
use seckill_core::adapters::script::{gate_key, Reply, Script, ScriptConn, ScriptedStockCache};
use seckill_core::domain::{
    Activity, ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId,
};
use seckill_core::jobs::recover::{recover_if_needed, Recovery as Recovered, RecoveryConfig};
use seckill_core::ports::{
    ApplyOutcome, CancelOutcome, DeadLetterPage, Intent as EngineIntent, Ledger, LedgerView, OrderBus,
    OrderRow, OrderStatus, PayOutcome, PortError, PortResult, ReconcileView, Registered, ReleaseKind,
    Released, ReserveOutcome, StockCache, Transfer, WarmFrom,
};
use seckill_model::{
    Action, Bug, FollowUp, GateState, Intent, Msg, Operator, Rid, State, Status, Step, Told,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const ACTIVITY: u64 = 7;
/// Long enough that time passing inside a step never expires a claim: only `LeaseExpires` does.
const LEASE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Store calls, and a runner's turn to make one.

#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Script {
        script: Script,
        op: String,
        bucket: Option<u32>,
        /// warmup.lua "renew" with lease 0: `Held::release`.
        lease0: bool,
    },
    RunId,
    Ledger(&'static str),
    Bus(&'static str),
}

impl Call {
    fn script(sha: &str, keys: &[String], args: &[String]) -> Call {
        let script = script_of(sha);
        // `sk:{A.b}:…` names bucket b; `sk:{A}:meta` none.
        let bucket = keys.first().and_then(|k| {
            let tag = k.split('{').nth(1)?.split('}').next()?;
            tag.split('.').nth(1)?.parse().ok()
        });
        Call::Script {
            script,
            op: args.first().cloned().unwrap_or_default(),
            bucket,
            lease0: script == Script::Warmup
                && args.first().map(String::as_str) == Some("renew")
                && args.get(2).map(String::as_str) == Some("0"),
        }
    }

    fn is(&self, script: Script, op: &str) -> bool {
        matches!(self, Call::Script { script: s, op: o, .. } if *s == script && (op.is_empty() || o == op))
    }

    fn on(&self, script: Script, op: &str, b: u8) -> bool {
        self.is(script, op) && matches!(self, Call::Script { bucket: Some(x), .. } if *x == u32::from(b))
    }

    fn renewal(&self) -> bool {
        matches!(self, Call::Script { script: Script::Warmup, op, lease0: false, .. } if op == "renew")
    }
}

/// The engine's script whose SHA1 this is.
fn script_of(sha: &str) -> Script {
    Script::ALL
        .into_iter()
        .find(|s| s.sha1() == sha)
        .expect("one of the engine's scripts")
}

struct Request {
    call: Call,
    go: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

/// A runner's calls wait here for the replay to let them through, one at a time.
#[derive(Clone)]
struct Turns(mpsc::UnboundedSender<Request>);

impl Turns {
    /// Run `op` as `call` once it is its turn, and say when it is done.
    async fn around<T>(&self, call: Call, op: impl std::future::Future<Output = T>) -> T {
        let done = self.take(call).await;
        let out = op.await;
        let _ = done.send(());
        out
    }

    /// Wait for the turn of `call`; send on the returned channel once it is done.
    async fn take(&self, call: Call) -> oneshot::Sender<()> {
        let (go, go_rx) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        self.0
            .send(Request { call, go, done })
            .expect("the replay is listening");
        if go_rx.await.is_err() {
            // The trace ended with this runner inside a step: it never gets its turn.
            std::future::pending::<()>().await;
        }
        done_tx
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: the embedded model, with what a replica missing the last write would hold.

#[derive(Clone)]
struct Tracked {
    model: Arc<RedisModel>,
    redis: EmbeddedRedis,
    /// The keyspace before the last script that changed it (the model's `State::replica`).
    replica: Arc<Mutex<Option<Keyspace>>>,
}

impl ScriptConn for Tracked {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        // Every claim and renewal moves the deadline (the model counts them as writes).
        if Script::Warmup.sha1() == sha && matches!(args.first().map(String::as_str), Some("claim" | "renew"))
        {
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let before = self.model.dump();
        let mut reply = self.redis.eval_sha(sha, keys, args).await?;
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            self.redis.script_load(script_of(sha).source()).await?;
            reply = self.redis.eval_sha(sha, keys, args).await?;
        }
        if self.model.dump() != before {
            *self.replica.lock().expect("replica") = Some(before);
        }
        Ok(reply)
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        self.redis.script_load(source).await
    }

    async fn run_id(&self) -> PortResult<String> {
        self.redis.run_id().await
    }
}

/// A runner's connection: each script call and run-id read takes its turn.
#[derive(Clone)]
struct Stepped {
    conn: Tracked,
    turns: Turns,
}

impl ScriptConn for Stepped {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        let call = Call::script(sha, keys, args);
        self.turns.around(call, self.conn.eval_sha(sha, keys, args)).await
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        self.conn.script_load(source).await
    }

    async fn run_id(&self) -> PortResult<String> {
        self.turns.around(Call::RunId, self.conn.run_id()).await
    }
}

// ---------------------------------------------------------------------------------------------
// The ledger: the embedded one; a runner's recovery calls take their turns.

#[derive(Clone)]
struct SteppedLedger {
    ledger: EmbeddedLedger,
    turns: Turns,
}

impl SteppedLedger {
    async fn turn<T>(&self, name: &'static str, call: impl std::future::Future<Output = T>) -> T {
        self.turns.around(Call::Ledger(name), call).await
    }
}

impl Ledger for SteppedLedger {
    async fn cancel_unpaid(&self, activity: ActivityId, now_ms: u64) -> PortResult<Vec<Reservation>> {
        self.ledger.cancel_unpaid(activity, now_ms).await
    }
    async fn install(&self, activity: &Activity, plan: &StockPlan) -> PortResult<bool> {
        self.ledger.install(activity, plan).await
    }
    async fn apply(&self, batch: &[Reservation]) -> PortResult<Vec<ApplyOutcome>> {
        self.turn("apply", self.ledger.apply(batch)).await
    }
    async fn pay(&self, id: ReservationId, payment: &str) -> PortResult<PayOutcome> {
        self.ledger.pay(id, payment).await
    }
    async fn order(&self, id: ReservationId) -> PortResult<Option<OrderRow>> {
        self.ledger.order(id).await
    }
    async fn cancel(&self, id: ReservationId) -> PortResult<CancelOutcome> {
        self.ledger.cancel(id).await
    }
    async fn activity(&self, id: ActivityId) -> PortResult<Option<Activity>> {
        self.ledger.activity(id).await
    }
    async fn registry(&self, id: ActivityId) -> PortResult<Option<Registered>> {
        self.turn("registry", self.ledger.registry(id)).await
    }
    async fn registered(&self) -> PortResult<Vec<Registered>> {
        self.ledger.registered().await
    }
    async fn set_intent(&self, id: ActivityId, state: ActivityState) -> PortResult<Option<EngineIntent>> {
        self.ledger.set_intent(id, state).await
    }
    async fn bump_generation(&self, id: ActivityId, from: u64) -> PortResult<Option<EngineIntent>> {
        self.turn("bump_generation", self.ledger.bump_generation(id, from))
            .await
    }
    async fn transfer(&self, activity: ActivityId, t: &Transfer) -> PortResult<bool> {
        self.ledger.transfer(activity, t).await
    }
    async fn order_of(&self, activity: ActivityId, user: UserId) -> PortResult<Option<OrderRow>> {
        self.ledger.order_of(activity, user).await
    }
    async fn snapshot(&self, activity: ActivityId) -> PortResult<LedgerView> {
        self.turn("snapshot", self.ledger.snapshot(activity)).await
    }
    async fn reconcile_view(
        &self,
        activity: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> PortResult<ReconcileView> {
        self.turn("reconcile_view", self.ledger.reconcile_view(activity, mentioned))
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// The bus: records published and not yet visible, and visible and not yet applied.

#[derive(Default)]
struct Topic {
    inflight: Vec<Reservation>,
    visible: Vec<Reservation>,
}

#[derive(Clone)]
struct ReplayBus {
    topic: Arc<Mutex<Topic>>,
    turns: Turns,
    /// Only for the trait's consumer type; the replay's worker takes records from `topic`.
    unused: EmbeddedBus,
}

impl OrderBus for ReplayBus {
    type Source = EmbeddedConsumer;

    async fn publish(&self, r: &Reservation) -> PortResult<()> {
        let publish = async { self.topic.lock().expect("topic").inflight.push(r.clone()) };
        self.turns.around(Call::Bus("publish"), publish).await;
        Ok(())
    }
    async fn publish_raw(&self, _key: &str, _payload: &[u8]) -> PortResult<()> {
        Err(PortError::determinate("publish_raw", "not used by the recovery"))
    }
    async fn lag(&self, _group: &str) -> PortResult<u64> {
        let lag = async { self.topic.lock().expect("topic").visible.len() as u64 };
        Ok(self.turns.around(Call::Bus("lag"), lag).await)
    }
    async fn dead_letters(&self, from: (u32, u64), limit: usize) -> PortResult<DeadLetterPage> {
        self.unused.dead_letters(from, limit).await
    }
    async fn purge_dead_letters(&self, before: &[(u32, u64)]) -> PortResult<u64> {
        self.unused.purge_dead_letters(before).await
    }
    async fn subscribe(&self, group: &str) -> PortResult<EmbeddedConsumer> {
        self.unused.subscribe(group).await
    }
}

// ---------------------------------------------------------------------------------------------
// What a step of the model lets a runner do.

type Is = Arc<dyn Fn(&Call) -> bool>;

/// The calls a runner's `step` may make, and the call (and how many of it) that ends the step.
/// A call outside the step ends it too, before it is let through: it is the next step's (a
/// renewal refused goes straight to `Held::release`).
struct Spec {
    allowed: Is,
    ends: Is,
    times: usize,
}

fn spec(step: Step, run: &seckill_model::Runner, last: u8, bug: Option<Bug>) -> Spec {
    let only = |f: Is| Spec {
        allowed: f.clone(),
        ends: f,
        times: 1,
    };
    let either = |allowed: Is, ends: Is, times: usize| Spec { allowed, ends, times };
    let keep = || {
        either(
            Arc::new(|c: &Call| c.renewal() || *c == Call::RunId),
            Arc::new(|c: &Call| *c == Call::RunId),
            1,
        )
    };
    let look = || {
        either(
            Arc::new(|c: &Call| *c == Call::RunId || c.is(Script::Inspect, "")),
            Arc::new(move |c: &Call| c.on(Script::Inspect, "bucket", last)),
            1,
        )
    };
    let with_run_id = |script: Script, op: &'static str| {
        either(
            Arc::new(move |c: &Call| *c == Call::RunId || c.is(script, op)),
            Arc::new(move |c: &Call| c.is(script, op)),
            1,
        )
    };
    match step {
        Step::Registry | Step::RescueRegistry | Step::Intent => {
            only(Arc::new(|c| *c == Call::Ledger("registry")))
        }
        Step::Detect | Step::Recheck => look(),
        Step::Claim => with_run_id(Script::Warmup, "claim"),
        Step::FinishUnneeded => with_run_id(Script::Warmup, "finish"),
        Step::Close(b) | Step::Steal(b) => only(Arc::new(move |c| c.on(Script::Gate, "close", b))),
        Step::Wait | Step::KeepRescued | Step::KeepRebuilt => keep(),
        Step::Drain | Step::RescueDrain => only(Arc::new(|c| *c == Call::Bus("lag"))),
        Step::Outbox => either(
            Arc::new(|c: &Call| c.is(Script::Inspect, "") || *c == Call::Ledger("reconcile_view")),
            Arc::new(|c: &Call| *c == Call::Ledger("reconcile_view")),
            1,
        ),
        Step::Adopt => either(
            Arc::new(|c: &Call| {
                c.renewal()
                    || *c == Call::RunId
                    || c.is(Script::Release, "adopt")
                    || *c == Call::Bus("publish")
            }),
            // Planted `RescueRepublished`: each adopted then published.
            match bug {
                Some(Bug::RescueRepublished) => Arc::new(|c: &Call| *c == Call::Bus("publish")),
                _ => Arc::new(|c: &Call| c.is(Script::Release, "adopt")),
            },
            run.outbox.count_ones() as usize,
        ),
        Step::RescueApply => only(Arc::new(|c| *c == Call::Ledger("apply"))),
        Step::RescueRelease => Spec {
            times: run.outbox.count_ones() as usize,
            ..only(Arc::new(|c| c.is(Script::Release, "rejected")))
        },
        Step::Bump => only(Arc::new(|c| *c == Call::Ledger("bump_generation"))),
        Step::Snapshot => only(Arc::new(|c| *c == Call::Ledger("snapshot"))),
        Step::Rebuild(b) => only(Arc::new(move |c| c.on(Script::Rebuild, "", b))),
        Step::Reopen(b) => only(Arc::new(move |c| c.on(Script::Gate, "reopen", b))),
        Step::Finish => only(Arc::new(|c| c.is(Script::Warmup, "finish"))),
        Step::Release => only(Arc::new(|c| matches!(c, Call::Script { lease0: true, .. }))),
    }
}

// ---------------------------------------------------------------------------------------------
// The world the trace runs in.

struct Runner {
    turns: Turns,
    calls: mpsc::UnboundedReceiver<Request>,
    /// A call of the next step, held back.
    pending: Option<Request>,
    task: Option<JoinHandle<PortResult<Recovered>>>,
}

/// The stores as the model sees them.
#[derive(Debug, PartialEq)]
pub struct View {
    run_id: u8,
    meta: Option<(Option<u8>, Option<u8>)>,
    buckets: Vec<BucketView>,
    registry: (Intent, u8, u8),
    remaining: Vec<u8>,
    orders: Vec<Option<Status>>,
}

#[derive(Debug, PartialEq)]
struct BucketView {
    stock: Option<u8>,
    buyers: Vec<u8>,
    open: Vec<(Rid, u8)>,
    gate: Option<(GateState, Intent, u8, u8, Option<u8>)>,
}

pub struct Replay {
    model: seckill_model::Recovery,
    state: State,
    redis: Arc<RedisModel>,
    conn: Tracked,
    cache: ScriptedStockCache<Tracked>,
    ledger: EmbeddedLedger,
    topic: Arc<Mutex<Topic>>,
    plan: StockPlan,
    users: Vec<UserId>,
    reservations: BTreeMap<Rid, Reservation>,
    runners: Vec<Runner>,
    cfg: RecoveryConfig,
    done: Vec<Action>,
}

fn rid_id(rid: Rid) -> ReservationId {
    ReservationId(0x5eed_u128 << 112 | (u128::from(rid) + 1))
}

fn fence_name(f: u8) -> String {
    format!("f{f}")
}

fn engine_intent(i: Intent) -> ActivityState {
    match i {
        Intent::Open => ActivityState::Open,
        Intent::Paused => ActivityState::Paused,
        Intent::Closed => ActivityState::Closed,
    }
}

fn model_intent(s: ActivityState) -> Intent {
    match s {
        ActivityState::Open => Intent::Open,
        ActivityState::Paused => Intent::Paused,
        ActivityState::Closed | ActivityState::Recovering => Intent::Closed,
    }
}

fn model_gate_state(s: ActivityState) -> GateState {
    match s {
        ActivityState::Open => GateState::Sells,
        ActivityState::Paused => GateState::Paused,
        ActivityState::Closed => GateState::Closed,
        ActivityState::Recovering => GateState::Recovering,
    }
}

impl Replay {
    /// A sale installed and warmed as the model's initial state has it; `bug` planted in the
    /// engine as in the model.
    pub async fn new(model: seckill_model::Recovery) -> Replay {
        seckill_core::planted::plant(
            model
                .bug
                .map(|b| seckill_core::planted::Bug::parse(b.name()).expect("the engine plants it too")),
        );
        let bound = model.bound.clone();
        let business = bound.stock.len() as u32 - 1;
        assert!(
            bound.stock[..business as usize].iter().all(|&u| u == 1) && bound.stock[business as usize] == 0
        );
        let activity = seckill_testkit::activity(ACTIVITY, u64::from(business), business, 0);
        let plan = StockPlan::new(&activity);
        // The model's users in order, each the next real one routed to its bucket.
        let mut next: BTreeMap<u8, Vec<UserId>> = BTreeMap::new();
        for &b in &bound.routes {
            let n = bound.routes.iter().filter(|&&x| x == b).count();
            next.entry(b)
                .or_insert_with(|| seckill_testkit::users_in(&plan, BucketNo(u32::from(b)), n));
        }
        let users: Vec<UserId> = bound
            .routes
            .iter()
            .map(|b| next.get_mut(b).expect("filled").remove(0))
            .collect();
        let redis = Arc::new(RedisModel::new());
        let conn = Tracked {
            model: redis.clone(),
            redis: EmbeddedRedis::from_model(redis.clone()),
            replica: Arc::new(Mutex::new(None)),
        };
        let cache = ScriptedStockCache::new(conn.clone());
        let ledger = EmbeddedLedger::new();
        ledger.install(&activity, &plan).await.expect("install");
        cache
            .warmup(&plan, &EngineIntent::FIRST, WarmFrom::Plan)
            .await
            .expect("warmup");
        *conn.replica.lock().expect("replica") = None;
        let runners = (0..bound.runners)
            .map(|_| {
                let (tx, calls) = mpsc::unbounded_channel();
                Runner {
                    turns: Turns(tx),
                    calls,
                    pending: None,
                    task: None,
                }
            })
            .collect();
        let state = model.initial();
        let replay = Replay {
            model,
            state,
            redis,
            conn,
            cache,
            ledger,
            topic: Arc::default(),
            plan,
            users,
            reservations: BTreeMap::new(),
            runners,
            cfg: RecoveryConfig {
                quiesce: Duration::from_millis(1),
                drain_timeout: Duration::from_secs(1),
                group: "replay".into(),
                lease: LEASE,
            },
            done: vec![],
        };
        replay.compare().await;
        replay
    }

    /// Take `action` in the model and in the engine, and compare.
    pub async fn step(&mut self, action: Action) {
        use stateright::Model;
        let next = self
            .model
            .next_state(&self.state, action.clone())
            .unwrap_or_else(|| panic!("the trace's step {action:?} does nothing in the model"));
        self.done.push(action.clone());
        match action.clone() {
            Action::Runner(r, step) => self.runner(r as usize, step, &next).await,
            other => self.actor(other, &next).await,
        }
        self.state = next;
        self.compare().await;
    }

    async fn actor(&mut self, action: Action, next: &State) {
        let plan = &self.plan;
        match action {
            Action::Reserve(user) => {
                let p = self.state.purchases[user as usize];
                let rid = user * self.model.bound.attempts_per_user + p.attempts;
                let outcome = self
                    .cache
                    .reserve(plan, self.users[user as usize], 1, rid_id(rid), 1_000)
                    .await
                    .expect("reserve");
                if let ReserveOutcome::Reserved(r) = outcome {
                    self.reservations.insert(rid, r);
                }
            }
            Action::Published(user) => {
                let r = self.told(user);
                self.topic.lock().expect("topic").inflight.push(r);
            }
            Action::PublishLost(_) => {}
            Action::PublishFailed(user) => {
                let r = self.told(user);
                let released = self
                    .cache
                    .release(&r, ReleaseKind::Unpublished)
                    .await
                    .expect("release");
                let model_released = !matches!(next.purchases[user as usize].told, Told::Queued(_));
                assert_eq!(
                    released != Released::Adopted,
                    model_released,
                    "unpublished release of {r:?}"
                );
            }
            Action::Visible(m) => {
                let mut topic = self.topic.lock().expect("topic");
                let at = topic
                    .inflight
                    .iter()
                    .position(|r| r.id == rid_id(m.rid) && r.generation == u64::from(m.generation))
                    .expect("the record is in flight");
                let r = topic.inflight.remove(at);
                topic.visible.push(r);
            }
            Action::Apply(m) => {
                let r = {
                    let mut topic = self.topic.lock().expect("topic");
                    let at = topic
                        .visible
                        .iter()
                        .position(|r| r.id == rid_id(m.rid) && r.generation == u64::from(m.generation))
                        .expect("the record is visible");
                    topic.visible.remove(at)
                };
                // The consumer drops every copy it applied (the model dedupes identical records).
                self.topic.lock().expect("topic").visible.retain(|k| k != &r);
                let outcome = self.ledger.apply(std::slice::from_ref(&r)).await.expect("apply");
                // The consumer's follow-up of the engine's outcome is the model's.
                let followup = match outcome.first() {
                    Some(ApplyOutcome::Created | ApplyOutcome::Redelivered) => FollowUp::Settle,
                    Some(ApplyOutcome::OutOfStock | ApplyOutcome::StaleGeneration) => FollowUp::Free,
                    Some(ApplyOutcome::DuplicateBuyer { .. }) => FollowUp::Release,
                    other => panic!("apply of {r:?} answered {other:?}"),
                };
                assert!(
                    next.followups.contains(&(m, followup)),
                    "apply of {m:?}: the engine answered {outcome:?}, the model {:?}",
                    next.followups
                );
            }
            Action::FollowUp(m, f) => {
                let r = self.record(m);
                match f {
                    FollowUp::Settle => drop(self.cache.settle(&r).await.expect("settle")),
                    FollowUp::Release => drop(
                        self.cache
                            .release(&r, ReleaseKind::Rejected)
                            .await
                            .expect("release"),
                    ),
                    FollowUp::Free => drop(self.cache.free_failed(plan, &r).await.expect("free")),
                }
            }
            Action::Republish(rid) => {
                let r = self.reservations[&rid].clone();
                assert!(self.cache.adopt(&r).await.expect("adopt"));
                self.topic.lock().expect("topic").inflight.push(r);
            }
            Action::Operator(step) => {
                let (intent, call) = match step {
                    Operator::Pausing(k) => (Intent::Paused, k),
                    Operator::Resuming(k) => (Intent::Open, k),
                    _ => unreachable!(),
                };
                let a = self.plan.activity;
                if call == 0 {
                    self.ledger
                        .set_intent(a, engine_intent(intent))
                        .await
                        .expect("set intent");
                } else {
                    // `StockCache::set_gates`, one bucket (one script) at a time.
                    let registry = self
                        .ledger
                        .registry(a)
                        .await
                        .expect("registry")
                        .expect("installed")
                        .intent;
                    let args = vec![
                        "set".to_string(),
                        registry.state.as_str().to_string(),
                        registry.version.to_string(),
                        registry.generation.to_string(),
                    ];
                    let key = gate_key(a, BucketNo(u32::from(call) - 1));
                    self.conn
                        .eval_sha(Script::Gate.sha1(), &[key], &args)
                        .await
                        .expect("gate set");
                }
            }
            Action::LeaseExpires => tokio::time::advance(LEASE + Duration::from_millis(1)).await,
            Action::RedisRestartsEmpty => {
                self.redis.flush_all();
                *self.conn.replica.lock().expect("replica") = None;
            }
            Action::RedisFailsOver => {
                let replica = self
                    .conn
                    .replica
                    .lock()
                    .expect("replica")
                    .take()
                    .expect("a replica");
                self.redis.restore(replica);
            }
            Action::Runner(..) => unreachable!(),
        }
    }

    /// The reservation a user's publish carries.
    fn told(&self, user: u8) -> Reservation {
        let Told::Publishing(rid, _) = self.state.purchases[user as usize].told else {
            panic!("user {user} is not publishing")
        };
        self.reservations[&rid].clone()
    }

    fn record(&self, m: Msg) -> Reservation {
        Reservation {
            generation: u64::from(m.generation),
            ..self.reservations[&m.rid].clone()
        }
    }

    async fn runner(&mut self, r: usize, step: Step, next: &State) {
        let run = self.state.runners[r].clone();
        let last = self.model.bound.buckets() - 1;
        if step == Step::Registry {
            let fence = fence_name(run.claims * self.model.bound.runners + r as u8);
            let turns = self.runners[r].turns.clone();
            let cache = ScriptedStockCache::new(Stepped {
                conn: self.conn.clone(),
                turns: turns.clone(),
            });
            let ledger = SteppedLedger {
                ledger: self.ledger.clone(),
                turns: turns.clone(),
            };
            let bus = ReplayBus {
                topic: self.topic.clone(),
                turns,
                unused: EmbeddedBus::new(1, 16),
            };
            let (plan, cfg) = (self.plan.clone(), self.cfg.clone());
            assert!(
                self.runners[r].task.is_none(),
                "runner {r} starts while its last pass runs"
            );
            self.runners[r].task = Some(tokio::spawn(async move {
                recover_if_needed(&cache, &ledger, &bus, &plan, &cfg, &fence).await
            }));
        }
        let Spec { allowed, ends, times } = spec(step, &run, last, self.model.bug);
        let (mut made, mut seen) = (0, 0);
        let me = &mut self.runners[r];
        loop {
            let request = match me.pending.take() {
                Some(q) => q,
                None => {
                    let task = me.task.as_mut().expect("a pass is running");
                    tokio::select! {
                        biased;
                        Some(q) = me.calls.recv() => q,
                        ended = task => {
                            me.task = None;
                            let ended = ended.expect("the pass did not panic");
                            assert!(made > 0 || times == 0, "runner {r}'s pass ended ({ended:?}) before {step:?} made a call");
                            break;
                        }
                    }
                }
            };
            if !allowed(&request.call) {
                assert!(
                    made > 0,
                    "runner {r} at {step:?} made {:?}, not a call of that step",
                    request.call
                );
                me.pending = Some(request);
                break;
            }
            let Request { call, go, done } = request;
            if std::env::var_os("REPLAY_DEBUG").is_some() {
                eprintln!("runner {r} {step:?}: {call:?}");
            }
            go.send(()).expect("the runner waits");
            done.await.expect("the call finished");
            made += 1;
            if ends(&call) {
                seen += 1;
                if seen == times {
                    break;
                }
            }
        }
        // Back to idle in the model: the pass must end here, with no call left to make.
        if next.runners[r].step == Step::Registry {
            assert!(
                me.pending.is_none(),
                "runner {r} went on to {:?} where the model's pass ended",
                me.pending.as_ref().map(|q| &q.call)
            );
            if let Some(task) = me.task.take() {
                tokio::select! {
                    biased;
                    Some(q) = me.calls.recv() => panic!("runner {r} went on to {:?} where the model's pass ended after {step:?}", q.call),
                    ended = task => { ended.expect("the pass did not panic").ok(); }
                }
            }
        }
    }

    /// The model's state as a `View`.
    fn expected(&self) -> View {
        let s = &self.state;
        View {
            run_id: s.redis.run_id,
            meta: s.redis.meta.as_ref().map(|m| (m.claim, m.epoch)),
            buckets: s
                .redis
                .buckets
                .iter()
                .map(|b| BucketView {
                    stock: b.stock,
                    buyers: (0..self.model.bound.users())
                        .filter(|u| b.buyers & (1 << u) != 0)
                        .collect(),
                    open: b.resv.iter().map(|e| (e.rid, e.generation)).collect(),
                    gate: b
                        .gate
                        .as_ref()
                        .map(|g| (g.state, g.intent, g.version, g.generation, g.fence)),
                })
                .collect(),
            registry: (s.ledger.intent, s.ledger.version, s.ledger.generation),
            remaining: s.ledger.remaining.clone(),
            orders: s
                .ledger
                .orders
                .iter()
                .map(|o| o.as_ref().map(|o| o.status))
                .collect(),
        }
    }

    /// The engine's stores as a `View`.
    async fn actual(&self) -> View {
        let small = |n: u64| u8::try_from(n).expect("small numbers");
        let fence = |f: &str| {
            f.strip_prefix('f')
                .and_then(|n| n.parse().ok())
                .expect("a replay fence")
        };
        let run_id = |id: &str| small(u64::from_str_radix(id, 16).expect("hex run id"));
        let rid_of = |id: ReservationId| (id.0 & 0xff) as u8 - 1;
        let user_of = |u: UserId| self.users.iter().position(|x| *x == u).expect("a replay user") as u8;
        let view = self.cache.snapshot(&self.plan).await.expect("snapshot");
        let registry = self
            .ledger
            .registry(self.plan.activity)
            .await
            .expect("registry")
            .expect("installed")
            .intent;
        let db = self
            .ledger
            .snapshot(self.plan.activity)
            .await
            .expect("ledger snapshot");
        let mut orders = vec![None; self.state.ledger.orders.len()];
        for o in &db.orders {
            orders[rid_of(o.reservation.id) as usize] = Some(match o.status {
                OrderStatus::Failed => Status::Failed,
                _ => Status::Created,
            });
        }
        let mut remaining: Vec<_> = db.buckets.iter().map(|b| (b.bucket, b.remaining)).collect();
        remaining.sort();
        View {
            run_id: run_id(&self.conn.run_id().await.expect("run id")),
            meta: view
                .meta
                .map(|m| (m.claim.as_deref().map(fence), m.epoch.as_deref().map(run_id))),
            buckets: view
                .buckets
                .iter()
                .map(|b| {
                    let mut buyers: Vec<u8> = b.buyers.iter().map(|u| user_of(*u)).collect();
                    buyers.sort();
                    BucketView {
                        stock: b.stock.map(|s| small(s as u64)),
                        buyers,
                        open: b
                            .open
                            .iter()
                            .map(|r| (rid_of(r.id), small(r.generation)))
                            .collect(),
                        gate: b.gate.as_ref().map(|g| {
                            (
                                model_gate_state(g.state),
                                model_intent(g.intent),
                                // The planted reopen's version over everything (the model's 200).
                                small(g.version.min(200)),
                                small(g.generation),
                                g.fence.as_deref().filter(|f| !f.is_empty()).map(fence),
                            )
                        }),
                    }
                })
                .collect(),
            registry: (
                model_intent(registry.state),
                small(registry.version),
                small(registry.generation),
            ),
            remaining: remaining.into_iter().map(|(_, r)| small(r as u64)).collect(),
            orders,
        }
    }

    async fn compare(&self) {
        let (expected, actual) = (self.expected(), self.actual().await);
        if expected != actual {
            panic!(
                "the engine and the model disagree after {} steps:\n  {}\nmodel:  {expected:?}\nengine: {actual:?}",
                self.done.len(),
                self.done.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join("\n  ")
            );
        }
    }
}

/// Replay `trace` from the model's initial state; returns the model's final state.
pub async fn replay(model: seckill_model::Recovery, trace: &[Action]) -> State {
    let mut world = Replay::new(model).await;
    for action in trace {
        world.step(action.clone()).await;
    }
    seckill_core::planted::plant(None);
    for runner in &world.runners {
        if let Some(task) = &runner.task {
            task.abort();
        }
    }
    world.state
}

// ---------------------------------------------------------------------------------------------

use seckill_model::Bound;
use stateright::{Checker, HasDiscoveries, Model};

/// A seeded walk through the model (every step one of the possible actions).
fn walk(model: &seckill_model::Recovery, seed: u64, len: usize) -> Vec<Action> {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut state = model.initial();
    let mut trace = vec![];
    for _ in 0..len {
        let mut actions = vec![];
        model.actions(&state, &mut actions);
        let possible: Vec<(Action, State)> = actions
            .into_iter()
            .filter_map(|a| model.next_state(&state, a.clone()).map(|s| (a, s)))
            .collect();
        if possible.is_empty() {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let (a, s) = possible[(rng % possible.len() as u64) as usize].clone();
        trace.push(a);
        state = s;
    }
    trace
}

#[tokio::test(start_paused = true)]
async fn walks_through_the_model_replay_against_the_engine() {
    for seed in 0..300 {
        let model = seckill_model::Recovery::new(Bound::ci(), None);
        let trace = walk(&model, seed, 120);
        replay(model, &trace).await;
    }
}

/// A planted bug's shortest counterexample, replayed with the same bug planted in the engine:
/// the engine goes through the same states into the same violation.
async fn planted_trace_replays(bug: Bug, bound: Bound) {
    let model = seckill_model::Recovery::new(bound.clone(), Some(bug));
    let properties = seckill_model::checked_properties(&model);
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let (name, path) = properties
        .iter()
        .find_map(|p| checker.discovery(p).map(|path| (*p, path)))
        .unwrap_or_else(|| panic!("planted {}: the checker found nothing", bug.name()));
    let trace = path.into_actions();
    println!(
        "planted {}: breaks \"{name}\" in {} steps:",
        bug.name(),
        trace.len()
    );
    for action in &trace {
        println!("    {action:?}");
    }
    let end = replay(seckill_model::Recovery::new(bound.clone(), Some(bug)), &trace).await;
    let model = seckill_model::Recovery::new(bound, Some(bug));
    let broken = model
        .properties()
        .into_iter()
        .find(|p| p.name == name)
        .expect("a property");
    assert!(
        !(broken.condition)(&model, &end),
        "the replayed end state breaks {name}"
    );
}

/// The planted bugs' bound: one bucket of stock (and the fallback), both users in it, a Redis
/// loss — the bugs need no more, and the search stops at the first property broken.
fn planted(expiries: u8, operator: bool) -> Bound {
    let (stock, routes) = Bound::plan(1, 2);
    Bound {
        stock,
        routes,
        expiries,
        operator,
        ..Bound::ci()
    }
}

#[tokio::test(start_paused = true)]
async fn unfenced_bump_replays() {
    planted_trace_replays(Bug::UnfencedBump, planted(1, false)).await;
}

#[tokio::test(start_paused = true)]
async fn no_generation_check_replays() {
    planted_trace_replays(Bug::NoGenerationCheck, planted(0, false)).await;
}

#[tokio::test(start_paused = true)]
async fn recovery_without_fence_replays() {
    planted_trace_replays(Bug::RecoveryWithoutFence, planted(0, false)).await;
}

#[tokio::test(start_paused = true)]
async fn rebuild_while_in_flight_replays() {
    planted_trace_replays(Bug::RebuildWhileInFlight, planted(0, false)).await;
}

#[tokio::test(start_paused = true)]
async fn reopen_over_pause_replays() {
    planted_trace_replays(Bug::ReopenOverPause, planted(0, true)).await;
}

#[tokio::test(start_paused = true)]
async fn rebuild_drops_outbox_replays() {
    planted_trace_replays(Bug::RebuildDropsOutbox, planted(0, false)).await;
}

#[tokio::test(start_paused = true)]
async fn rescue_republished_replays() {
    planted_trace_replays(Bug::RescueRepublished, planted(0, false)).await;
}

#[tokio::test(start_paused = true)]
async fn failed_order_locks_out_replays() {
    planted_trace_replays(Bug::FailedOrderLocksOut, planted(0, false)).await;
}
