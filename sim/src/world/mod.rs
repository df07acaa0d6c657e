//! One simulated run: the phase runner (`world`), the world's nodes, and the report.
//!
//! Phases: warmup → sale under faults → heal → settle → final checks. Safety (S1–S4) is checked
//! every few simulated milliseconds during the sale and settle; R1 and liveness only at the end,
//! and only in scenarios whose faults the engine can recover from without the reconciler (the
//! report lists which checks were active). Everything random comes from madsim's seeded RNG, so
//! a seed replays the run exactly.
//!
//! The parts, each a module of its own:
//! - `scenario`: the scenarios, sizes and a run's configuration (and the replay command);
//! - `fault`: the fault catalogue and which faults each scenario draws;
//! - `workload`: the waves of buyers and the clients that record what they were told;
//! - `nemesis`: injecting faults (drawn or from a schedule) and healing them; `operator`: the
//!   operator's admin calls;
//! - `oracles`: the god view and every check, continuous and final; `settle`: quiescence;
//! - `coverage`: the states a sweep must have seen; `shrink`: minimising a failing schedule.

mod coverage;
mod fault;
mod nemesis;
mod operator;
mod oracles;
mod scenario;
mod settle;
mod shrink;
mod workload;

use oracles::GodView;
use scenario::activity;
use workload::Wave;

pub use coverage::{Target, COVERAGE_TARGETS};
pub use fault::Fault;
pub use scenario::{parse_schedule, schedule_text, Checks, Scenario, Scheduled, SimConfig, Size};
pub use shrink::{shrink, Shrunk};

use crate::faults::Faults;
use crate::nodes::{consumer_main, engine_main, EngineParams, Timings};
use crate::rpc::engine_addr;
use crate::stores::{serve_kafka, serve_ledger, serve_redis, KafkaLog, LedgerLog, Persistence, RedisStore};
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::{Handle, NodeHandle};
use rand::SeedableRng;
use seckill_core::adapters::embedded::{EmbeddedLedger, EmbeddedRedis};
use seckill_core::adapters::script::ScriptedStockCache;
use seckill_core::domain::{ActivityId, StockPlan, UserId};
use seckill_core::planted::{self, Site};
use seckill_core::ports::{Ledger, OrderStatus, StockCache};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const ACTIVITY: ActivityId = ActivityId(1);
const PARTITIONS: u32 = 4;
/// Job runners racing over the activity (each runs recovery, reconciler, payment timeout and
/// rebalancer), as production runs several.
const JOBS_NODES: usize = 2;
/// How often the checker looks during the sale and settle (simulated time).
const CHECK_EVERY: Duration = Duration::from_millis(25);
/// Settle gives up after this long (simulated), not counting the time a process sleeps at a
/// long fault point or an API node is held paused until a bump: then the bus never drained.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// The recovery's long fault points other than the one before its bump (see `world`), one of
/// which is armed with `Site::RecoveryBump` per run.
const RECOVERY_LATE_SITES: [Site; 4] = [
    Site::RecoveryClose,
    Site::RecoveryRebuild,
    Site::RecoveryReopen,
    Site::RecoveryFinish,
];
/// Every long fault point of the recovery, as a mask of sites.
const RECOVERY_LONG_SITES: u64 = {
    let (mut mask, mut i) = (Site::RecoveryBump.bit(), 0);
    while i < RECOVERY_LATE_SITES.len() {
        mask |= RECOVERY_LATE_SITES[i].bit();
        i += 1;
    }
    mask
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Safety,
    Liveness,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub config: SimConfig,
    /// The configured timings this seed drew.
    pub timings: Timings,
    pub checks: Checks,
    pub verdict: Verdict,
    pub violations: Vec<String>,
    /// Simulated time of the first violation.
    pub violated_at_ms: Option<u64>,
    pub faults: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    pub queued: u64,
    pub units_sold: u64,
    pub sim_ms: u64,
    /// The faults the nemesis injected.
    pub schedule: Vec<Scheduled>,
    /// The interesting states that happened, and how often (`Faults::cover`).
    pub coverage: BTreeMap<String, u64>,
    pub trace: Vec<String>,
}

