//! The `StockCache` over any connection that can run our Lua scripts: real Redis, a Redis
//! Cluster, the embedded model or a simulated Redis node. Key names, script arguments and reply
//! shapes live here once; a backend only supplies `ScriptConn` (EVALSHA + SCRIPT LOAD).
//!
//! The reserve/release/settle logic itself lives only in `lua/`. This file builds arguments,
//! checks them before the call and checks the reply's shape after it (a reply of the wrong shape
//! means we do not know what happened: `Indeterminate`).

use crate::domain::{ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId};
use crate::ports::{
    BucketImage, CacheBucket, CacheView, Claim, Gate, GateWrite, GaveUp, Intent, MetaView, PendingMark,
    PortError, PortResult, Rebuilt, ReleaseKind, Released, ReserveOutcome, StockCache, Transfer, WarmFrom,
    WarmupReport,
};
use std::future::Future;
use std::sync::OnceLock;

/// A RESP2 reply, as Redis (or the model) returns it from a script.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Error(String),
    Array(Vec<Reply>),
}

/// The scripts under `lua/`, embedded at build time and called by SHA1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Script {
    Warmup,
    Reserve,
    Release,
    Settle,
    Inspect,
    Rebuild,
    Transfer,
    Gate,
}

impl Script {
    pub const ALL: [Script; 8] = [
        Script::Warmup,
        Script::Reserve,
        Script::Release,
        Script::Settle,
        Script::Inspect,
        Script::Rebuild,
        Script::Transfer,
        Script::Gate,
    ];

    pub fn source(self) -> &'static str {
        match self {
            Script::Warmup => include_str!("../../../../lua/warmup.lua"),
            Script::Reserve => include_str!("../../../../lua/reserve.lua"),
            Script::Release => include_str!("../../../../lua/release.lua"),
            Script::Settle => include_str!("../../../../lua/settle.lua"),
            Script::Inspect => include_str!("../../../../lua/inspect.lua"),
            Script::Rebuild => include_str!("../../../../lua/rebuild.lua"),
            Script::Transfer => include_str!("../../../../lua/transfer.lua"),
            Script::Gate => include_str!("../../../../lua/gate.lua"),
        }
    }

    /// The SHA1 Redis knows the script by, computed once per process.
    pub fn sha1(self) -> &'static str {
        static SHAS: OnceLock<Vec<String>> = OnceLock::new();
        let shas = SHAS.get_or_init(|| Script::ALL.iter().map(|s| sha1_hex(s.source())).collect());
        &shas[self as usize]
    }
}

pub fn sha1_hex(source: &str) -> String {
    sha1_smol::Sha1::from(source).digest().to_string()
}

/// What a backend must offer to run the scripts. Transport failures are `PortError`s; anything
/// Redis answered (including `NOSCRIPT` and script errors) is a `Reply`.
pub trait ScriptConn: Clone + Send + Sync + 'static {
    fn eval_sha(
        &self,
        sha: &str,
        keys: &[String],
        args: &[String],
    ) -> impl Future<Output = PortResult<Reply>> + Send;

    fn script_load(&self, source: &str) -> impl Future<Output = PortResult<()>> + Send;

    /// The server's run id (`INFO server` → `run_id`), which changes on every restart: how the
    /// recovery job notices that Redis may have lost data.
    fn run_id(&self) -> impl Future<Output = PortResult<String>> + Send;
}

pub fn stock_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:stock")
}
pub fn buyers_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:buyers")
}
pub fn resv_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:resv")
}
pub fn xfer_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:xfer")
}
pub fn gate_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:gate")
}
pub fn void_key(a: ActivityId, b: BucketNo) -> String {
    format!("sk:{{{a}.{b}}}:void")
}
pub fn meta_key(a: ActivityId) -> String {
    format!("sk:{{{a}}}:meta")
}

/// `reserve.lua`'s keys for bucket `b`.
fn reserve_keys(a: ActivityId, b: BucketNo) -> Vec<String> {
    vec![
        stock_key(a, b),
        buyers_key(a, b),
        resv_key(a, b),
        gate_key(a, b),
        void_key(a, b),
    ]
}

fn bucket_keys(a: ActivityId, b: BucketNo) -> Vec<String> {
    vec![
        stock_key(a, b),
        buyers_key(a, b),
        resv_key(a, b),
        xfer_key(a, b),
        gate_key(a, b),
    ]
}

/// A gate's value as `gate.lua` writes it: `state|intent|version|generation|fence`. `None`: not
/// a gate value.
pub fn parse_gate(value: &str) -> Option<Gate> {
    let parts: Vec<&str> = value.split('|').collect();
    let [state, intent, version, generation, fence] = parts.as_slice() else {
        return None;
    };
    Some(Gate {
        state: ActivityState::parse(state)?,
        intent: ActivityState::parse(intent)?,
        version: version.parse().ok()?,
        generation: generation.parse().ok()?,
        fence: (!fence.is_empty()).then(|| fence.to_string()),
    })
}

fn intent_args(intent: &Intent) -> [String; 3] {
    [
        intent.state.as_str().to_string(),
        intent.version.to_string(),
        intent.generation.to_string(),
    ]
}

/// What one `reserve.lua` call on one bucket answered.
enum Step {
    Reserved,
    Duplicate,
    Empty,
    /// The own bucket was empty and left the pending-fallback mark, under this generation.
    Pending(u64),
    NotWarmed,
    Gated(ActivityState),
    /// A fallback attempt the reconciler gave up before it arrived: nothing was taken.
    Voided,
    /// A fallback attempt that arrived after a recovery rebuilt Redis (which dropped its own
    /// bucket's mark, left under the older generation): nothing was taken.
    Stale,
}

