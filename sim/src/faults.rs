//! The fault knobs the nemesis turns, the counters of what fired, and the event trace.
//!
//! Knobs are read by the simulated nodes on every request; every draw comes from madsim's seeded
//! RNG, so a seed fires the same faults at the same points. Shared state sits behind std
//! mutexes: the simulation runs on one thread and nothing awaits while one is held.

use crate::world::{Fault, Target};
use madsim::rand::{thread_rng, Rng};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// Probabilities (0..1) and delays the nodes apply. All zero = a healthy world.
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// Kafka: the record is acknowledged but lost (leader loss with acks=1).
    pub mq_lose_after_ack: f64,
    /// Kafka: the record is stored twice (a producer retry after a lost ack).
    pub mq_duplicate: f64,
    /// Kafka: the append is delayed by up to this much.
    pub mq_delay: Duration,
    /// Kafka: the broker refuses the record (determinate: not stored).
    pub mq_refuse: f64,
    /// Kafka: the record is stored but the ack never arrives (indeterminate).
    pub mq_ack_lost: f64,
    /// Kafka: the record is stored but visible only after a delay past the recovery's quiesce
    /// (a slow follower), and the ack never arrives.
    pub mq_visible_late: f64,
    /// Redis: extra latency before each command, up to this much.
    pub redis_latency: Duration,
    /// Redis: a script runs, its reply is lost, and the client sends it again (the caller hears
    /// the second run's reply).
    pub redis_resend: f64,
    /// Redis: a script blocks the server for this long (every command queues behind it).
    pub redis_slow_script: f64,
    /// MySQL: the transaction fails with a lock-wait timeout (determinate: rolled back).
    pub ledger_lock_wait: f64,
    /// MySQL: any write transaction is rolled back as a deadlock victim, every one of the
    /// adapter's attempts (determinate: nothing of it happened).
    pub ledger_deadlock: f64,
    /// MySQL: the commit happens but the client sees an error (indeterminate).
    pub ledger_commit_unknown: f64,
    /// MySQL: the connection drops before the statement runs (the client times out).
    pub ledger_conn_loss: f64,
    /// MySQL: a batch's client goes silent inside its transaction, holding its shared lock on
    /// the generation until the server's idle timeout rolls it back.
    pub ledger_stalled_txn: f64,
    /// Kafka: a consumer's rewind fails (the committed offsets cannot be read, or a partition's
    /// seek is refused): its position stays where its last poll left it.
    pub mq_rewind_fail: f64,
    /// Redis, MySQL: the network holds a request back past its client's timeout and delivers
    /// it later (the client heard "no reply"; the store runs it when it arrives).
    pub redis_delivered_late: f64,
    pub ledger_delivered_late: f64,
    /// How late a held-back request arrives at least, past its client's timeout.
    pub delivered_late_floor: Duration,
}

pub fn chance(p: f64) -> bool {
    p > 0.0 && thread_rng().gen_bool(p.min(1.0))
}

/// Sleep a random time up to `d`; no sleep at all for zero (a zero sleep still costs a timer
/// tick in madsim, which would serialize a node's requests).
pub async fn delay_up_to(d: Duration) {
    if d.is_zero() {
        return;
    }
    tokio::time::sleep(Duration::from_micros(
        thread_rng().gen_range(0..=d.as_micros() as u64),
    ))
    .await;
}

/// Everything the nemesis and the nodes share: knobs, counters, trace.
pub struct Faults {
    started: madsim::time::Instant,
    knobs: Mutex<Knobs>,
    /// The knob windows open now, per knob: windows overlap, and a knob goes off only when the
    /// last of its windows closes.
    windows: Mutex<BTreeMap<&'static str, u32>>,
    fired: Mutex<BTreeMap<String, u64>>,
    covered: Mutex<BTreeMap<Target, u64>>,
    /// Clients still sending: while any is, the sale is under load.
    clients_left: std::sync::atomic::AtomicUsize,
    trace: Mutex<VecDeque<String>>,
    /// Transfers a rebalancer reported complete, not yet looked at by the checker.
    transfers_done: Mutex<Vec<TransferDone>>,
    /// When the last request the network holds back reaches its store (since the start).
    held_back_until: Mutex<Duration>,
}

/// A transfer a rebalancer reported complete: its ack must be in the source bucket's xfer hash.
#[derive(Debug, Clone)]
pub struct TransferDone {
    pub id: String,
    pub from: u32,
    /// When the pass that made it began (a Redis restart after this may have lost the ack).
    pub since: Duration,
}

/// What a report's counters count: a fault that fired, named as its [`Fault`] (a knob's hits
/// count as the fault the knob belongs to, whichever window turned it on), or an effect of one
/// that belongs to no fault of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    Fault(Fault),
    /// An engine fault point held long (`planted::stall_once`): `long_stall_<site>`.
    LongStall(seckill_core::planted::Site),
    /// The broker moved a consumer group's partitions (a member left, joined or was paused past
    /// its session).
    GroupRebalance,
    /// The broker refused the commit of a member that had lost its partitions.
    LateCommitRefused,
    /// A restart held Redis down a while before it came back (`chaos` only).
    RedisDownAWhile,
}

impl Fired {
    /// The counter's name in reports: the fault's, or the variant's in snake_case.
    pub fn name(self) -> String {
        match self {
            Fired::Fault(f) => f.name(),
            Fired::LongStall(site) => format!("long_stall_{}", site.name()),
            Fired::GroupRebalance => "group_rebalance".into(),
            Fired::LateCommitRefused => "late_commit_refused".into(),
            Fired::RedisDownAWhile => "redis_down_a_while".into(),
        }
    }
}