/// What clients were told: the history S4 and L1 are checked against.
#[derive(Default)]
struct History {
    queued: Vec<String>,
    /// Whose each queued reservation is, and when its client heard "queued".
    queued_users: BTreeMap<String, UserId>,
    queued_at: BTreeMap<String, Duration>,
    /// When the request that got each "queued" answer was sent.
    queued_sent_at: BTreeMap<String, Duration>,
    confirmed: Vec<String>,
    outcomes: BTreeMap<String, u64>,
    /// Users with an answer that may hide a reservation: none at all, an error, or
    /// "unavailable" (a reserve or a release whose outcome the engine did not know).
    unsure: BTreeSet<UserId>,
}

struct Violated {
    at: Duration,
    violations: Vec<String>,
    verdict: Verdict,
}

struct World {
    cfg: SimConfig,
    timings: Timings,
    handle: Handle,
    faults: Arc<Faults>,
    redis: Arc<RedisStore>,
    kafka: Arc<KafkaLog>,
    god: GodView,
    history: Arc<Mutex<History>>,
    skews: Arc<Mutex<Vec<i64>>>,
    redis_node: NodeHandle,
    mysql_node: NodeHandle,
    kafka_node: NodeHandle,
    jobs_nodes: Vec<NodeHandle>,
    engines: Vec<NodeHandle>,
    consumers: Vec<NodeHandle>,
    /// The operator's console: the node its admin calls leave from.
    operator: NodeHandle,
    /// When pauses (or closes) returned, and their intents' versions.
    pauses: Mutex<Vec<(Duration, u64)>>,
    ledger_log: Arc<LedgerLog>,
    /// Faults that run beside the nemesis (pauses): stopped with the world.
    background: Mutex<Vec<madsim::task::JoinHandle<()>>>,
    /// The faults injected so far.
    schedule: Mutex<Vec<Scheduled>>,
    /// Recovery claims as the checker first saw them in the meta (at most `CHECK_EVERY` late).
    claims: Mutex<Vec<(Duration, String)>>,
    /// Each gate's version when the checker last looked, since the Redis restart it notes.
    gate_versions: Mutex<(Option<Duration>, BTreeMap<u32, u64>)>,
    violated: Mutex<Option<Violated>>,
    /// The wave of buyers aimed at a recovery runner's long stall (`aim_at_long_stalls`): its
    /// clients once it ran, and whether it is still waiting or running.
    stall_wave: Mutex<Vec<(NodeHandle, madsim::task::JoinHandle<()>)>>,
    stall_wave_pending: std::sync::atomic::AtomicBool,
    /// The API node `EnginePauseAcrossBump` holds paused (the heal leaves it so).
    zombie: Mutex<Option<madsim::task::NodeId>>,
    /// Operator sequences still waiting for their answer (`full_loss_restart`): the world waits
    /// for them before its final checks, so that every answer is checked.
    operator_pending: std::sync::atomic::AtomicUsize,
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("fixed simulation ips parse")
}

/// Run one seed in its own runtime. Panics (a crash of the world) propagate to the caller.
pub fn run(cfg: &SimConfig) -> RunReport {
    planted::plant(cfg.planted);
    let mut rt = madsim::runtime::Runtime::with_seed_and_config(cfg.seed, madsim::Config::default());
    rt.set_time_limit(Duration::from_secs(600));
    let cfg = cfg.clone();
    let report = rt.block_on(world(cfg));
    planted::plant(None);
    report
}