/// What one `reserve.lua` call is.
#[derive(Clone, Copy)]
enum Attempt {
    /// The user's own bucket; with `mark_pending`, an empty one leaves the pending-fallback mark.
    Own { mark_pending: bool },
    /// The fallback bucket, after the own bucket left its mark under `generation`.
    Fallback { generation: u64 },
}

/// `StockCache` for every backend that speaks scripts.
#[derive(Clone)]
pub struct ScriptedStockCache<C> {
    conn: C,
}

fn bad_reply(op: &'static str, reply: &Reply) -> PortError {
    PortError::indeterminate(op, format!("unexpected reply {reply:?}"))
}

fn as_str(r: &Reply) -> Option<&str> {
    match r {
        Reply::Bulk(b) => std::str::from_utf8(b).ok(),
        Reply::Status(s) => Some(s),
        _ => None,
    }
}

/// A reply of the form `{"tag", ...}`: the tag and the rest.
fn tagged<'r>(op: &'static str, reply: &'r Reply) -> PortResult<(&'r str, &'r [Reply])> {
    if let Reply::Array(items) = reply {
        if let Some(tag) = items.first().and_then(as_str) {
            return Ok((tag, &items[1..]));
        }
    }
    Err(bad_reply(op, reply))
}

/// A flat `field, value, field, value …` array as string pairs.
fn pairs(op: &'static str, reply: &Reply) -> PortResult<Vec<(String, String)>> {
    let Reply::Array(items) = reply else {
        return Err(bad_reply(op, reply));
    };
    if items.len() % 2 != 0 {
        return Err(bad_reply(op, reply));
    }
    items
        .chunks(2)
        .map(|kv| match (as_str(&kv[0]), as_str(&kv[1])) {
            (Some(k), Some(v)) => Ok((k.to_string(), v.to_string())),
            _ => Err(bad_reply(op, reply)),
        })
        .collect()
}

impl<C: ScriptConn> ScriptedStockCache<C> {
    pub fn new(conn: C) -> Self {
        ScriptedStockCache { conn }
    }

    pub fn conn(&self) -> &C {
        &self.conn
    }

    async fn view(&self, plan: &StockPlan, buyers: bool) -> PortResult<CacheView> {
        let meta = self.meta(plan.activity).await?;
        let mut buckets = Vec::with_capacity(plan.units.len());
        for b in plan.all_buckets() {
            buckets.push(self.inspect_bucket(plan, b, buyers).await?);
        }
        Ok(CacheView { meta, buckets })
    }

    /// EVALSHA, loading the script once on NOSCRIPT (it certainly did not run then).
    async fn run(
        &self,
        op: &'static str,
        script: Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> PortResult<Reply> {
        let mut reply = self.conn.eval_sha(script.sha1(), &keys, &args).await?;
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            self.conn.script_load(script.source()).await?;
            reply = self.conn.eval_sha(script.sha1(), &keys, &args).await?;
        }
        match reply {
            // Our scripts check their arguments before any write, so an error reply changed nothing.
            Reply::Error(e) => Err(PortError::determinate(op, e)),
            ok => Ok(ok),
        }
    }

    /// `gate.lua` on one bucket's gate.
    async fn run_gate(
        &self,
        op: &'static str,
        a: ActivityId,
        b: BucketNo,
        args: Vec<String>,
    ) -> PortResult<Reply> {
        self.run(op, Script::Gate, vec![gate_key(a, b)], args).await
    }

    /// `warmup.lua` on the activity's meta.
    async fn run_meta(&self, op: &'static str, a: ActivityId, args: Vec<String>) -> PortResult<Reply> {
        self.run(op, Script::Warmup, vec![meta_key(a)], args).await
    }

    /// Run `reserve.lua` (op "own" or "fallback") for `candidate` on `candidate.bucket`.
    async fn reserve_in(&self, attempt: Attempt, candidate: &mut Reservation) -> PortResult<Step> {
        let (a, bucket) = (candidate.activity, candidate.bucket);
        let keys = reserve_keys(a, bucket);
        let op = match attempt {
            Attempt::Own { .. } => "own",
            Attempt::Fallback { .. } => "fallback",
        };
        let mut args = vec![
            op.to_string(),
            candidate.user.to_string(),
            candidate.qty.to_string(),
            candidate.id.to_string(),
            candidate.reserved_at_ms.to_string(),
            bucket.to_string(),
        ];
        args.push(match attempt {
            Attempt::Own { mark_pending } => if mark_pending { "1" } else { "0" }.to_string(),
            Attempt::Fallback { generation } => generation.to_string(),
        });
        let reply = if crate::planted::on(crate::planted::Bug::GateNotChecked) {
            self.planted_ungated_reserve(&keys, &args).await?
        } else {
            self.run("reserve", Script::Reserve, keys, args).await?
        };
        let (tag, rest) = tagged("reserve", &reply)?;
        Ok(match (tag, rest) {
            ("reserved", [Reply::Int(b), Reply::Int(g)]) if *b == bucket.0 as i64 && *g >= 0 => {
                candidate.generation = *g as u64;
                Step::Reserved
            }
            ("duplicate", []) => Step::Duplicate,
            ("empty", []) => Step::Empty,
            ("pending", [Reply::Int(g)]) if op == "own" && *g >= 0 => Step::Pending(*g as u64),
            ("voided", []) if op == "fallback" => Step::Voided,
            ("stale", []) if op == "fallback" => Step::Stale,
            ("not_warmed", []) => Step::NotWarmed,
            ("gated", [state]) => match as_str(state).and_then(ActivityState::parse) {
                Some(state) => Step::Gated(state),
                None => return Err(bad_reply("reserve", &reply)),
            },
            _ => return Err(bad_reply("reserve", &reply)),
        })
    }