impl From<Fault> for Fired {
    fn from(f: Fault) -> Fired {
        Fired::Fault(f)
    }
}

/// Events kept for a failure report.
const TRACE_LEN: usize = 50;

/// How many events a run keeps: `TRACE_LEN`, or `SECKILL_SIM_TRACE` (a whole run's trace for
/// triage; what a run keeps never changes what it does).
fn trace_len() -> usize {
    std::env::var("SECKILL_SIM_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TRACE_LEN)
}

impl Default for Faults {
    fn default() -> Self {
        Self::new()
    }
}

impl Faults {
    /// Must be created inside the simulation: trace times count from here.
    pub fn new() -> Faults {
        Faults {
            started: madsim::time::Instant::now(),
            knobs: Mutex::default(),
            windows: Mutex::default(),
            fired: Mutex::default(),
            covered: Mutex::default(),
            clients_left: std::sync::atomic::AtomicUsize::new(0),
            trace: Mutex::default(),
            transfers_done: Mutex::default(),
            held_back_until: Mutex::default(),
        }
    }

    /// A request is held back by the network for `late` from now.
    pub fn held_back_for(&self, late: Duration) {
        let until = self.elapsed() + late;
        let mut u = self.held_back_until.lock().expect("faults");
        *u = (*u).max(until);
    }

    /// How long until every request the network holds back reached its store (zero: none left).
    pub fn held_back_left(&self) -> Duration {
        self.held_back_until
            .lock()
            .expect("faults")
            .saturating_sub(self.elapsed())
    }

    /// An interesting state happened ("sometimes" assertions, DESIGN §9): counted per run and
    /// summed over a sweep, which fails if a target never happened (`seckill-sim summarize`).
    pub fn cover(&self, what: Target) {
        *self.covered.lock().expect("covered").entry(what).or_insert(0) += 1;
    }

    /// A rebalancer reported this transfer complete (for the checker: `take_transfers_done`).
    pub fn transfer_done(&self, t: TransferDone) {
        self.transfers_done.lock().expect("transfers").push(t);
    }

    pub fn take_transfers_done(&self) -> Vec<TransferDone> {
        std::mem::take(&mut *self.transfers_done.lock().expect("transfers"))
    }

    pub fn coverage(&self) -> BTreeMap<String, u64> {
        let c = self.covered.lock().expect("covered");
        c.iter().map(|(k, v)| (k.name(), *v)).collect()
    }

    /// `n` more clients start sending (the sale is under load until each has called `client_done`).
    pub fn clients_start(&self, n: usize) {
        self.clients_left
            .fetch_add(n, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn client_done(&self) {
        self.clients_left
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Are clients still sending?
    pub fn under_load(&self) -> bool {
        self.clients_left.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Simulated time since the world was created.
    pub fn elapsed(&self) -> Duration {
        madsim::time::Instant::now() - self.started
    }

    /// The wall clock a node (re)starting now begins with, skewed by `skew_ms`: the world's
    /// epoch plus the simulated time gone by (a node restarted late in a run must not start its
    /// clock again at the epoch, seconds behind the others).
    pub fn wall_ms(&self, skew_ms: i64) -> u64 {
        (crate::SIM_EPOCH_MS + self.elapsed().as_millis() as u64).saturating_add_signed(skew_ms)
    }

    pub fn knobs(&self) -> Knobs {
        self.knobs.lock().expect("knobs").clone()
    }

    /// Open a window of knob `name` (`turn(knobs, true)` turns it on, `false` off).
    pub fn open_window(&self, name: &'static str, turn: fn(&mut Knobs, bool)) {
        *self.windows.lock().expect("windows").entry(name).or_default() += 1;
        turn(&mut self.knobs.lock().expect("knobs"), true);
    }

    /// Is a window of knob `name` open (the heal closes them all)?
    pub fn window_open(&self, name: &'static str) -> bool {
        self.windows.lock().expect("windows").contains_key(name)
    }

    /// Close a window of knob `name`: the knob goes off with the last of its windows (a window
    /// the heal already closed closes nothing).
    pub fn close_window(&self, name: &'static str, turn: fn(&mut Knobs, bool)) {
        let mut windows = self.windows.lock().expect("windows");
        let Some(open) = windows.get_mut(name) else { return };
        *open -= 1;
        if *open == 0 {
            windows.remove(name);
            turn(&mut self.knobs.lock().expect("knobs"), false);
        }
    }

    /// Every knob off, every window closed (the heal).
    pub fn knobs_off(&self) {
        self.windows.lock().expect("windows").clear();
        *self.knobs.lock().expect("knobs") = Knobs::default();
    }

    /// Count a fault that actually fired, and trace it.
    pub fn fired(&self, what: impl Into<Fired>) {
        let name = what.into().name();
        self.event(format!("fault {name}"));
        *self.fired.lock().expect("fired").entry(name).or_insert(0) += 1;
    }

    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.fired.lock().expect("fired").clone()
    }

    pub fn event(&self, what: String) {
        let at = self.elapsed().as_secs_f64();
        let mut t = self.trace.lock().expect("trace");
        if t.len() >= trace_len() {
            t.pop_front();
        }
        t.push_back(format!("{at:>8.3}s {what}"));
    }

    pub fn trace(&self) -> Vec<String> {
        self.trace.lock().expect("trace").iter().cloned().collect()
    }
}
