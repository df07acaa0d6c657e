//! The simulated stores — Redis, MySQL, Kafka — each a node serving RPCs over madsim's network,
//! and the port implementations engines and consumers use to reach them.
//!
//! State lives outside the node (in `Arc`s the world keeps), so a node restart decides what
//! survives: Redis loses everything (volatile) or comes back from its last AOF image; the ledger
//! and the Kafka log are durable. A store's faults are drawn per request from the world's knobs.

use crate::faults::{chance, delay_up_to, Faults, Fired};
use crate::rpc::{self, addr};
use crate::world::{Fault, Target};
use madsim::net::Endpoint;
use madsim::rand::{thread_rng, Rng};
use seckill_core::adapters::embedded::{partition_of, DeadLetterLog, EmbeddedLedger, Keyspace, RedisModel};
use seckill_core::adapters::script::{parse_gate, Reply, ScriptConn};
use seckill_core::domain::{
    Activity, ActivityId, ActivityState, Reservation, ReservationId, StockPlan, UserId,
};
use seckill_core::ports::{
    ApplyOutcome, DeadLetterPage, Delivery, Intent, Ledger, LedgerView, OrderBus, OrderRow, OrderSource,
    PayOutcome, PortError, PortResult, ReconcileView, Registered,
};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Engine → Redis: short, like a production client's command timeout.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(200);
/// Engine/consumer → Kafka and → MySQL.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(300);
/// A produce whose ack is lost is appended this long after it arrived at the latest: the
/// publish window, past the producer's own timeout, during which a record the engine already
/// gave up on can still land on the topic (recovery must wait it out before its drain counts).
pub const LATE_APPEND_MAX: Duration = Duration::from_millis(900);
/// A record held back by a slow follower becomes visible this long after it arrived, at the
/// latest: past the recovery's quiesce (which is sized to the producer's timeout, not to
/// `replica.lag.time.max.ms`), so no drain can be sure it saw every record.
pub const VISIBLE_LATE_MAX: Duration = Duration::from_millis(8_000);
/// A request the network holds back (TCP retransmitting across a partition that heals) reaches
/// its store this long after its client gave up, at the latest: past a recovery claim's lease,
/// so that a stalled runner's write can land after its successor finished.
pub const DELIVERED_LATE_MAX: Duration = Duration::from_millis(8_000);
/// How long an empty fetch waits before the consumer polls again.
const POLL_WAIT: Duration = Duration::from_millis(20);

fn lost(op: &'static str, e: io::Error) -> PortError {
    PortError::indeterminate(op, format!("no reply: {e}"))
}

/// With the chance `p`, the network holds `req` back: its client hears
/// nothing until its timeout (the error returned), and the store gets the request later, drawn
/// up to `DELIVERED_LATE_MAX` past that, and runs it as if it had just been sent. `Ok(req)`: the
/// request goes out as usual (the `delivered_late_floor` knob adds to the delay).
async fn held_back<R: madsim::net::rpc::Request>(
    ep: &Arc<Endpoint>,
    faults: &Faults,
    p: f64,
    store: &'static str,
    req: R,
    timeout: Duration,
) -> Result<R, io::Error> {
    if !chance(p) {
        return Ok(req);
    }
    let late = timeout
        + faults.knobs().delivered_late_floor
        + Duration::from_micros(thread_rng().gen_range(0..=DELIVERED_LATE_MAX.as_micros() as u64));
    faults.fired(Fault::DeliveredLate);
    faults.held_back_for(late);
    let ep = ep.clone();
    tokio::spawn(async move {
        tokio::time::sleep(late).await;
        let _ = ep.call_timeout(addr(store), req, timeout).await;
    });
    tokio::time::sleep(timeout).await;
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "held back by the network",
    ))
}

// ---------------------------------------------------------------------------------------------
// Redis

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// A restart loses everything.
    Volatile,
    /// A restart reloads the image saved at the last fsync (one every `aof_window`).
    Aof,
}