    /// Planted `GateNotChecked`: `reserve.lua` with its gate check cut out (a reserve on a missing
    /// gate stamps generation 0).
    async fn planted_ungated_reserve(&self, keys: &[String], args: &[String]) -> PortResult<Reply> {
        let source = Script::Reserve
            .source()
            .replace(
                "if not gate then\n  return {\"gated\", \"closed\"}\nend",
                "gate = gate or \"open|open|0|0|\"",
            )
            .replace("if state ~= \"open\" then", "if false then");
        assert_ne!(source, Script::Reserve.source(), "the planted edit must apply");
        self.conn.script_load(&source).await?;
        self.conn.eval_sha(&sha1_hex(&source), keys, args).await
    }

    /// Planted `NonAtomicReserve`: read in one call, decrement in another, from Rust.
    async fn planted_non_atomic_reserve(&self, r: &Reservation) -> PortResult<ReserveOutcome> {
        const READ: &str = "if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return -1 end \
                            return tonumber(redis.call('GET', KEYS[1]) or '-2')";
        const TAKE: &str = "redis.call('DECRBY', KEYS[1], ARGV[2]) redis.call('SADD', KEYS[2], ARGV[1]) \
                            redis.call('HSET', KEYS[3], ARGV[3], ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[4] .. '|0') \
                            return 1";
        let keys = vec![
            stock_key(r.activity, r.bucket),
            buyers_key(r.activity, r.bucket),
            resv_key(r.activity, r.bucket),
        ];
        self.conn.script_load(READ).await?;
        let stock = self
            .conn
            .eval_sha(&sha1_hex(READ), &keys, &[r.user.to_string()])
            .await?;
        match stock {
            Reply::Int(-1) => Ok(ReserveOutcome::Duplicate),
            Reply::Int(-2) => Ok(ReserveOutcome::NotWarmed),
            Reply::Int(n) if n >= r.qty as i64 => {
                let args = [
                    r.user.to_string(),
                    r.qty.to_string(),
                    r.id.to_string(),
                    r.reserved_at_ms.to_string(),
                ];
                self.conn.script_load(TAKE).await?;
                self.conn.eval_sha(&sha1_hex(TAKE), &keys, &args).await?;
                Ok(ReserveOutcome::Reserved(r.clone()))
            }
            _ => Ok(ReserveOutcome::Empty),
        }
    }

    async fn inspect_bucket(&self, plan: &StockPlan, b: BucketNo, buyers: bool) -> PortResult<CacheBucket> {
        const OP: &str = "snapshot";
        let mut args = vec!["bucket".to_string()];
        if !buyers {
            args.push("summary".into());
        }
        let reply = self
            .run(OP, Script::Inspect, bucket_keys(plan.activity, b), args)
            .await?;
        let Reply::Array(items) = &reply else {
            return Err(bad_reply(OP, &reply));
        };
        let [Reply::Int(exists), Reply::Int(stock), Reply::Array(buyers), resv, xfer, gate] =
            items.as_slice()
        else {
            return Err(bad_reply(OP, &reply));
        };
        let gate = as_str(gate).ok_or_else(|| bad_reply(OP, gate))?;
        let members = buyers
            .iter()
            .map(|m| as_str(m).ok_or_else(|| bad_reply(OP, m)))
            .collect::<PortResult<Vec<&str>>>()?;
        let (resv, xfer) = (pairs(OP, resv)?, pairs(OP, xfer)?);
        decode_bucket(
            plan,
            b,
            (*exists == 1).then_some(*stock),
            members,
            resv.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            xfer.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            (!gate.is_empty()).then_some(gate),
        )
    }
}

/// An open reservation of bucket `b` from its outbox entry's value:
/// "<user>|<qty>|<reserved_at_ms>|<generation>", and "|r" once the reconciler adopted it.
fn outbox_entry(plan: &StockPlan, b: BucketNo, id: ReservationId, value: &str) -> Option<Reservation> {
    let value_only = value.strip_suffix("|r").unwrap_or(value);
    let parts: Result<Vec<u64>, _> = value_only.split('|').map(str::parse).collect();
    let Ok([user, qty, at, generation]) = parts.as_deref() else {
        return None;
    };
    Some(Reservation {
        id,
        activity: plan.activity,
        user: UserId(*user),
        bucket: b,
        qty: u32::try_from(*qty).ok()?,
        reserved_at_ms: *at,
        generation: *generation,
    })
}