/// The world inside an existing simulation runtime.
pub async fn world(cfg: SimConfig) -> RunReport {
    // The engine's fault points stall where a paused process hurts most (between reserve and
    // publish, between a recovery's snapshot and its rebuild, between the ledger's commit and the
    // settles, between a transfer's take and give, between a release and its answer): always in
    // the scenarios about zombies, on every other seed of the others (a stream of the seed's
    // own, so a seed replays them), never in the calm one nor in the skewed one (whose L2 check
    // holds the rebalancer to selling the cold buckets' units while demand lasts), and never
    // without the jobs (what a stalled process leaves behind is the reconciler's to finish).
    let stalls = cfg.jobs
        && match cfg.scenario {
            Scenario::Calm | Scenario::Skewed => false,
            Scenario::CompetingRecoveries | Scenario::FullLossRestart => true,
            _ => rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x57a11).gen_bool(0.5),
        };
    // The long ones (far past a recovery's lease, once per run) on every other such seed: a
    // runner stalled that long leaves the recovery to another, whose later snapshot heals what
    // the stalled one would have got wrong (a stale order the ledger took shows in both).
    // Of the recovery's long fault points, the one before the bump (where a stale bump comes
    // from) and one other per run: with all of them armed, the first runner slept at the first
    // one it reached and its successor, as the heal disarmed them, at none — the rebuild's,
    // reopen's and finish's fired in none of 200 runs of four scenarios. The close's comes
    // before the bump's, so the first runner sleeps there; the rebuild's, reopen's and
    // finish's come after it, so the successor of a runner asleep before the bump sleeps there.
    // The rebalancer's after its take is armed beside them. On the other seeds, its one before
    // its take alone (a recovery between the rebalancer's look and its take: a transfer planned
    // at the old generation meets a rebuilt bucket whose gate is still recovering, or the new
    // generation's gates).
    let long = {
        let mut draw = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x10e6);
        let recovery_site = RECOVERY_LATE_SITES[draw.gen_range(0..RECOVERY_LATE_SITES.len())];
        match stalls.then(|| draw.gen_bool(0.5)) {
            Some(true) => Site::RebalanceTake.bit() | Site::RecoveryBump.bit() | recovery_site.bit(),
            Some(false) => Site::RebalanceLook.bit(),
            None => 0,
        }
    };
    planted::enable_stalls(stalls.then_some(cfg.seed ^ 0x57a11), long);
    let handle = Handle::current();
    let faults = Arc::new(Faults::new());
    if stalls {
        let sites: Vec<u32> = (0..64).filter(|s| long & 1 << s != 0).collect();
        faults.event(format!(
            "engine fault points (stalls): on, the long ones at sites {sites:?}"
        ));
    }
    let act = activity(&cfg);
    let plan = StockPlan::new(&act);
    let timings = Timings::draw(cfg.seed);
    let redis = Arc::new(RedisStore::new(Persistence::Aof, timings.aof_window()));
    let ledger = EmbeddedLedger::new();
    let kafka = Arc::new(KafkaLog::new(PARTITIONS));

    // Warmup, by the operator, before anything serves.
    let god = GodView {
        cache: ScriptedStockCache::new(EmbeddedRedis::from_model(redis.model.clone())),
        redis: redis.model.clone(),
        ledger: ledger.clone(),
        plan: plan.clone(),
    };
    god.ledger.install(&act, &plan).await.expect("install");
    god.cache
        .warmup(
            &plan,
            &seckill_core::ports::Intent::FIRST,
            seckill_core::ports::WarmFrom::Plan,
        )
        .await
        .expect("warmup");

    let node = |name: &str, addr: &str| handle.create_node().name(name).ip(ip(addr));
    let (s, f) = (redis.clone(), faults.clone());
    let redis_node = node("redis", "10.0.0.10")
        .init(move || serve_redis(s.clone(), f.clone()))
        .build();
    let ledger_log = Arc::new(LedgerLog::default());
    let (l, f, g) = (ledger.clone(), faults.clone(), ledger_log.clone());
    let mysql_node = node("mysql", "10.0.0.20")
        .init(move || serve_ledger(l.clone(), f.clone(), g.clone()))
        .build();
    let (k, f) = (kafka.clone(), faults.clone());
    let kafka_node = node("kafka", "10.0.0.30")
        .init(move || serve_kafka(k.clone(), f.clone()))
        .build();

    // Several job runners race over the same activity, as in production (DESIGN §11).
    let jobs_nodes = (0..JOBS_NODES)
        .map(|i| {
            let addr: SocketAddr = format!("10.0.4.{}:9100", i + 1).parse().expect("jobs address");
            let jobs_node = node(&format!("jobs-{i}"), &addr.ip().to_string());
            if !cfg.jobs {
                return jobs_node.build();
            }
            let f = faults.clone();
            jobs_node
                .init(move || crate::nodes::jobs_main(addr, i, timings, f.clone()))
                .build()
        })
        .collect();
    let skews = Arc::new(Mutex::new(vec![0i64; cfg.engines]));
    let engines = (0..cfg.engines)
        .map(|i| {
            let (act, skews, f) = (act.clone(), skews.clone(), faults.clone());
            let addr = engine_addr(i);
            node(&format!("engine-{i}"), &addr.ip().to_string())
                .init(move || {
                    let skew = skews.lock().expect("skews")[i];
                    engine_main(EngineParams {
                        addr,
                        activity: act.clone(),
                        wall_ms: f.wall_ms(skew),
                        timings,
                        faults: f.clone(),
                    })
                })
                .build()
        })
        .collect();
    let consumers = (0..cfg.consumers)
        .map(|i| {
            let addr: SocketAddr = format!("10.0.2.{}:9000", i + 1)
                .parse()
                .expect("consumer address");
            let (f, batch) = (faults.clone(), cfg.consumer_batch);
            node(&format!("consumer-{i}"), &addr.ip().to_string())
                .init(move || consumer_main(addr, i as u32, batch, f.clone()))
                .build()
        })
        .collect();

    let w = Arc::new(World {
        cfg: cfg.clone(),
        timings,
        handle: handle.clone(),
        faults: faults.clone(),
        redis,
        kafka,
        god,
        history: Arc::default(),
        skews,
        redis_node,
        mysql_node,
        kafka_node,
        jobs_nodes,
        engines,
        consumers,
        operator: node("operator", "10.0.5.1").build(),
        pauses: Mutex::default(),
        ledger_log,
        background: Mutex::default(),
        schedule: Mutex::default(),
        claims: Mutex::default(),
        gate_versions: Mutex::default(),
        violated: Mutex::new(None),
        stall_wave: Mutex::default(),
        stall_wave_pending: Default::default(),
        zombie: Mutex::default(),
        operator_pending: Default::default(),
    });
    faults.event(format!(
        "world up: {} engines, {} consumers, {} clients",
        cfg.engines, cfg.consumers, cfg.clients
    ));

    // Sale under faults, watched continuously.
    let mut clients = w.spawn_clients(&Wave::first(&cfg));
    let nemesis = tokio::spawn(w.clone().nemesis());
    let checker = tokio::spawn(w.clone().check_continuously());
    w.aim_at_long_stalls();
    w.wait_for(&mut clients).await;
    // The nemesis goes on a while past the last click (DESIGN §9 v2: faults through recovery and
    // settle): the world must settle from whatever the last faults leave, not from a quiet end.
    if !w.violated() {
        let overtime = Duration::from_millis(thread_rng().gen_range(0..1_500));
        w.faults.event(format!(
            "nemesis goes on {} ms past the sale",
            overtime.as_millis()
        ));
        tokio::time::sleep(overtime).await;
    }
    nemesis.abort();
    w.heal().await;
    let mut drained = if w.violated() { true } else { w.settle().await };
    // The buyers aimed at a stalled runner's window may still be clicking once it woke, and an
    // operator's warmup may still be waiting for its answer (its recovery outlasts the sale).
    let operator_was_busy = w.operator_pending.load(std::sync::atomic::Ordering::SeqCst) > 0;
    while w.stall_wave_pending.load(std::sync::atomic::Ordering::SeqCst)
        || w.operator_pending.load(std::sync::atomic::Ordering::SeqCst) > 0
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stall_wave = std::mem::take(&mut *w.stall_wave.lock().expect("stall wave"));
    if (!stall_wave.is_empty() || operator_was_busy) && drained && !w.violated() {
        drained = w.settle().await;
    }
    clients.extend(stall_wave);
    // A second wave of buyers once a recovery is behind the sale (settled: the activity open on
    // the recovery's epoch), for the units the payment timeout gave back: selling under a
    // generation a recovery bumped is otherwise never tried, the recoveries of a run finishing
    // after its clients stopped.
    if drained && !w.violated() && !w.ledger_log.bumps.lock().expect("ledger log").is_empty() {
        w.faults.event("late wave: buyers after the recovery".into());
        let db = w.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let failed = (db.orders.iter())
            .filter(|o| o.status == seckill_core::ports::OrderStatus::Failed)
            .map(|o| o.reservation.user);
        let mut late = w.spawn_clients(&Wave::late(&cfg, failed));
        w.wait_for(&mut late).await;
        clients.extend(late);
        if !w.violated() {
            drained = w.settle().await;
        }
    }
    checker.abort();
    w.final_checks(drained).await;
    let report = w.report().await;
    w.tear_down(clients.iter().map(|(node, _)| node.id())).await;
    planted::enable_stalls(None, 0);
    report
}