thread_local! {
    /// Stores alive on this thread (a simulation runs on the thread that blocks on it). A
    /// finished run leaves none: the tasks holding them went with its runtime (`World::tear_down`).
    static LIVE_STORES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many Redis and Kafka stores built on this thread are still alive.
pub fn live_stores() -> usize {
    LIVE_STORES.with(|n| n.get())
}

/// Counted in `LIVE_STORES` from construction to drop.
struct Alive;

impl Alive {
    fn new() -> Alive {
        LIVE_STORES.with(|n| n.set(n.get() + 1));
        Alive
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        LIVE_STORES.with(|n| n.set(n.get() - 1));
    }
}

pub struct RedisStore {
    pub model: Arc<RedisModel>,
    /// What the next restart keeps (the nemesis picks it per restart).
    restart_mode: Mutex<Persistence>,
    /// The image an AOF restart reloads, refreshed every window, and when it was taken.
    aof: Mutex<(Keyspace, Duration)>,
    aof_window: Duration,
    starts: AtomicU64,
    /// Reservations open in Redis when it restarted and not in what it came back with, with the
    /// time of that restart: the outbox entries a restart lost (the exact account L1 excuses,
    /// for reservations promised before they were lost, and nothing else).
    pub lost_outbox: Mutex<BTreeMap<String, Duration>>,
    /// Reservations a script found open and adopted for the reconciler (answer `adopted`), with
    /// the last time: what an engine's "queued" after an unknown publish rests on. A restart
    /// that loses one after this, while the answer is on its way, is data loss, not a false
    /// promise.
    pub adopted_at: Mutex<BTreeMap<String, Duration>>,
    /// When the node last restarted (`None`: never): what it wrote before may be lost.
    pub restarted_at: Mutex<Option<Duration>>,
    /// Per stock key, the units restarts gave back to it: what it came back with above what it
    /// held when it went down (a key it did not hold counts whole), summed over restarts. Redis
    /// never holds more than the ledger can sell otherwise (takes and reserves come before the
    /// ledger's step, gives after it), so no more orders of a bucket can fail for want of a unit.
    pub overstated: Mutex<BTreeMap<String, u64>>,
    /// Every reserve since the last restart that answered "reserved": when, its reservation id
    /// and its stock key.
    reserved: Mutex<Vec<(Duration, String, String)>>,
    /// Reserves a restart lost (made after the image it came back with was taken), by
    /// reservation id, with their stock key: each one whose order the ledger took left Redis a
    /// unit it had sold — what makes Redis hold more than the ledger can sell, exactly, even
    /// where a release lost in the same window makes the stock come back no higher.
    pub lost_reserves: Mutex<BTreeMap<String, String>>,
    /// Reservations a restart brought back open although they had left the outbox before it
    /// (the image predates their settle or release), by reservation id, with their `resv` key.
    /// A released one's unit went back to the stock and may have been sold or transferred since:
    /// republished or rescued, it asks the ledger for a unit that may be gone.
    pub revived: Mutex<BTreeMap<String, String>>,
    /// When the nemesis last deleted a key (`RedisKeyLost`): a loss without a restart.
    pub key_lost_at: Mutex<Option<Duration>>,
    /// Every recovery claim Redis granted, in order.
    pub claims: Mutex<Vec<ClaimGranted>>,
    /// Gates a recovery closed although they carried a newer generation than its claim's: when,
    /// the claim's fence, and the gate as it was.
    pub stale_closes: Mutex<Vec<(Duration, String, String)>>,
    /// Every answer `warmup.lua`'s finish gave, in order.
    pub finishes: Mutex<Vec<FinishSeen>>,
    /// How many buckets `rebuild.lua` rebuilt (answered "rebuilt"), over the run.
    pub rebuilds: AtomicU64,
    /// A stock key to lose when a write of it arrives, after the writer's check found it.
    pub lose_at_write: Mutex<Option<LoseAtWrite>>,
    /// A replica's image: the next (re)start comes back with it whatever the persistence (a
    /// failover promotes the replica; the clients reconnect to the same address).
    promoted: Mutex<Option<(Keyspace, Duration)>>,
    _alive: Alive,
}

/// A recovery claim as `warmup.lua` granted it.
#[derive(Debug, Clone)]
pub struct ClaimGranted {
    pub at: Duration,
    pub fence: String,
    /// It took over no other claim, and Redis held the whole activity as it came: the meta
    /// with an epoch of this run and no claim, every stock key and every gate, none
    /// recovering — nothing a recovery's look finds to do (its one other cause, a gate behind
    /// the registry's generation, comes back only with a restart or a failover: a new run id).
    pub on_whole: bool,
}

/// A recovery's finish as Redis answered it.
#[derive(Debug, Clone)]
pub struct FinishSeen {
    pub at: Duration,
    pub fence: String,
    /// The meta's claim as the finish found it: this fence's own means this run finished it.
    pub held: Option<String>,
    /// The answer: finished or not.
    pub finished: bool,
}

/// Does the keyspace hold the whole activity (its `buckets` business buckets and the fallback),
/// as a recovery's look sees it under Redis's run id `run_id`?
fn whole(ks: &Keyspace, activity: ActivityId, buckets: u32, run_id: &str) -> bool {
    use seckill_core::adapters::embedded::Value;
    use seckill_core::adapters::script::{gate_key, meta_key, stock_key};
    let meta = match ks.get(meta_key(activity).as_bytes()) {
        Some(Value::Hash(h)) => {
            !h.contains_key(b"claim".as_slice())
                && h.get(b"epoch".as_slice()).is_some_and(|e| e == run_id.as_bytes())
        }
        _ => false,
    };
    meta && (0..=buckets).map(seckill_core::domain::BucketNo).all(|b| {
        ks.contains_key(stock_key(activity, b).as_bytes())
            && matches!(ks.get(gate_key(activity, b).as_bytes()),
                Some(Value::Str(g)) if !g.starts_with(b"recovering"))
    })
}

/// A script's answer tag: the first element of its array reply.
fn reply_tag(reply: &Reply) -> Option<&[u8]> {
    match reply {
        Reply::Array(items) => match items.first() {
            Some(Reply::Bulk(tag)) => Some(tag.as_slice()),
            _ => None,
        },
        _ => None,
    }
}

/// A string key's value, if it holds one (read raw).
fn raw_string(model: &RedisModel, key: &str) -> Option<String> {
    use seckill_core::adapters::embedded::Value;
    model.read(|ks| match ks.get(key.as_bytes()) {
        Some(Value::Str(v)) => Some(String::from_utf8_lossy(v).into_owned()),
        _ => None,
    })
}

/// The recovery claim a meta hash holds, if any (read raw).
pub fn meta_claim(model: &RedisModel, meta: &str) -> Option<String> {
    use seckill_core::adapters::embedded::Value;
    model.read(|ks| match ks.get(meta.as_bytes()) {
        Some(Value::Hash(h)) => h
            .get(b"claim".as_slice())
            .map(|c| String::from_utf8_lossy(c).into_owned()),
        _ => None,
    })
}

/// Which write a stock key is lost at (`RedisKeyLost` aimed at a writer that checks first).
pub enum LoseAtWrite {
    /// A warmup's bucket op on this stock key.
    Warmup(String),
    /// The next transfer's give, whichever its target.
    NextGive,
    /// The next cancelled order's release (a payment timeout's, a buyer's), whichever its
    /// bucket: the units of a cancel must not make a bucket of their own.
    NextCancel,
}

/// Every stock key in a keyspace, with its units.
fn stocks(ks: &Keyspace) -> BTreeMap<String, i64> {
    use seckill_core::adapters::embedded::Value;
    ks.iter()
        .filter(|(k, _)| k.ends_with(b":stock"))
        .filter_map(|(k, v)| match v {
            Value::Str(units) => Some((
                String::from_utf8_lossy(k).into_owned(),
                std::str::from_utf8(units).ok()?.parse().ok()?,
            )),
            _ => None,
        })
        .collect()
}

/// Every open reservation id in a keyspace (the `resv` hashes' fields, pending marks aside),
/// with its `resv` key.
fn outbox(ks: &Keyspace) -> BTreeMap<String, String> {
    use seckill_core::adapters::embedded::Value;
    ks.iter()
        .filter(|(k, _)| k.ends_with(b":resv"))
        .flat_map(|(k, v)| match v {
            Value::Hash(h) => h
                .keys()
                .filter(|f| !f.starts_with(b"pending:"))
                .map(|f| {
                    (
                        String::from_utf8_lossy(f).into_owned(),
                        String::from_utf8_lossy(k).into_owned(),
                    )
                })
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

impl RedisStore {
    pub fn new(persistence: Persistence, aof_window: Duration) -> Self {
        RedisStore {
            model: Arc::new(RedisModel::new()),
            restart_mode: Mutex::new(persistence),
            aof: Mutex::new((Keyspace::new(), Duration::ZERO)),
            aof_window,
            starts: AtomicU64::new(0),
            lost_outbox: Mutex::default(),
            adopted_at: Mutex::default(),
            restarted_at: Mutex::default(),
            overstated: Mutex::default(),
            reserved: Mutex::default(),
            lost_reserves: Mutex::default(),
            revived: Mutex::default(),
            key_lost_at: Mutex::default(),
            claims: Mutex::default(),
            finishes: Mutex::default(),
            rebuilds: AtomicU64::new(0),
            stale_closes: Mutex::default(),
            lose_at_write: Mutex::default(),
            promoted: Mutex::default(),
            _alive: Alive::new(),
        }
    }

    /// When Redis last lost data: its last restart (or failover) or deleted key, if any.
    pub fn last_loss(&self) -> Option<Duration> {
        let restarted = *self.restarted_at.lock().expect("restarted");
        restarted.max(*self.key_lost_at.lock().expect("key lost"))
    }

    /// Whether Redis may hold, at `at`, what a loss left behind: it lost data since `at`, or
    /// before it with no recovery finished in between (a restart's image can bring back an open
    /// reservation whose order the ledger failed since, and a later release then takes the mark
    /// they share; the recovery's rebuild puts the two in line with the ledger again).
    pub fn loss_unrepaired(&self, at: Duration) -> bool {
        let Some(lost) = self.last_loss() else {
            return false;
        };
        lost >= at
            || !(self.finishes.lock().expect("finishes").iter())
                .any(|f| f.finished && f.at >= lost && f.at <= at)
    }

    /// Delete `key` (a loss without a restart: eviction, a failover that lost it).
    pub fn lose_key(&self, key: &str, at: Duration) {
        self.model.command(&[b"DEL".to_vec(), key.as_bytes().to_vec()]);
        *self.key_lost_at.lock().expect("key lost") = Some(at);
    }

    pub fn set_restart_mode(&self, mode: Persistence) {
        *self.restart_mode.lock().expect("mode") = mode;
    }

    /// The next (re)start promotes a replica holding `image` (what the primary held when the
    /// replica last caught up, at `taken_at`).
    pub fn promote_at_restart(&self, image: Keyspace, taken_at: Duration) {
        *self.promoted.lock().expect("promoted") = Some((image, taken_at));
    }
}

/// Coverage of the "already done" branches a script's second run takes (a re-sent script:
/// `RedisResend`): each must answer what its first run did and change nothing.
fn cover_rerun(f: &Faults, req: &rpc::EvalSha, reply: &Reply) {
    let Some(tag) = reply_tag(reply) else { return };
    let op = req.args.first().map(String::as_str).unwrap_or("");
    let target = match (op, tag) {
        ("own" | "fallback", b"reserved") => Target::RerunReserveKept,
        ("unpublished" | "rejected" | "cancelled", b"absent") => Target::RerunReleaseAbsent,
        ("take" | "give", b"exists") => Target::RerunTransferExists,
        // settle.lua's only argument is the reservation id.
        (_, b"absent") if req.keys.len() == 1 && req.args.len() == 1 => Target::RerunSettleAbsent,
        (_, b"rebuilt") => Target::RerunRebuildAgain,
        (_, b"reopened") => Target::RerunReopenKept,
        (_, b"finished") => Target::RerunFinishKept,
        _ => return,
    };
    f.cover(target);
}

/// The Redis node's main: runs on every (re)start of the node.
pub async fn serve_redis(store: Arc<RedisStore>, faults: Arc<Faults>) {
    if store.starts.fetch_add(1, Ordering::SeqCst) > 0 {
        let (before, stock_before) = store.model.read(|ks| (outbox(ks), stocks(ks)));
        let mode = *store.restart_mode.lock().expect("mode");
        let promoted = store.promoted.lock().expect("promoted").take();
        let taken_at = match (promoted, mode) {
            (Some((image, at)), _) => {
                store.model.restore(image);
                at
            }
            (None, Persistence::Volatile) => {
                store.model.flush_all();
                Duration::ZERO
            }
            (None, Persistence::Aof) => {
                let (image, at) = store.aof.lock().expect("aof").clone();
                store.model.restore(image);
                at
            }
        };
        let reserved = std::mem::take(&mut *store.reserved.lock().expect("reserved"));
        store.lost_reserves.lock().expect("lost reserves").extend(
            (reserved.into_iter())
                .filter(|(at, _, _)| *at > taken_at)
                .map(|(_, rid, key)| (rid, key)),
        );
        let (after, stock_after) = store.model.read(|ks| (outbox(ks), stocks(ks)));
        let mut overstated = store.overstated.lock().expect("overstated");
        for (key, units) in stock_after {
            let gained = (units - stock_before.get(&key).copied().unwrap_or(0)).max(0) as u64;
            *overstated.entry(key).or_default() += gained;
        }
        drop(overstated);
        let at = faults.elapsed();
        *store.restarted_at.lock().expect("restarted") = Some(at);
        let left = |from: &BTreeMap<String, String>, to: &BTreeMap<String, String>| {
            (from.iter())
                .filter(|(rid, _)| !to.contains_key(*rid))
                .map(|(rid, key)| (rid.clone(), key.clone()))
                .collect::<Vec<_>>()
        };
        store
            .revived
            .lock()
            .expect("revived")
            .extend(left(&after, &before));
        store
            .lost_outbox
            .lock()
            .expect("lost outbox")
            .extend(left(&before, &after).into_iter().map(|(rid, _)| (rid, at)));
    }
    let ep = Endpoint::bind(addr(rpc::REDIS)).await.expect("bind redis");
    // Redis executes one command at a time: a slow script blocks everyone behind it.
    let main_thread = Arc::new(tokio::sync::Mutex::new(()));
    let (s, f, t) = (store.clone(), faults.clone(), main_thread.clone());
    rpc::serve(&ep, move |req: rpc::EvalSha| {
        let (s, f, t) = (s.clone(), f.clone(), t.clone());
        async move {
            delay_up_to(f.knobs().redis_latency).await;
            let _turn = t.lock().await;
            // Whether this script is slow is drawn when it runs, not when it arrived: a backlog
            // that queued during the window must not go on stalling the server after it closed
            // (at the standard size thousands queue; drawn at arrival, 5% of them kept Redis
            // blocked for half a minute after the heal).
            if chance(f.knobs().redis_slow_script) {
                f.fired(Fault::RedisSlowScript);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            // warmup.lua's bucket op (KEYS stock, gate), transfer.lua's give (KEYS stock, xfer,
            // gate) and release.lua's cancel (KEYS stock, buyers, resv, xfer, gate): the only
            // scripts with these first arguments and key counts.
            {
                let mut armed = s.lose_at_write.lock().expect("lose at write");
                let op = req.args.first().map(String::as_str);
                let writer = match (armed.as_ref(), op, req.keys.len()) {
                    (Some(LoseAtWrite::Warmup(key)), Some("bucket"), 2) if req.keys[0] == *key => {
                        Some("a warmup")
                    }
                    (Some(LoseAtWrite::NextGive), Some("give"), 3) => Some("a transfer's give"),
                    (Some(LoseAtWrite::NextCancel), Some("cancelled"), 5) => Some("a cancel's release"),
                    _ => None,
                };
                if let Some(writer) = writer {
                    *armed = None;
                    f.fired(Fault::RedisKeyLost);
                    f.event(format!("redis: {} lost as {writer} writes it", req.keys[0]));
                    s.lose_key(&req.keys[0], f.elapsed());
                }
            }
            // The one-key ops of warmup.lua and gate.lua whose answers the checks hold to what
            // the op found.
            let one_key_op =
                |name: &str| req.args.first().map(String::as_str) == Some(name) && req.keys.len() == 1;
            // warmup.lua's claim (KEYS meta; ARGV op, fence, lease, version, buckets).
            let claiming = one_key_op("claim").then(|| {
                let buckets = req.args.get(4).and_then(|n| n.parse().ok()).unwrap_or(0);
                let run_id = s.model.run_id();
                s.model
                    .read(|ks| whole(ks, crate::world::ACTIVITY, buckets, &run_id))
            });
            // warmup.lua's finish (KEYS meta; ARGV op, fence, epoch): the claim it finds.
            let finishing = one_key_op("finish").then(|| meta_claim(&s.model, &req.keys[0]));
            // gate.lua's close (KEYS gate; ARGV op, fence, generation): the gate it finds.
            let closing = one_key_op("close")
                .then(|| raw_string(&s.model, &req.keys[0]))
                .flatten();
            let reply = s.model.eval_sha(&req.sha, &req.keys, &req.args);
            let tag = reply_tag(&reply);
            if let Some(gate) = closing.filter(|_| tag == Some(b"closed".as_slice())) {
                let generation = |g: &str| parse_gate(g).map(|g| g.generation);
                if generation(&gate) > req.args.get(2).and_then(|g| g.parse().ok()) {
                    s.stale_closes.lock().expect("stale closes").push((
                        f.elapsed(),
                        req.args[1].clone(),
                        gate,
                    ));
                }
            }
            if let Some(held) = finishing.filter(|_| tag.is_some()) {
                s.finishes.lock().expect("finishes").push(FinishSeen {
                    at: f.elapsed(),
                    fence: req.args[1].clone(),
                    held,
                    finished: tag == Some(b"finished".as_slice()),
                });
            }
            if let (Some(whole), Reply::Array(items)) = (claiming, &reply) {
                if let [Reply::Bulk(tag), Reply::Bulk(previous)] = items.as_slice() {
                    if tag == b"claimed" {
                        s.claims.lock().expect("claims").push(ClaimGranted {
                            at: f.elapsed(),
                            fence: req.args[1].clone(),
                            on_whole: whole && previous.is_empty(),
                        });
                    }
                }
            }
            if req.resent {
                cover_rerun(&f, &req, &reply);
            }
            if let (Reply::Array(items), Some(rid)) = (&reply, req.args.get(1)) {
                match items.first() {
                    Some(Reply::Bulk(tag))
                        if tag == b"reserved" && matches!(req.args[0].as_str(), "own" | "fallback") =>
                    {
                        if let (Some(rid), Some(key)) = (req.args.get(3), req.keys.first()) {
                            let at = f.elapsed();
                            s.reserved
                                .lock()
                                .expect("reserved")
                                .push((at, rid.clone(), key.clone()));
                        }
                    }
                    Some(Reply::Bulk(tag)) if tag == b"rebuilt" => {
                        s.rebuilds.fetch_add(1, Ordering::SeqCst);
                    }
                    // A take refused at a recovering gate: a bucket rebuilt or about to be, which
                    // a transfer planned before the recovery must not take from.
                    Some(Reply::Bulk(tag)) if tag == b"gated" && req.args[0] == "take" => {
                        let gate = req.keys.get(2).and_then(|k| raw_string(&s.model, k));
                        if gate.is_some_and(|g| g.starts_with("recovering|")) {
                            f.cover(Target::TakeGatedInRecovery);
                        }
                    }
                    Some(Reply::Bulk(tag)) if tag == b"adopted" => {
                        let at = f.elapsed();
                        s.adopted_at.lock().expect("adopted").insert(rid.clone(), at);
                    }
                    // A fallback reserve that reached Redis after the reconciler gave it up
                    // (and, apart, one the void kept from a unit it would have taken). Counted,
                    // not a coverage target: no run of 40 seeds of rebalancing, chaos or
                    // producer-faults reaches it (the reconciler's own "voided" is not this).
                    Some(Reply::Bulk(tag)) if tag == b"voided" && req.args[0] == "fallback" => {
                        f.cover(Target::LateFallbackVoided);
                        let stock = req
                            .keys
                            .first()
                            .and_then(|k| s.model.read(|ks| ks.get(k.as_bytes()).cloned()));
                        if let Some(seckill_core::adapters::embedded::Value::Str(v)) = stock {
                            if std::str::from_utf8(&v).ok().and_then(|v| v.parse::<i64>().ok()) > Some(0) {
                                f.cover(Target::LateFallbackVoidKeptUnit);
                            }
                        }
                    }
                    _ => {}
                }
            }
            reply
        }
    });
    let m = store.model.clone();
    rpc::serve(&ep, move |_: rpc::RunId| {
        let m = m.clone();
        async move { m.run_id() }
    });
    let m = store.model.clone();
    rpc::serve(&ep, move |req: rpc::ScriptLoad| {
        let m = m.clone();
        async move { m.script_load(&req.source) }
    });
    // The AOF fsync: what a restart in AOF mode comes back with.
    loop {
        *store.aof.lock().expect("aof") = (store.model.dump(), faults.elapsed());
        tokio::time::sleep(store.aof_window).await;
    }
}

/// `ScriptConn` over the network to the Redis node.
#[derive(Clone)]
pub struct SimRedis {
    ep: Arc<Endpoint>,
    faults: Arc<Faults>,
}

impl SimRedis {
    pub fn new(ep: Arc<Endpoint>, faults: Arc<Faults>) -> Self {
        SimRedis { ep, faults }
    }
}

impl ScriptConn for SimRedis {
    async fn run_id(&self) -> PortResult<String> {
        self.ep
            .call_timeout(addr(rpc::REDIS), rpc::RunId, REDIS_TIMEOUT)
            .await
            .map_err(|e| lost("run id", e))
    }

    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        let req = rpc::EvalSha {
            sha: sha.to_string(),
            keys: keys.to_vec(),
            args: args.to_vec(),
            resent: false,
        };
        let req = held_back(
            &self.ep,
            &self.faults,
            self.faults.knobs().redis_delivered_late,
            rpc::REDIS,
            req,
            REDIS_TIMEOUT,
        )
        .await
        .map_err(|e| lost("redis", e))?;
        if chance(self.faults.knobs().redis_resend) {
            // The script ran and its reply was lost with the connection; the client reconnects
            // and sends it again (redis-rs's cluster client does, `retries(n)`): the caller hears
            // the second run's reply, whatever the first did.
            self.faults.fired(Fault::RedisResend);
            let _ = self
                .ep
                .call_timeout(addr(rpc::REDIS), req.clone(), REDIS_TIMEOUT)
                .await;
            let resent = rpc::EvalSha { resent: true, ..req };
            return self
                .ep
                .call_timeout(addr(rpc::REDIS), resent, REDIS_TIMEOUT)
                .await
                .map_err(|e| lost("redis", e));
        }
        self.ep
            .call_timeout(addr(rpc::REDIS), req, REDIS_TIMEOUT)
            .await
            .map_err(|e| lost("redis", e))
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        let req = rpc::ScriptLoad {
            source: source.to_string(),
        };
        match self.ep.call_timeout(addr(rpc::REDIS), req, REDIS_TIMEOUT).await {
            Ok(Reply::Error(e)) => Err(PortError::determinate("script load", e)),
            Ok(_) => Ok(()),
            Err(e) => Err(lost("script load", e)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// MySQL

/// The ledger node's main. The ledger itself is durable: it lives in the world, not the node.
/// What the ledger did that the checker needs the time of: orders it refused for an older
/// generation, and generation bumps (sim time since the world started).
#[derive(Default)]
pub struct LedgerLog {
    pub stale: Mutex<Vec<(Duration, ReservationId)>>,
    /// Orders the ledger created although reserved under an older generation than the
    /// registry's when the batch arrived (S6 at the ledger): reservation, its generation, the
    /// registry's. Taken (and reported) by the checker.
    pub accepted_stale: Mutex<Vec<(ReservationId, u64, u64)>>,
    pub bumps: Mutex<Vec<Duration>>,
    /// Per bucket, the orders the ledger recorded failed for want of a unit (`OutOfStock`).
    pub out_of_stock: Mutex<BTreeMap<u32, u64>>,
    /// Registry writes of an open intent (a resume): when, and the intent's version.
    pub opens: Mutex<Vec<(Duration, u64)>>,
    /// Every reservation a committed batch carried (whatever its outcome), and when it was
    /// first: what the group's commits are checked against (DESIGN §5).
    pub applied: Mutex<BTreeMap<ReservationId, Duration>>,
}

/// How long MariaDB keeps a transaction whose client went silent (`idle_transaction_timeout`,
/// as the adapter sets it per connection), and how long a statement waits for a row lock
/// (`innodb_lock_wait_timeout`).
const IDLE_TRANSACTION: Duration = Duration::from_secs(3);
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// The generation's row lock (the simulation runs one activity): every batch and transfer holds
/// it shared to COMMIT, the bump exclusive. The model applies each call atomically; this is what
/// makes a batch whose client stalled mid-transaction hold a recovery's bump back.
type GenerationLock = Arc<tokio::sync::RwLock<()>>;

pub async fn serve_ledger(ledger: EmbeddedLedger, faults: Arc<Faults>, log: Arc<LedgerLog>) {
    let ep = Endpoint::bind(addr(rpc::MYSQL)).await.expect("bind mysql");
    let generation_lock = GenerationLock::default();
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::Install| {
        let l = l.clone();
        async move {
            let activity =
                Activity::new(req.spec).map_err(|e| PortError::determinate("install", e.to_string()))?;
            l.install(&activity, &StockPlan::new(&activity)).await
        }
    });
    let (l, f, g) = (ledger.clone(), faults.clone(), log.clone());
    let gl = generation_lock.clone();
    rpc::serve(&ep, move |req: rpc::Apply| {
        let (l, f, log, gl) = (l.clone(), f.clone(), g.clone(), gl.clone());
        async move {
            let knobs = f.knobs();
            if chance(knobs.ledger_conn_loss) {
                f.fired(Fault::LedgerConnLoss);
                tokio::time::sleep(Duration::from_secs(30)).await; // the client gives up first
                return Err(PortError::indeterminate("apply", "connection lost"));
            }
            let _held = gl.read().await;
            if chance(knobs.ledger_stalled_txn) {
                // The worker went silent inside the batch's transaction, its shared lock on the
                // generation taken: the server rolls it back when its idle timeout runs out.
                f.fired(Fault::LedgerStalledTxn);
                let idle = thread_rng().gen_range(IDLE_TRANSACTION / 6..=IDLE_TRANSACTION);
                tokio::time::sleep(idle).await;
                return Err(PortError::indeterminate("apply", "connection lost"));
            }
            if chance(knobs.ledger_lock_wait) {
                f.fired(Fault::LedgerLockWait);
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Err(PortError::determinate(
                    "apply",
                    "Lock wait timeout exceeded; try restarting transaction",
                ));
            }
            // The registry's generation as the batch arrives (in-process, nothing runs between
            // this read and the apply; a bump in between would only make it lower): an order
            // reserved under an older one must not be created.
            let mut current = BTreeMap::new();
            for r in &req.batch {
                if let std::collections::btree_map::Entry::Vacant(e) = current.entry(r.activity) {
                    e.insert(
                        l.registry(r.activity)
                            .await
                            .ok()
                            .flatten()
                            .map(|g| g.intent.generation),
                    );
                }
            }
            let out = l.apply(&req.batch).await;
            if let Ok(outcomes) = &out {
                let mut applied = log.applied.lock().expect("ledger log");
                for r in &req.batch {
                    applied.entry(r.id).or_insert_with(|| f.elapsed());
                }
                drop(applied);
                let accepted_stale = req
                    .batch
                    .iter()
                    .zip(outcomes)
                    .filter(|(_, o)| **o == ApplyOutcome::Created)
                    .filter_map(|(r, _)| {
                        let now = current.get(&r.activity).copied().flatten()?;
                        (r.generation < now).then_some((r.id, r.generation, now))
                    });
                log.accepted_stale
                    .lock()
                    .expect("ledger log")
                    .extend(accepted_stale);
                let stale = req
                    .batch
                    .iter()
                    .zip(outcomes)
                    .filter(|(_, o)| **o == ApplyOutcome::StaleGeneration)
                    .map(|(r, _)| (f.elapsed(), r.id));
                log.stale.lock().expect("ledger log").extend(stale);
                let mut failed = log.out_of_stock.lock().expect("ledger log");
                for (r, _) in
                    (req.batch.iter().zip(outcomes)).filter(|(_, o)| **o == ApplyOutcome::OutOfStock)
                {
                    *failed.entry(r.bucket.0).or_default() += 1;
                }
            }
            if chance(knobs.ledger_commit_unknown) {
                f.fired(Fault::LedgerCommitUnknown);
                return Err(PortError::indeterminate("apply", "connection lost during COMMIT"));
            }
            out
        }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::CancelUnpaid| {
        let l = l.clone();
        async move { l.cancel_unpaid(req.activity, req.now_ms).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::CancelOrder| {
        let l = l.clone();
        async move { l.cancel(req.id).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::ActivityOf| {
        let l = l.clone();
        async move { l.activity(req.id).await.map(|a| a.map(|a| a.spec().clone())) }
    });
    let l = ledger.clone();
    let gl = generation_lock.clone();
    rpc::serve(&ep, move |req: rpc::LedgerTransfer| {
        let (l, gl) = (l.clone(), gl.clone());
        async move {
            let _held = gl.read().await;
            l.transfer(req.activity, &req.transfer).await
        }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::Pay| {
        let l = l.clone();
        async move { l.pay(req.id, &req.payment).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::OrderById| {
        let l = l.clone();
        async move { l.order(req.id).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::OrderOf| {
        let l = l.clone();
        async move { l.order_of(req.activity, req.user).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::RegistryOf| {
        let l = l.clone();
        async move { l.registry(req.id).await }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |_: rpc::RegisteredAll| {
        let l = l.clone();
        async move { l.registered().await }
    });
    let (l, f, g) = (ledger.clone(), faults.clone(), log.clone());
    rpc::serve(&ep, move |req: rpc::SetIntent| {
        let (l, f, log) = (l.clone(), f.clone(), g.clone());
        async move {
            let out = l.set_intent(req.id, req.state).await;
            if let Ok(Some(i)) = &out {
                if i.state == ActivityState::Open {
                    log.opens
                        .lock()
                        .expect("ledger log")
                        .push((f.elapsed(), i.version));
                }
            }
            out
        }
    });
    let l = ledger.clone();
    let (f, g) = (faults.clone(), log.clone());
    rpc::serve(&ep, move |req: rpc::BumpGeneration| {
        let (l, f, log, gl) = (l.clone(), f.clone(), g.clone(), generation_lock.clone());
        async move {
            // The bump waits for every batch holding the generation, a stalled one until the
            // server rolls it back (its client gave up long before).
            let _held = match gl.try_write() {
                Ok(held) => held,
                Err(_) => match tokio::time::timeout(LOCK_WAIT, gl.write()).await {
                    Ok(held) => {
                        f.cover(Target::BumpWaitedForABatch);
                        held
                    }
                    Err(_) => {
                        return Err(PortError::determinate(
                            "bump generation",
                            "Lock wait timeout exceeded; try restarting transaction",
                        ))
                    }
                },
            };
            let out = l.bump_generation(req.id, req.from).await;
            match out {
                Ok(Some(_)) => log.bumps.lock().expect("ledger log").push(f.elapsed()),
                Ok(None) => f.cover(Target::BumpFenced),
                Err(_) => {}
            }
            out
        }
    });
    let l = ledger.clone();
    rpc::serve(&ep, move |req: rpc::ReconcileRead| {
        let l = l.clone();
        async move { l.reconcile_view(req.activity, &req.mentioned).await }
    });
    let l = ledger;
    rpc::serve(&ep, move |req: rpc::Snapshot| {
        let l = l.clone();
        async move { l.snapshot(req.activity).await }
    });
    std::future::pending::<()>().await;
}

/// The coverage target of a write refused as a deadlock victim.
fn deadlock_victim(op: &'static str) -> Target {
    match op {
        "apply" => Target::DeadlockVictimApply,
        "transfer" => Target::DeadlockVictimTransfer,
        "cancel unpaid" => Target::DeadlockVictimCancelUnpaid,
        "bump generation" => Target::DeadlockVictimBump,
        "set intent" => Target::DeadlockVictimSetIntent,
        _ => Target::DeadlockVictimOther,
    }
}

/// `Ledger` over the network to the MySQL node.
#[derive(Clone)]
pub struct SimLedger {
    ep: Arc<Endpoint>,
    faults: Arc<Faults>,
}

impl SimLedger {
    pub fn new(ep: Arc<Endpoint>, faults: Arc<Faults>) -> Self {
        SimLedger { ep, faults }
    }

    /// A write: the server may roll it back as a deadlock victim (InnoDB picks one of two
    /// transactions that wait for each other's locks; the adapter runs a victim again from
    /// BEGIN, and this is every attempt refused), and the network may hold it back (`held_back`;
    /// a read held back changes nothing).
    async fn write<R: madsim::net::rpc::Request<Response = PortResult<T>>, T>(
        &self,
        op: &'static str,
        req: R,
    ) -> PortResult<T> {
        let knobs = self.faults.knobs();
        if chance(knobs.ledger_deadlock) {
            self.faults.fired(Fault::LedgerDeadlock);
            self.faults.cover(deadlock_victim(op));
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Err(PortError::determinate(
                op,
                "Deadlock found when trying to get lock; try restarting transaction",
            ));
        }
        let p = knobs.ledger_delivered_late;
        let req = held_back(&self.ep, &self.faults, p, rpc::MYSQL, req, STORE_TIMEOUT)
            .await
            .map_err(|e| lost(op, e))?;
        self.call(op, req).await
    }

    async fn call<R: madsim::net::rpc::Request<Response = PortResult<T>>, T>(
        &self,
        op: &'static str,
        req: R,
    ) -> PortResult<T> {
        self.ep
            .call_timeout(addr(rpc::MYSQL), req, STORE_TIMEOUT)
            .await
            .map_err(|e| lost(op, e))?
    }
}

impl Ledger for SimLedger {
    async fn cancel_unpaid(&self, activity: ActivityId, now_ms: u64) -> PortResult<Vec<Reservation>> {
        self.write("cancel unpaid", rpc::CancelUnpaid { activity, now_ms })
            .await
    }

    async fn install(&self, activity: &Activity, _plan: &StockPlan) -> PortResult<bool> {
        let spec = activity.spec().clone();
        self.write("install", rpc::Install { spec }).await
    }

    async fn apply(&self, batch: &[Reservation]) -> PortResult<Vec<ApplyOutcome>> {
        self.write(
            "apply",
            rpc::Apply {
                batch: batch.to_vec(),
            },
        )
        .await
    }

    async fn pay(&self, id: ReservationId, payment: &str) -> PortResult<PayOutcome> {
        let payment = payment.to_string();
        self.write("pay", rpc::Pay { id, payment }).await
    }

    async fn order(&self, id: ReservationId) -> PortResult<Option<seckill_core::ports::OrderRow>> {
        self.call("order", rpc::OrderById { id }).await
    }

    async fn cancel(&self, id: ReservationId) -> PortResult<seckill_core::ports::CancelOutcome> {
        self.write("cancel", rpc::CancelOrder { id }).await
    }

    async fn activity(&self, id: ActivityId) -> PortResult<Option<Activity>> {
        let spec = self.call("activity", rpc::ActivityOf { id }).await?;
        spec.map(|s| Activity::new(s).map_err(|e| PortError::determinate("activity", e.to_string())))
            .transpose()
    }

    async fn transfer(&self, activity: ActivityId, t: &seckill_core::ports::Transfer) -> PortResult<bool> {
        let req = rpc::LedgerTransfer {
            activity,
            transfer: t.clone(),
        };
        self.write("transfer", req).await
    }

    async fn order_of(&self, activity: ActivityId, user: UserId) -> PortResult<Option<OrderRow>> {
        self.call("order of", rpc::OrderOf { activity, user }).await
    }

    async fn snapshot(&self, activity: ActivityId) -> PortResult<LedgerView> {
        self.call("ledger snapshot", rpc::Snapshot { activity }).await
    }

    async fn reconcile_view(
        &self,
        activity: ActivityId,
        mentioned: &BTreeSet<ReservationId>,
    ) -> PortResult<ReconcileView> {
        let mentioned = mentioned.clone();
        self.call("reconcile view", rpc::ReconcileRead { activity, mentioned })
            .await
    }

    async fn registry(&self, id: ActivityId) -> PortResult<Option<Registered>> {
        self.call("registry", rpc::RegistryOf { id }).await
    }

    async fn registered(&self) -> PortResult<Vec<Registered>> {
        self.call("registry", rpc::RegisteredAll).await
    }

    async fn set_intent(&self, id: ActivityId, state: ActivityState) -> PortResult<Option<Intent>> {
        self.write("set intent", rpc::SetIntent { id, state }).await
    }

    async fn bump_generation(&self, id: ActivityId, from: u64) -> PortResult<Option<Intent>> {
        self.write("bump generation", rpc::BumpGeneration { id, from })
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// Kafka

/// The broker's durable state: partition logs (acknowledged records survive restarts, unless a
/// fault lost them before they were stored), group offsets, the dead-letter topic.
pub struct KafkaLog {
    state: Mutex<KafkaState>,
    /// Order records the broker acknowledged and then lost (by reservation id): a data loss the
    /// checker's exact L1 account excuses when the outbox entry is gone too.
    pub lost_after_ack: Mutex<BTreeSet<String>>,
    /// Order records a slow follower held back past the recovery's quiesce (by reservation id):
    /// when each arrived and when it became visible.
    pub visible_late: Mutex<BTreeMap<String, (Duration, Duration)>>,
    /// Members whose last rewind failed (a coverage target counts the retry that follows).
    rewind_failed: Mutex<BTreeSet<String>>,
    /// Each commit that moved a partition's committed offset: when, the partition, and the
    /// offsets it newly covered. Taken (and checked) by the world.
    pub commits: Mutex<Vec<(Duration, u32, std::ops::Range<u64>)>>,
    _alive: Alive,
}

struct KafkaState {
    partitions: Vec<Vec<(String, Vec<u8>)>>,
    committed: BTreeMap<(String, u32), u64>,
    dead_letters: DeadLetterLog,
    groups: BTreeMap<String, Group>,
}

/// How long a member may go without a heartbeat (each poll is one) before the group drops it and
/// gives its partitions to the others — Kafka's `session.timeout.ms`, scaled to the simulation.
pub const SESSION_TIMEOUT: Duration = Duration::from_millis(1_000);

/// A consumer group as the broker's coordinator keeps it: members with their last heartbeat, a
/// generation bumped by every rebalance, and each member's partitions (round robin over the
/// members in id order). A member that joins or leaves (expires) rebalances everyone.
#[derive(Default)]
struct Group {
    generation: u64,
    last_seen: BTreeMap<String, tokio::time::Instant>,
    assignment: BTreeMap<String, Vec<u32>>,
}

impl Group {
    /// Heartbeat of `member` (joining if it is new); true if the group rebalanced.
    fn sync(&mut self, member: &str, partitions: u32) -> bool {
        let now = tokio::time::Instant::now();
        let others = |g: &Group| g.last_seen.keys().filter(|m| *m != member).count();
        let before = others(self);
        self.last_seen
            .retain(|m, seen| m == member || now.duration_since(*seen) < SESSION_TIMEOUT);
        let expired = others(self) < before;
        let joined = self.last_seen.insert(member.to_string(), now).is_none();
        if !(joined || expired) {
            return false;
        }
        self.generation += 1;
        self.assign(partitions);
        true
    }

    /// `member` left: the others share its partitions from the next generation on.
    fn leave(&mut self, member: &str, partitions: u32) -> bool {
        if self.last_seen.remove(member).is_none() {
            return false;
        }
        self.generation += 1;
        self.assign(partitions);
        true
    }

    /// Round robin over the members in id order.
    fn assign(&mut self, partitions: u32) {
        let members: Vec<String> = self.last_seen.keys().cloned().collect();
        self.assignment = members.iter().map(|m| (m.clone(), Vec::new())).collect();
        if members.is_empty() {
            return;
        }
        for p in 0..partitions {
            let m = &members[p as usize % members.len()];
            self.assignment.get_mut(m).expect("a member").push(p);
        }
    }
}

impl KafkaLog {
    pub fn new(partitions: u32) -> Self {
        KafkaLog {
            state: Mutex::new(KafkaState {
                partitions: vec![Vec::new(); partitions as usize],
                committed: BTreeMap::new(),
                dead_letters: DeadLetterLog::default(),
                groups: BTreeMap::new(),
            }),
            lost_after_ack: Mutex::default(),
            visible_late: Mutex::default(),
            rewind_failed: Mutex::default(),
            commits: Mutex::default(),
            _alive: Alive::new(),
        }
    }

    pub fn partitions(&self) -> u32 {
        self.state.lock().expect("kafka").partitions.len() as u32
    }

    /// Records not yet committed by `group`, over all partitions.
    pub fn lag(&self, group: &str) -> u64 {
        let st = self.state.lock().expect("kafka");
        (0..st.partitions.len())
            .map(|p| {
                let end = st.partitions[p].len() as u64;
                end - st
                    .committed
                    .get(&(group.to_string(), p as u32))
                    .copied()
                    .unwrap_or(0)
                    .min(end)
            })
            .sum()
    }

    pub fn dead_letters(&self) -> usize {
        self.state.lock().expect("kafka").dead_letters.letters().count()
    }

    /// The dead-letter topic's calls.
    fn dead_letters_call(&self, req: rpc::DeadLetters) -> rpc::DeadLettersAnswer {
        let mut st = self.state.lock().expect("kafka");
        match req {
            rpc::DeadLetters::Add { delivery, reason } => {
                st.dead_letters.push(&delivery, &reason);
                rpc::DeadLettersAnswer::Added
            }
            rpc::DeadLetters::Read { from, limit } => {
                rpc::DeadLettersAnswer::Page(st.dead_letters.page(from, limit))
            }
            rpc::DeadLetters::Purge { before } => {
                rpc::DeadLettersAnswer::Purged(st.dead_letters.purge(&before))
            }
        }
    }

    /// The record at `offset` of `partition`, and whether it was dead-lettered.
    pub fn record(&self, partition: u32, offset: u64) -> Option<(Vec<u8>, bool)> {
        let st = self.state.lock().expect("kafka");
        let (_, payload) = st.partitions.get(partition as usize)?.get(offset as usize)?;
        let origin = format!("orders/{partition}@{offset}");
        let dead = st.dead_letters.letters().any(|d| d.origin == origin);
        Some((payload.clone(), dead))
    }

    fn append(&self, key: &str, payload: &[u8]) -> u64 {
        let mut st = self.state.lock().expect("kafka");
        let p = partition_of(key, st.partitions.len());
        st.partitions[p].push((key.to_string(), payload.to_vec()));
        st.partitions[p].len() as u64 - 1
    }
}

pub async fn serve_kafka(log: Arc<KafkaLog>, faults: Arc<Faults>) {
    let ep = Endpoint::bind(addr(rpc::KAFKA)).await.expect("bind kafka");
    let (l, f) = (log.clone(), faults.clone());
    rpc::serve(&ep, move |req: rpc::Produce| {
        let (l, f) = (l.clone(), f.clone());
        async move {
            let knobs = f.knobs();
            delay_up_to(knobs.mq_delay).await;
            if chance(knobs.mq_refuse) {
                f.fired(Fault::MqRefuse);
                return Err("NOT_ENOUGH_REPLICAS".to_string());
            }
            if chance(knobs.mq_lose_after_ack) {
                f.fired(Fault::MqLoseAfterAck);
                if let Ok(r) = Reservation::decode(&req.payload) {
                    l.lost_after_ack.lock().expect("kafka").insert(r.id.to_string());
                }
                return Ok(0);
            }
            if chance(knobs.mq_ack_lost) {
                // The write outlives the producer's timeout (replication is slow): the record is
                // committed — visible to consumers — only after the producer gave up, and the
                // producer never hears. What a producer must treat as "may have happened".
                f.fired(Fault::MqAckLost);
                let lag_ms = madsim::rand::thread_rng().gen_range(400..LATE_APPEND_MAX.as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(lag_ms)).await;
                l.append(&req.key, &req.payload);
                tokio::time::sleep(Duration::from_secs(30)).await;
                return Err("ack lost".to_string());
            }
            if chance(knobs.mq_visible_late) {
                // The leader appended it, a follower in the ISR is slow: the high watermark, and
                // with it the record, moves only when the follower catches up or is dropped
                // from the ISR (`replica.lag.time.max.ms`, 30 s by default) — long after the
                // producer gave up, and after a recovery's quiesce and drain.
                f.fired(Fault::MqVisibleLate);
                let arrived = f.elapsed();
                let floor = LATE_APPEND_MAX.as_millis() as u64 + 600;
                let lag_ms = madsim::rand::thread_rng().gen_range(floor..VISIBLE_LATE_MAX.as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(lag_ms)).await;
                l.append(&req.key, &req.payload);
                if let Ok(r) = Reservation::decode(&req.payload) {
                    let at = (arrived, f.elapsed());
                    l.visible_late.lock().expect("kafka").insert(r.id.to_string(), at);
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
                return Err("ack lost".to_string());
            }
            let offset = l.append(&req.key, &req.payload);
            if chance(knobs.mq_duplicate) {
                f.fired(Fault::MqDuplicate);
                l.append(&req.key, &req.payload);
            }
            Ok(offset)
        }
    });
    let l = log.clone();
    rpc::serve(&ep, move |req: rpc::Fetch| {
        let l = l.clone();
        async move {
            let st = l.state.lock().expect("kafka");
            let Some(part) = st.partitions.get(req.partition as usize) else {
                return Vec::new();
            };
            part.iter()
                .enumerate()
                .skip(req.offset as usize)
                .take(req.max)
                .map(|(offset, (key, payload))| Delivery {
                    trace: None,
                    partition: req.partition,
                    offset: offset as u64,
                    key: key.clone(),
                    payload: payload.clone(),
                })
                .collect()
        }
    });
    let (l, f) = (log.clone(), faults.clone());
    rpc::serve(&ep, move |req: rpc::Commit| {
        let (l, f) = (l.clone(), f.clone());
        async move {
            let mut st = l.state.lock().expect("kafka");
            let group = st.groups.entry(req.group.clone()).or_default();
            let owns = group
                .assignment
                .get(&req.member)
                .is_some_and(|ps| ps.contains(&req.partition));
            if group.generation != req.generation || !owns {
                f.fired(Fired::LateCommitRefused);
                // A revoked member's late commit: Kafka refuses it, the records go to the
                // partition's new owner from the last accepted commit.
                return Err(format!(
                    "ILLEGAL_GENERATION: member {} of generation {} (the group is at {})",
                    req.member, req.generation, group.generation
                ));
            }
            let c = st.committed.entry((req.group, req.partition)).or_insert(0);
            if req.offset > *c {
                let newly = (f.elapsed(), req.partition, *c..req.offset);
                l.commits.lock().expect("kafka").push(newly);
                *c = req.offset;
            }
            Ok(())
        }
    });
    let (l, f) = (log.clone(), faults.clone());
    rpc::serve(&ep, move |req: rpc::GroupSync| {
        let (l, f) = (l.clone(), f.clone());
        async move {
            let mut st = l.state.lock().expect("kafka");
            let partitions = st.partitions.len() as u32;
            let group = st.groups.entry(req.group).or_default();
            if group.sync(&req.member, partitions) {
                f.fired(Fired::GroupRebalance);
            }
            let mine = group.assignment.get(&req.member).cloned().unwrap_or_default();
            (group.generation, mine)
        }
    });
    let (l, f) = (log.clone(), faults.clone());
    rpc::serve(&ep, move |req: rpc::GroupLeave| {
        let (l, f) = (l.clone(), f.clone());
        async move {
            let mut st = l.state.lock().expect("kafka");
            let partitions = st.partitions.len() as u32;
            if st
                .groups
                .entry(req.group)
                .or_default()
                .leave(&req.member, partitions)
            {
                f.fired(Fired::GroupRebalance);
            }
        }
    });
    let l = log.clone();
    rpc::serve(&ep, move |req: rpc::Committed| {
        let l = l.clone();
        async move {
            let st = l.state.lock().expect("kafka");
            st.committed
                .get(&(req.group, req.partition))
                .copied()
                .unwrap_or(0)
        }
    });
    let (l, f) = (log.clone(), faults.clone());
    rpc::serve(&ep, move |req: rpc::Rewind| {
        let (l, f) = (l.clone(), f.clone());
        async move {
            if chance(f.knobs().mq_rewind_fail) {
                f.fired(Fault::MqRewindFail);
                l.rewind_failed.lock().expect("kafka").insert(req.member);
                return Err("seek failed: Local: Erroneous state".to_string());
            }
            if l.rewind_failed.lock().expect("kafka").remove(&req.member) {
                f.cover(Target::RewindRetried);
            }
            let st = l.state.lock().expect("kafka");
            Ok(req
                .partitions
                .into_iter()
                .map(|p| (p, st.committed.get(&(req.group.clone(), p)).copied().unwrap_or(0)))
                .collect())
        }
    });
    let l = log.clone();
    rpc::serve(&ep, move |req: rpc::Lag| {
        let l = l.clone();
        async move { l.lag(&req.group) }
    });
    let l = log;
    rpc::serve(&ep, move |req: rpc::DeadLetters| {
        let l = l.clone();
        async move { l.dead_letters_call(req) }
    });
    std::future::pending::<()>().await;
}

/// `OrderBus` over the network to the Kafka node. A source is a member of its consumer group
/// (a new member every `subscribe`: a restarted consumer joins again): it heartbeats on every
/// poll, takes the partitions the coordinator gives it, rewinds to the committed offsets when the
/// group rebalanced, and its commits carry its generation (refused once it is stale).
#[derive(Clone)]
pub struct SimBus {
    ep: Arc<Endpoint>,
    /// Leaves of the sources dropped from this bus, not yet known to have reached the broker.
    leaving: Arc<Mutex<Vec<rpc::GroupLeave>>>,
}

impl SimBus {
    pub fn new(ep: Arc<Endpoint>) -> Self {
        SimBus {
            ep,
            leaving: Arc::default(),
        }
    }

    async fn dead_letters_call(
        &self,
        op: &'static str,
        req: rpc::DeadLetters,
    ) -> PortResult<rpc::DeadLettersAnswer> {
        (self.ep.call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT).await).map_err(|e| lost(op, e))
    }

    async fn produce(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        let req = rpc::Produce {
            key: key.to_string(),
            payload: payload.to_vec(),
        };
        match self.ep.call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(reason)) => Err(PortError::determinate("publish", reason)),
            Err(e) => Err(lost("publish", e)),
        }
    }
}

impl OrderBus for SimBus {
    type Source = SimSource;

    async fn publish(&self, r: &Reservation) -> PortResult<()> {
        self.produce(&r.bus_key(), &r.encode()).await
    }

    async fn publish_raw(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        self.produce(key, payload).await
    }

    async fn lag(&self, group: &str) -> PortResult<u64> {
        let req = rpc::Lag {
            group: group.to_string(),
        };
        self.ep
            .call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT)
            .await
            .map_err(|e| lost("lag", e))
    }

    async fn dead_letters(&self, from: (u32, u64), limit: usize) -> PortResult<DeadLetterPage> {
        match self
            .dead_letters_call("dead letters", rpc::DeadLetters::Read { from, limit })
            .await?
        {
            rpc::DeadLettersAnswer::Page(page) => Ok(page),
            _ => unreachable!("a read answers a page"),
        }
    }

    async fn purge_dead_letters(&self, before: &[(u32, u64)]) -> PortResult<u64> {
        let req = rpc::DeadLetters::Purge {
            before: before.to_vec(),
        };
        match self.dead_letters_call("purge dead letters", req).await? {
            rpc::DeadLettersAnswer::Purged(n) => Ok(n),
            _ => unreachable!("a purge answers a count"),
        }
    }

    async fn subscribe(&self, group: &str) -> PortResult<SimSource> {
        // The leaves of the sources dropped before first, as a closed rdkafka consumer has left
        // its group by the time its close returns (a second send of one changes nothing).
        let leaving = std::mem::take(&mut *self.leaving.lock().expect("leaving"));
        for leave in leaving {
            let _ = self.ep.call_timeout(addr(rpc::KAFKA), leave, STORE_TIMEOUT).await;
        }
        Ok(SimSource {
            ep: self.ep.clone(),
            leaving: self.leaving.clone(),
            group: group.to_string(),
            member: format!("member-{:016x}", madsim::rand::thread_rng().gen::<u64>()),
            generation: None,
            owned: Vec::new(),
            positions: BTreeMap::new(),
        })
    }
}

pub struct SimSource {
    ep: Arc<Endpoint>,
    leaving: Arc<Mutex<Vec<rpc::GroupLeave>>>,
    group: String,
    member: String,
    /// The generation `owned` was assigned in (`None` before the first heartbeat).
    generation: Option<u64>,
    owned: Vec<u32>,
    /// Next offset per owned partition; empty after a rewind (re-read from committed).
    positions: BTreeMap<u32, u64>,
}

/// A source dropped leaves its group, as rdkafka's consumer does when it closes. A crashed
/// process leaves nothing: on a killed node the leave is spawned but never runs (madsim), so its
/// partitions wait for the session timeout, as Kafka's do.
impl Drop for SimSource {
    fn drop(&mut self) {
        let leave = rpc::GroupLeave {
            group: self.group.clone(),
            member: self.member.clone(),
        };
        self.leaving.lock().expect("leaving").push(leave.clone());
        let ep = self.ep.clone();
        madsim::task::spawn(async move {
            let _ = ep.call_timeout(addr(rpc::KAFKA), leave, STORE_TIMEOUT).await;
        });
    }
}

impl OrderSource for SimSource {
    async fn poll(&mut self, max: usize) -> PortResult<Vec<Delivery>> {
        let kafka = addr(rpc::KAFKA);
        let sync = rpc::GroupSync {
            group: self.group.clone(),
            member: self.member.clone(),
        };
        let (generation, owned) = self
            .ep
            .call_timeout(kafka, sync, STORE_TIMEOUT)
            .await
            .map_err(|e| lost("poll", e))?;
        if self.generation != Some(generation) {
            // Rebalanced: the partitions may have changed hands; read on from the commits.
            self.generation = Some(generation);
            self.owned = owned;
            self.positions.clear();
        }
        let mut out = Vec::new();
        // Positions move only when the whole poll succeeds: records fetched from one partition
        // before another partition's request failed are not returned, so they must come again.
        let mut positions = self.positions.clone();
        for p in self.owned.clone() {
            if out.len() >= max {
                break;
            }
            let pos = match positions.get(&p) {
                Some(pos) => *pos,
                None => {
                    let req = rpc::Committed {
                        group: self.group.clone(),
                        partition: p,
                    };
                    let c = self
                        .ep
                        .call_timeout(kafka, req, STORE_TIMEOUT)
                        .await
                        .map_err(|e| lost("poll", e))?;
                    positions.insert(p, c);
                    c
                }
            };
            let req = rpc::Fetch {
                partition: p,
                offset: pos,
                max: max - out.len(),
            };
            let got = self
                .ep
                .call_timeout(kafka, req, STORE_TIMEOUT)
                .await
                .map_err(|e| lost("poll", e))?;
            if let Some(last) = got.last() {
                positions.insert(p, last.offset + 1);
            }
            out.extend(got);
        }
        self.positions = positions;
        if out.is_empty() {
            tokio::time::sleep(POLL_WAIT).await;
        }
        Ok(out)
    }

    async fn commit(&mut self, batch: &[Delivery]) -> PortResult<()> {
        let mut upto: BTreeMap<u32, u64> = BTreeMap::new();
        for d in batch {
            let e = upto.entry(d.partition).or_insert(0);
            *e = (*e).max(d.offset + 1);
        }
        for (partition, offset) in upto {
            let req = rpc::Commit {
                group: self.group.clone(),
                member: self.member.clone(),
                generation: self.generation.unwrap_or(0),
                partition,
                offset,
            };
            self.ep
                .call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT)
                .await
                .map_err(|e| lost("commit", e))?
                .map_err(|refused| PortError::determinate("commit", refused))?;
        }
        Ok(())
    }

    async fn dead_letter(&mut self, d: &Delivery, reason: &str) -> PortResult<()> {
        let req = rpc::DeadLetters::Add {
            delivery: d.clone(),
            reason: reason.to_string(),
        };
        (self.ep.call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT).await)
            .map(drop)
            .map_err(|e| lost("dead letter", e))
    }

    /// As rdkafka's: read the group's committed offsets from the broker and seek every owned
    /// partition to them. A rewind that fails (the broker out of reach, a seek refused) leaves
    /// the positions where the last poll left them — past the records of a failed batch.
    async fn rewind(&mut self) -> PortResult<()> {
        let req = rpc::Rewind {
            group: self.group.clone(),
            member: self.member.clone(),
            partitions: self.owned.clone(),
        };
        self.positions = self
            .ep
            .call_timeout(addr(rpc::KAFKA), req, STORE_TIMEOUT)
            .await
            .map_err(|e| lost("rewind", e))?
            .map_err(|refused| PortError::determinate("rewind", refused))?;
        Ok(())
    }
}