/// One bucket's keys as the DESIGN §4 contract writes them — the stock, the buyer set's members,
/// the `resv` and `xfer` hashes' fields, the gate — decoded into a `CacheBucket`. The one decoder of that
/// contract: `inspect.lua`'s replies and a raw read of a keyspace (the simulation's checker)
/// both come through here.
pub fn decode_bucket<'a>(
    plan: &StockPlan,
    b: BucketNo,
    stock: Option<i64>,
    buyers: impl IntoIterator<Item = &'a str>,
    resv: impl IntoIterator<Item = (&'a str, &'a str)>,
    xfer: impl IntoIterator<Item = (&'a str, &'a str)>,
    gate: Option<&str>,
) -> PortResult<CacheBucket> {
    const OP: &str = "snapshot";
    let unparsable = |what: &str, field: &str| {
        PortError::determinate(OP, format!("bucket {b}: cannot parse {what} entry {field:?}"))
    };
    let mut out = CacheBucket {
        bucket: b,
        stock,
        buyers: Vec::new(),
        open: Vec::new(),
        pending: Vec::new(),
        transfers_in: 0,
        transfers_out: 0,
        cancelled_released: Vec::new(),
        transfers_in_flight: Vec::new(),
        gate: gate
            .map(|g| parse_gate(g).ok_or_else(|| unparsable("gate", g)))
            .transpose()?,
    };
    for m in buyers {
        let user = m.parse().map_err(|_| unparsable("buyers", m))?;
        out.buyers.push(UserId(user));
    }
    out.buyers.sort();
    for (field, value) in resv {
        if let Some(user) = field.strip_prefix("pending:") {
            let user = user.parse().map_err(|_| unparsable("pending", field))?;
            let mut parts = value.split('|');
            let (Some(Ok(reservation)), Some(Ok(since_ms))) =
                (parts.next().map(str::parse), parts.next().map(str::parse))
            else {
                return Err(unparsable("pending", value));
            };
            out.pending.push(PendingMark {
                user: UserId(user),
                reservation,
                since_ms,
            });
            continue;
        }
        let id: ReservationId = field.parse().map_err(|_| unparsable("resv", field))?;
        let open = outbox_entry(plan, b, id, value).ok_or_else(|| unparsable("resv", value))?;
        out.open.push(open);
    }
    let mut acked = std::collections::BTreeSet::new();
    for (field, value) in xfer {
        let units = |v: &str| v.parse::<u64>().map_err(|_| unparsable("xfer", value));
        if let Some(rid) = field.strip_prefix("rel:") {
            out.cancelled_released
                .push(rid.parse().map_err(|_| unparsable("xfer", field))?);
        } else if field.starts_with("give:") {
            out.transfers_in += units(value)?;
        } else if let Some(tid) = field.strip_prefix("take:") {
            // "<units>|<target>|<generation>"; a take recorded before transfers carried their
            // generation reads as generation 0, as a v1 order message does.
            let mut parts = value.split('|');
            let (Some(n), Some(to), generation, None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(unparsable("xfer", value));
            };
            let n = units(n)?;
            out.transfers_out += n;
            out.transfers_in_flight.push(Transfer {
                id: tid.to_string(),
                from: b,
                to: BucketNo(to.parse().map_err(|_| unparsable("xfer", value))?),
                units: n,
                generation: generation.map_or(Ok(0), units)?,
            });
        } else if let Some(tid) = field.strip_prefix("ack:") {
            acked.insert(tid.to_string());
        } else if field.starts_with("fail:") {
            // A failed order's user was freed here (release.lua "failed"): no units moved.
        } else {
            return Err(unparsable("xfer", field));
        }
    }
    out.transfers_in_flight.retain(|t| !acked.contains(&t.id));
    Ok(out)
}

impl<C: ScriptConn> StockCache for ScriptedStockCache<C> {
    async fn warmup(&self, plan: &StockPlan, intent: &Intent, from: WarmFrom) -> PortResult<WarmupReport> {
        // The run id before any key: if Redis restarts (empty) while this warmup writes, the
        // meta it creates names the run before, and the recovery's check sees the loss.
        let epoch = self.conn.run_id().await?;
        let mut report = WarmupReport::default();
        let from = match from {
            WarmFrom::Plan => "plan",
            WarmFrom::Installed => "installed",
        };
        for b in plan.all_buckets() {
            let args = vec!["bucket".into(), plan.initial(b).to_string(), from.into()];
            let keys = vec![stock_key(plan.activity, b), gate_key(plan.activity, b)];
            let reply = self.run("warmup", Script::Warmup, keys, args).await?;
            match tagged("warmup", &reply)? {
                ("created", [Reply::Int(_)]) => report.created += 1,
                ("exists", [Reply::Int(_)]) => report.existing += 1,
                ("lost", []) => report.lost += 1,
                _ => return Err(bad_reply("warmup", &reply)),
            }
        }
        if report.lost > 0 {
            return Ok(report);
        }
        for b in plan.all_buckets() {
            let mut args = vec!["init".to_string()];
            args.extend(intent_args(intent));
            let reply = self.run_gate("warmup", plan.activity, b, args).await?;
            match tagged("warmup", &reply)? {
                ("created" | "exists", []) => {}
                _ => return Err(bad_reply("warmup", &reply)),
            }
        }
        let args = vec![
            "meta".into(),
            plan.version.clone(),
            plan.buckets().to_string(),
            epoch,
        ];
        let reply = self.run_meta("warmup", plan.activity, args).await?;
        match tagged("warmup", &reply)? {
            ("created" | "exists", []) => Ok(report),
            _ => Err(bad_reply("warmup", &reply)),
        }
    }