impl World {
    /// Every server node of the world (the clients are its callers, created per sale).
    fn nodes(&self) -> impl Iterator<Item = &NodeHandle> {
        [
            &self.redis_node,
            &self.mysql_node,
            &self.kafka_node,
            &self.operator,
        ]
        .into_iter()
        .chain(&self.jobs_nodes)
        .chain(&self.engines)
        .chain(&self.consumers)
    }

    /// Run `task` beside the nemesis (a fault that outlasts its injection): stopped with the
    /// world (`tear_down`).
    fn in_background(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let task = tokio::spawn(task);
        self.background.lock().expect("background").push(task);
    }

    /// Stop every node and let the executor drop their tasks before the runtime goes. A task
    /// still pending when a madsim runtime drops is never dropped (madsim-rs/madsim#242): the
    /// servers' loops hold the stores, and so do clients a violation stopped mid-click — each run
    /// kept megabytes alive (a 20-seed sweep peaked at 507,544 KB; now 18,804 KB).
    async fn tear_down(&self, clients: impl Iterator<Item = madsim::task::NodeId>) {
        for task in self.background.lock().expect("background").drain(..) {
            task.abort();
        }
        for id in self.nodes().map(NodeHandle::id).chain(clients) {
            self.handle.kill(id);
        }
        // One tick: the executor takes the killed tasks it was woken for and drops them.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    async fn report(&self) -> RunReport {
        let snap = self.god.snapshot().await;
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let fallback = self.god.plan.fallback_bucket();
        for o in &db.orders {
            if o.reservation.bucket == fallback && o.status != OrderStatus::Failed {
                self.faults.cover(Target::FallbackWon);
            }
            // Sold under a generation a recovery bumped: the sale went on after a recovery.
            if o.reservation.generation > 0 && o.status != OrderStatus::Failed {
                self.faults.cover(Target::SoldAfterRecovery);
            }
        }
        // A user whose order failed bought again: failed orders free their users (DESIGN §6).
        let failed: std::collections::BTreeSet<UserId> = (db.orders.iter())
            .filter(|o| o.status == OrderStatus::Failed)
            .map(|o| o.reservation.user)
            .collect();
        if (db.orders.iter()).any(|o| o.status != OrderStatus::Failed && failed.contains(&o.reservation.user))
        {
            self.faults.cover(Target::FailedUserBoughtAgain);
        }
        let history = self.history.lock().expect("history");
        let violated = self.violated.lock().expect("violated");
        RunReport {
            config: self.cfg.clone(),
            timings: self.timings,
            checks: self.cfg.scenario.checks(self.cfg.jobs),
            verdict: violated.as_ref().map_or(Verdict::Ok, |v| v.verdict),
            violations: violated.as_ref().map_or_else(Vec::new, |v| v.violations.clone()),
            violated_at_ms: violated.as_ref().map(|v| v.at.as_millis() as u64),
            faults: self.faults.counters(),
            outcomes: history.outcomes.clone(),
            queued: history.queued.len() as u64,
            units_sold: snap.units_sold(),
            sim_ms: self.faults.elapsed().as_millis() as u64,
            schedule: self.schedule.lock().expect("schedule").clone(),
            coverage: self.faults.coverage(),
            trace: self.faults.trace(),
        }
    }
}