    async fn reserve(
        &self,
        plan: &StockPlan,
        user: UserId,
        qty: u32,
        id: ReservationId,
        now_ms: u64,
    ) -> PortResult<ReserveOutcome> {
        if qty == 0 {
            return Err(PortError::determinate("reserve", "qty must be at least 1"));
        }
        let mut own = Reservation {
            id,
            activity: plan.activity,
            user,
            bucket: plan.route(user),
            qty,
            reserved_at_ms: now_ms,
            generation: 0,
        };
        if crate::planted::on(crate::planted::Bug::NonAtomicReserve) {
            return self.planted_non_atomic_reserve(&own).await;
        }
        let mark_pending = plan.has_fallback();
        let mark_pending =
            mark_pending && !crate::planted::on(crate::planted::Bug::FallbackWithoutPendingMark);
        let generation = match self.reserve_in(Attempt::Own { mark_pending }, &mut own).await? {
            Step::Reserved => return Ok(ReserveOutcome::Reserved(own)),
            Step::Duplicate => return Ok(ReserveOutcome::Duplicate),
            Step::NotWarmed => return Ok(ReserveOutcome::NotWarmed),
            Step::Gated(state) => return Ok(ReserveOutcome::Gated(state)),
            Step::Empty => {
                // With its mark, an own reserve answers "pending", never "empty", where a
                // fallback exists.
                if crate::planted::on(crate::planted::Bug::FallbackWithoutPendingMark) && plan.has_fallback()
                {
                    // Planted: fall back with no mark left in the own bucket.
                    let mut fallback = Reservation {
                        bucket: plan.fallback_bucket(),
                        ..own
                    };
                    // Whatever generation the fallback's gate has: no mark to keep in step with.
                    let gate = self
                        .run_gate("read", fallback.activity, fallback.bucket, vec!["read".into()])
                        .await?;
                    let generation = as_str(&gate).and_then(parse_gate).map_or(0, |g| g.generation);
                    let attempt = Attempt::Fallback { generation };
                    return Ok(match self.reserve_in(attempt, &mut fallback).await? {
                        Step::Reserved => ReserveOutcome::Reserved(fallback),
                        Step::Duplicate => ReserveOutcome::Duplicate,
                        _ => ReserveOutcome::Empty,
                    });
                }
                return Ok(ReserveOutcome::Empty);
            }
            Step::Pending(generation) => generation,
            Step::Voided | Step::Stale => {
                unreachable!("reserve_in answers Voided and Stale to a fallback reserve only")
            }
        };
        // Fault point: a process stalled between its own bucket's pending mark and the fallback
        // reserve, past the reconciler's grace period (which gives the attempt up meanwhile).
        crate::planted::stall(8, std::time::Duration::from_millis(3_000)).await;
        // The own bucket left a pending mark: try the fallback. A unit won there keeps the
        // mark pending until the caller knows the publish's outcome (DESIGN §4): the caller
        // resolves it, or the reconciler does if the caller never comes back. Any other outcome
        // resolves it here; if that resolve fails, the reconciler clears the stale mark.
        let mut fallback = Reservation {
            bucket: plan.fallback_bucket(),
            ..own.clone()
        };
        let step = match self
            .reserve_in(Attempt::Fallback { generation }, &mut fallback)
            .await
        {
            Ok(step) => step,
            Err(e) if e.is_indeterminate() => return Err(e),
            Err(e) => {
                let _ = StockCache::resolve_pending(self, plan, user, id, false).await;
                return Err(e);
            }
        };
        let (keep, result) = match step {
            Step::Reserved => return Ok(ReserveOutcome::Reserved(fallback)),
            // Queued behind a slow Redis past the reconciler's grace period, which gave the
            // attempt up and cleared the mark (resolving now could clear a newer attempt's).
            Step::Voided => {
                return Err(PortError::determinate(
                    "reserve",
                    "the fallback attempt arrived after the reconciler gave it up; nothing was taken",
                ))
            }
            // Nothing was taken. The rebuild dropped the own bucket's mark (it marks the ledger's
            // buyers only): the resolve below finds nothing of this attempt's to clear.
            Step::Stale => (
                false,
                Err(PortError::determinate(
                    "reserve",
                    "a recovery rebuilt Redis during the fallback attempt; nothing was taken",
                )),
            ),
            Step::Duplicate => (true, Ok(ReserveOutcome::Duplicate)),
            Step::NotWarmed => (false, Ok(ReserveOutcome::NotWarmed)),
            Step::Gated(state) => (false, Ok(ReserveOutcome::Gated(state))),
            Step::Empty | Step::Pending(_) => (false, Ok(ReserveOutcome::Empty)),
        };
        // Fault point: stalled between the fallback's answer and the resolve of the own bucket's
        // mark, past the grace period: the resolve arrives late, perhaps after a newer attempt.
        crate::planted::stall(8, std::time::Duration::from_millis(3_000)).await;
        let _ = StockCache::resolve_pending(self, plan, user, id, keep).await;
        result
    }

    async fn release(&self, r: &Reservation, kind: ReleaseKind) -> PortResult<Released> {
        let mode = match kind {
            ReleaseKind::Unpublished => "unpublished",
            ReleaseKind::Rejected => "rejected",
            ReleaseKind::Cancelled => "cancelled",
        };
        let args = vec![
            mode.into(),
            r.id.to_string(),
            r.user.to_string(),
            r.qty.to_string(),
        ];
        let reply = self
            .run(
                "release",
                Script::Release,
                bucket_keys(r.activity, r.bucket),
                args,
            )
            .await?;
        match tagged("release", &reply)? {
            ("released", [Reply::Int(_)]) => Ok(Released::Released),
            ("absent", []) => Ok(Released::Absent),
            // The reconciler is republishing it: not the purchase's to give back.
            ("adopted", []) => Ok(Released::Adopted),
            // A cancel's units cannot go back to a bucket Redis lost: not released yet (the
            // reconciler gives them back after the recovery's rebuild, if it did not).
            ("missing", []) => Err(PortError::determinate(
                "release",
                format!(
                    "bucket {} of activity {} has no stock key (Redis lost it; the recovery rebuilds it)",
                    r.bucket, r.activity
                ),
            )),
            _ => Err(bad_reply("release", &reply)),
        }
    }

    async fn free_failed(&self, plan: &StockPlan, r: &Reservation) -> PortResult<bool> {
        // The user's own bucket first: while the unit's bucket still holds the open entry, a
        // failure between the two leaves it for the reconciler, which frees both again.
        let own = plan.route(r.user);
        let mut freed = false;
        let buckets = if own == r.bucket {
            vec![own]
        } else {
            vec![own, r.bucket]
        };
        for b in buckets {
            let args = vec![
                "failed".into(),
                r.id.to_string(),
                r.user.to_string(),
                r.qty.to_string(),
                r.generation.to_string(),
            ];
            let reply = self
                .run("free failed", Script::Release, bucket_keys(r.activity, b), args)
                .await?;
            match tagged("free failed", &reply)? {
                ("freed", [Reply::Int(n @ (0 | 1))]) => freed |= *n == 1,
                ("missing", []) => {
                    return Err(PortError::determinate(
                        "free failed",
                        format!(
                            "bucket {b} of activity {} has no stock key (Redis lost it; the recovery rebuilds it)",
                            r.activity
                        ),
                    ))
                }
                _ => return Err(bad_reply("free failed", &reply)),
            }
        }
        Ok(freed)
    }

    async fn settle(&self, r: &Reservation) -> PortResult<bool> {
        let reply = self
            .run(
                "settle",
                Script::Settle,
                vec![resv_key(r.activity, r.bucket)],
                vec![r.id.to_string()],
            )
            .await?;
        match tagged("settle", &reply)? {
            ("settled", []) => Ok(true),
            ("absent", []) => Ok(false),
            _ => Err(bad_reply("settle", &reply)),
        }
    }

    async fn holds(&self, plan: &StockPlan, user: UserId) -> PortResult<bool> {
        let keys = vec![buyers_key(plan.activity, plan.route(user))];
        let reply = self
            .run(
                "holds",
                Script::Inspect,
                keys,
                vec!["buyer".into(), user.to_string()],
            )
            .await?;
        match reply {
            Reply::Int(n @ (0 | 1)) => Ok(n == 1),
            other => Err(bad_reply("holds", &other)),
        }
    }

    async fn open_reservation(
        &self,
        plan: &StockPlan,
        b: BucketNo,
        id: ReservationId,
    ) -> PortResult<Option<Reservation>> {
        let keys = vec![resv_key(plan.activity, b)];
        let reply = self
            .run(
                "open reservation",
                Script::Inspect,
                keys,
                vec!["open".into(), id.to_string()],
            )
            .await?;
        match &reply {
            Reply::Nil => Ok(None),
            Reply::Bulk(v) => {
                let v = String::from_utf8_lossy(v);
                outbox_entry(plan, b, id, &v).map(Some).ok_or_else(|| {
                    PortError::determinate("open reservation", format!("cannot parse resv entry {v:?}"))
                })
            }
            other => Err(bad_reply("open reservation", other)),
        }
    }

    async fn meta(&self, activity: ActivityId) -> PortResult<Option<MetaView>> {
        let reply = self
            .run(
                "meta",
                Script::Inspect,
                vec![meta_key(activity)],
                vec!["meta".into()],
            )
            .await?;
        let fields = pairs("meta", &reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let (Some(version), Some(buckets)) = (get("version"), get("buckets")) else {
            return Err(bad_reply("meta", &reply));
        };
        Ok(Some(MetaView {
            version: version.to_string(),
            buckets: buckets.parse().map_err(|_| bad_reply("meta", &reply))?,
            epoch: get("epoch").filter(|e| !e.is_empty()).map(str::to_string),
            moves: get("moves").map_or(Ok(0), |m| m.parse().map_err(|_| bad_reply("meta", &reply)))?,
            claim: get("claim").map(str::to_string),
        }))
    }

    async fn set_gates(&self, plan: &StockPlan, intent: &Intent) -> PortResult<Vec<GateWrite>> {
        let mut out = Vec::with_capacity(plan.units.len());
        for b in plan.all_buckets() {
            let mut args = vec!["set".to_string()];
            args.extend(intent_args(intent));
            let reply = self.run_gate("set gates", plan.activity, b, args).await?;
            out.push(match tagged("set gates", &reply)? {
                ("ok", []) => GateWrite::Applied,
                ("recovering", []) => GateWrite::Recorded,
                ("stale", []) => GateWrite::Stale,
                ("missing", []) => GateWrite::Missing,
                _ => return Err(bad_reply("set gates", &reply)),
            });
        }
        Ok(out)
    }

    async fn claim(&self, plan: &StockPlan, fence: &str, lease_ms: u64) -> PortResult<Claim> {
        let args = vec![
            "claim".into(),
            fence.to_string(),
            lease_ms.to_string(),
            plan.version.clone(),
            plan.buckets().to_string(),
        ];
        let reply = self.run_meta("claim", plan.activity, args).await?;
        match tagged("claim", &reply)? {
            ("claimed", [previous]) => {
                let previous = as_str(previous).ok_or_else(|| bad_reply("claim", &reply))?;
                Ok(Claim::Claimed {
                    previous: (!previous.is_empty()).then(|| previous.to_string()),
                })
            }
            ("busy", [holder, Reply::Int(left)]) => Ok(Claim::Busy {
                fence: as_str(holder)
                    .ok_or_else(|| bad_reply("claim", &reply))?
                    .to_string(),
                ms_left: (*left).max(0) as u64,
            }),
            _ => Err(bad_reply("claim", &reply)),
        }
    }

    async fn renew(&self, plan: &StockPlan, fence: &str, lease_ms: u64) -> PortResult<bool> {
        let args = vec!["renew".into(), fence.to_string(), lease_ms.to_string()];
        let reply = self.run_meta("renew", plan.activity, args).await?;
        match tagged("renew", &reply)? {
            ("renewed", []) => Ok(true),
            ("lost", []) => Ok(false),
            _ => Err(bad_reply("renew", &reply)),
        }
    }

    async fn close_gates(&self, plan: &StockPlan, fence: &str, generation: u64) -> PortResult<bool> {
        for b in plan.all_buckets() {
            let args = vec!["close".into(), fence.to_string(), generation.to_string()];
            let reply = self.run_gate("close gates", plan.activity, b, args).await?;
            match tagged("close gates", &reply)? {
                ("closed", []) => {}
                ("newer", [Reply::Int(_)]) => return Ok(false),
                _ => return Err(bad_reply("close gates", &reply)),
            }
        }
        Ok(true)
    }

    async fn reopen(
        &self,
        plan: &StockPlan,
        bucket: BucketNo,
        fence: &str,
        intent: &Intent,
    ) -> PortResult<bool> {
        let mut args = vec!["reopen".to_string(), fence.to_string()];
        args.extend(intent_args(intent));
        let reply = self.run_gate("reopen", plan.activity, bucket, args).await?;
        match tagged("reopen", &reply)? {
            ("reopened", [_state]) => Ok(true),
            ("fenced", []) => Ok(false),
            _ => Err(bad_reply("reopen", &reply)),
        }
    }

    async fn finish(&self, plan: &StockPlan, fence: &str, epoch: &str) -> PortResult<bool> {
        let args = vec!["finish".into(), fence.to_string(), epoch.to_string()];
        let reply = self.run_meta("finish", plan.activity, args).await?;
        match tagged("finish", &reply)? {
            ("finished", []) => Ok(true),
            ("lost", []) => Ok(false),
            _ => Err(bad_reply("finish", &reply)),
        }
    }

    async fn adopt(&self, r: &Reservation) -> PortResult<bool> {
        let args = vec![
            "adopt".into(),
            r.id.to_string(),
            r.user.to_string(),
            r.qty.to_string(),
        ];
        let reply = self
            .run("adopt", Script::Release, bucket_keys(r.activity, r.bucket), args)
            .await?;
        match tagged("adopt", &reply)? {
            ("adopted", []) => Ok(true),
            ("absent", []) => Ok(false),
            _ => Err(bad_reply("adopt", &reply)),
        }
    }

    async fn epoch(&self) -> PortResult<String> {
        self.conn.run_id().await
    }

    async fn resolve_pending(
        &self,
        plan: &StockPlan,
        user: UserId,
        attempt: ReservationId,
        keep: bool,
    ) -> PortResult<()> {
        let (a, own) = (plan.activity, plan.route(user));
        let keys = vec![stock_key(a, own), buyers_key(a, own), resv_key(a, own)];
        let args = vec![
            "resolve".into(),
            user.to_string(),
            if keep { "keep" } else { "clear" }.into(),
            attempt.to_string(),
        ];
        let reply = self.run("resolve pending", Script::Reserve, keys, args).await?;
        match tagged("resolve pending", &reply)? {
            ("resolved", [Reply::Int(_)]) => Ok(()),
            _ => Err(bad_reply("resolve pending", &reply)),
        }
    }

    async fn give_up_pending(
        &self,
        plan: &StockPlan,
        user: UserId,
        attempt: ReservationId,
    ) -> PortResult<GaveUp> {
        let fallback = plan.fallback_bucket();
        let args = vec!["void".into(), user.to_string(), attempt.to_string()];
        let keys = reserve_keys(plan.activity, fallback);
        let reply = self
            .run("void fallback attempt", Script::Reserve, keys, args)
            .await?;
        let kept = match tagged("void fallback attempt", &reply)? {
            ("open", []) => return Ok(GaveUp::InFlight),
            ("held", []) => true,
            ("voided", []) => false,
            _ => return Err(bad_reply("void fallback attempt", &reply)),
        };
        StockCache::resolve_pending(self, plan, user, attempt, kept).await?;
        Ok(if kept { GaveUp::Kept } else { GaveUp::Cleared })
    }

    async fn take(&self, plan: &StockPlan, t: &Transfer) -> PortResult<bool> {
        let keys = vec![
            stock_key(plan.activity, t.from),
            xfer_key(plan.activity, t.from),
            gate_key(plan.activity, t.from),
        ];
        let args = vec![
            "take".into(),
            t.id.clone(),
            t.units.to_string(),
            t.to.to_string(),
            t.generation.to_string(),
        ];
        let reply = self.run("take", Script::Transfer, keys, args).await?;
        match tagged("take", &reply)? {
            ("taken", [Reply::Int(_)]) => Ok(true),
            // The same id taken before must have been the same transfer.
            ("exists", [Reply::Int(n)]) if *n == t.units as i64 => Ok(true),
            ("exists", [Reply::Int(n)]) => Err(PortError::determinate(
                "take",
                format!("transfer {} was taken with {n} units, not {}", t.id, t.units),
            )),
            ("short" | "gated", []) => Ok(false),
            _ => Err(bad_reply("take", &reply)),
        }
    }

    async fn give(&self, plan: &StockPlan, t: &Transfer) -> PortResult<()> {
        let fresh;
        let t = if crate::planted::on(crate::planted::Bug::NonIdempotentGive) {
            // Planted: every give gets a fresh idempotency key, so a repeated give counts twice.
            let n = crate::planted::fresh();
            fresh = Transfer {
                id: format!("{}-{n:x}", t.id),
                ..t.clone()
            };
            &fresh
        } else {
            t
        };
        let keys = vec![
            stock_key(plan.activity, t.to),
            xfer_key(plan.activity, t.to),
            gate_key(plan.activity, t.to),
        ];
        let args = vec!["give".into(), t.id.clone(), t.units.to_string()];
        let reply = self.run("give", Script::Transfer, keys, args).await?;
        match tagged("give", &reply)? {
            ("given" | "exists", []) => Ok(()),
            ("gated", []) => Err(PortError::determinate(
                "give",
                format!("bucket {} is closed or recovering", t.to),
            )),
            _ => Err(bad_reply("give", &reply)),
        }
    }

    async fn note_moves(&self, activity: ActivityId) -> PortResult<()> {
        let reply = self
            .run(
                "note moves",
                Script::Warmup,
                vec![meta_key(activity)],
                vec!["moved".into()],
            )
            .await?;
        match tagged("note moves", &reply)? {
            ("ok", [Reply::Int(_)]) => Ok(()),
            _ => Err(bad_reply("note moves", &reply)),
        }
    }

    async fn ack(&self, plan: &StockPlan, t: &Transfer) -> PortResult<()> {
        let keys = vec![
            stock_key(plan.activity, t.from),
            xfer_key(plan.activity, t.from),
            gate_key(plan.activity, t.from),
        ];
        let reply = self
            .run("ack", Script::Transfer, keys, vec!["ack".into(), t.id.clone()])
            .await?;
        match tagged("ack", &reply)? {
            ("acked", []) => Ok(()),
            _ => Err(bad_reply("ack", &reply)),
        }
    }

    async fn rebuild(
        &self,
        plan: &StockPlan,
        bucket: BucketNo,
        fence: &str,
        image: &BucketImage,
    ) -> PortResult<Rebuilt> {
        let mut args = vec![
            fence.to_string(),
            image.stock.to_string(),
            image.buyers.len().to_string(),
        ];
        args.extend(image.buyers.iter().map(|u| u.to_string()));
        args.push(image.held.len().to_string());
        args.extend(image.held.iter().map(|r| r.to_string()));
        for (rid, qty) in &image.cancelled_released {
            args.push(format!("rel:{rid}"));
            args.push(qty.to_string());
        }
        // The journal's transfers, each as completed on its side.
        for t in &image.transfers_out {
            args.extend([
                format!("take:{}", t.id),
                format!("{}|{}|{}", t.units, t.to, t.generation),
            ]);
            args.extend([format!("ack:{}", t.id), "1".into()]);
        }
        for t in &image.transfers_in {
            args.extend([format!("give:{}", t.id), t.units.to_string()]);
        }
        let reply = self
            .run(
                "rebuild",
                Script::Rebuild,
                bucket_keys(plan.activity, bucket),
                args,
            )
            .await?;
        match tagged("rebuild", &reply)? {
            ("rebuilt", [Reply::Int(_), Reply::Int(_)]) => Ok(Rebuilt::Done),
            ("fenced", []) => Ok(Rebuilt::Fenced),
            ("open", [rid]) => Ok(Rebuilt::Open(
                as_str(rid)
                    .and_then(|r| r.parse().ok())
                    .ok_or_else(|| bad_reply("rebuild", &reply))?,
            )),
            _ => Err(bad_reply("rebuild", &reply)),
        }
    }

    async fn snapshot(&self, plan: &StockPlan) -> PortResult<CacheView> {
        self.view(plan, true).await
    }

    async fn summary(&self, plan: &StockPlan) -> PortResult<CacheView> {
        self.view(plan, false).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_design_contract() {
        let (a, b) = (ActivityId(42), BucketNo(3));
        assert_eq!(stock_key(a, b), "sk:{42.3}:stock");
        assert_eq!(buyers_key(a, b), "sk:{42.3}:buyers");
        assert_eq!(resv_key(a, b), "sk:{42.3}:resv");
        assert_eq!(xfer_key(a, b), "sk:{42.3}:xfer");
        assert_eq!(meta_key(a), "sk:{42}:meta");
    }

    #[test]
    fn script_shas_are_distinct_and_stable() {
        let shas: std::collections::BTreeSet<_> = Script::ALL.iter().map(|s| s.sha1()).collect();
        assert_eq!(shas.len(), Script::ALL.len());
        assert_eq!(Script::Settle.sha1(), sha1_hex(Script::Settle.source()));
        assert_eq!(sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    }
}
