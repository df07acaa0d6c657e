//! The messages between simulated nodes. Every store is reached only over madsim's network, so
//! partitions, packet loss and latency apply to it; a call that times out is `Indeterminate`.

use madsim::net::rpc::Request;
use madsim::net::Endpoint;
use seckill_core::adapters::script::Reply;
use seckill_core::domain::{ActivityId, ActivitySpec, ActivityState, Reservation, ReservationId, UserId};
use seckill_core::ports::{
    ApplyOutcome, DeadLetterPage, Delivery, Intent, LedgerView, OrderRow, PayOutcome, PortError,
    ReconcileView, Registered,
};
use seckill_core::service::{PurchaseOutcome, StatusView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;

pub const REDIS: &str = "10.0.0.10:6379";
pub const MYSQL: &str = "10.0.0.20:3306";
pub const KAFKA: &str = "10.0.0.30:9092";

pub fn addr(s: &str) -> SocketAddr {
    s.parse().expect("fixed simulation addresses parse")
}

pub fn engine_addr(i: usize) -> SocketAddr {
    format!("10.0.1.{}:8080", i + 1).parse().expect("engine address")
}

/// Receive loops per request type on a server. madsim's RPC loop takes one message per simulated
/// millisecond (every receive sleeps at least 1 ms), so one loop would cap a store at 1,000
/// requests/s — a bottleneck no real Redis has, turning a burst into timeouts.
const RPC_LOOPS: usize = 64;

/// Serve requests of type `R` with `handler`, on `RPC_LOOPS` receive loops.
pub fn serve<R, F, Fut>(ep: &Endpoint, handler: F)
where
    R: Request,
    F: FnMut(R) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = R::Response> + Send + 'static,
{
    for _ in 0..RPC_LOOPS {
        ep.add_rpc_handler(handler.clone());
    }
}

macro_rules! request {
    ($name:ident => $resp:ty, $id:expr) => {
        impl Request for $name {
            const ID: u64 = $id;
            type Response = $resp;
        }
    };
}

// Redis
#[derive(Clone, Serialize, Deserialize)]
pub struct EvalSha {
    pub sha: String,
    pub keys: Vec<String>,
    pub args: Vec<String>,
    /// Sent again by the client after its first run's reply was lost.
    pub resent: bool,
}
request!(EvalSha => Reply, 0x5e01);

#[derive(Serialize, Deserialize)]
pub struct RunId;
request!(RunId => String, 0x5e03);

#[derive(Serialize, Deserialize)]
pub struct ScriptLoad {
    pub source: String,
}
request!(ScriptLoad => Reply, 0x5e02);

// Ledger
#[derive(Serialize, Deserialize)]
pub struct Install {
    pub spec: ActivitySpec,
}
request!(Install => Result<bool, PortError>, 0x5e11);

#[derive(Serialize, Deserialize)]
pub struct Apply {
    pub batch: Vec<Reservation>,
}
request!(Apply => Result<Vec<ApplyOutcome>, PortError>, 0x5e12);

#[derive(Serialize, Deserialize)]
pub struct CancelUnpaid {
    pub activity: ActivityId,
    pub now_ms: u64,
}
request!(CancelUnpaid => Result<Vec<Reservation>, PortError>, 0x5e16);

#[derive(Serialize, Deserialize)]
pub struct CancelOrder {
    pub id: ReservationId,
}
request!(CancelOrder => Result<seckill_core::ports::CancelOutcome, PortError>, 0x5e18);

#[derive(Serialize, Deserialize)]
pub struct ActivityOf {
    pub id: ActivityId,
}
request!(ActivityOf => Result<Option<ActivitySpec>, PortError>, 0x5e19);

#[derive(Serialize, Deserialize)]
pub struct LedgerTransfer {
    pub activity: ActivityId,
    pub transfer: seckill_core::ports::Transfer,
}
request!(LedgerTransfer => Result<bool, PortError>, 0x5e17);

#[derive(Serialize, Deserialize)]
pub struct Pay {
    pub id: ReservationId,
    pub payment: String,
}
request!(Pay => Result<PayOutcome, PortError>, 0x5e13);

#[derive(Serialize, Deserialize)]
pub struct OrderById {
    pub id: ReservationId,
}
request!(OrderById => Result<Option<OrderRow>, PortError>, 0x5e1f);

#[derive(Serialize, Deserialize)]
pub struct OrderOf {
    pub activity: ActivityId,
    pub user: UserId,
}
request!(OrderOf => Result<Option<OrderRow>, PortError>, 0x5e14);

#[derive(Serialize, Deserialize)]
pub struct Snapshot {
    pub activity: ActivityId,
}
request!(Snapshot => Result<LedgerView, PortError>, 0x5e15);

#[derive(Serialize, Deserialize)]
pub struct RegistryOf {
    pub id: ActivityId,
}
request!(RegistryOf => Result<Option<Registered>, PortError>, 0x5e1b);

#[derive(Serialize, Deserialize)]
pub struct RegisteredAll;
request!(RegisteredAll => Result<Vec<Registered>, PortError>, 0x5e1c);

#[derive(Serialize, Deserialize)]
pub struct SetIntent {
    pub id: ActivityId,
    pub state: ActivityState,
}
request!(SetIntent => Result<Option<Intent>, PortError>, 0x5e1d);

#[derive(Serialize, Deserialize)]
pub struct BumpGeneration {
    pub id: ActivityId,
    pub from: u64,
}
request!(BumpGeneration => Result<Option<Intent>, PortError>, 0x5e1e);

#[derive(Serialize, Deserialize)]
pub struct ReconcileRead {
    pub activity: ActivityId,
    pub mentioned: BTreeSet<ReservationId>,
}
request!(ReconcileRead => Result<ReconcileView, PortError>, 0x5e1a);

// Kafka
#[derive(Serialize, Deserialize)]
pub struct Produce {
    pub key: String,
    pub payload: Vec<u8>,
}
// `Err`: the broker refused it (certainly not stored).
request!(Produce => Result<u64, String>, 0x5e21);

#[derive(Serialize, Deserialize)]
pub struct Fetch {
    pub partition: u32,
    pub offset: u64,
    pub max: usize,
}
request!(Fetch => Vec<Delivery>, 0x5e22);

#[derive(Serialize, Deserialize)]
pub struct Commit {
    pub group: String,
    /// The committing member and the group generation it was assigned the partition in: the
    /// broker refuses a commit from an older generation (Kafka's ILLEGAL_GENERATION).
    pub member: String,
    pub generation: u64,
    pub partition: u32,
    pub offset: u64,
}
request!(Commit => Result<(), String>, 0x5e23);

/// A member's heartbeat and join in one: the group's generation and the member's partitions.
#[derive(Serialize, Deserialize)]
pub struct GroupSync {
    pub group: String,
    pub member: String,
}
request!(GroupSync => (u64, Vec<u32>), 0x5e27);

/// A member leaving its group (a consumer closed, as rdkafka's does when dropped): the group
/// rebalances at once instead of after the session timeout.
#[derive(Clone, Serialize, Deserialize)]
pub struct GroupLeave {
    pub group: String,
    pub member: String,
}
request!(GroupLeave => (), 0x5e28);

#[derive(Serialize, Deserialize)]
pub struct Committed {
    pub group: String,
    pub partition: u32,
}
request!(Committed => u64, 0x5e24);

/// A member's rewind: the group's committed offsets of its partitions, to seek to (refused as a
/// failed seek is, or lost with the broker).
#[derive(Serialize, Deserialize)]
pub struct Rewind {
    pub group: String,
    pub member: String,
    pub partitions: Vec<u32>,
}
request!(Rewind => Result<std::collections::BTreeMap<u32, u64>, String>, 0x5e29);

#[derive(Serialize, Deserialize)]
pub struct Lag {
    pub group: String,
}
request!(Lag => u64, 0x5e26);

/// The dead-letter topic's calls, as one request type: one more handler task on the broker's node
/// would reorder every run's scheduling.
#[derive(Serialize, Deserialize)]
pub enum DeadLetters {
    /// A consumer's `dead_letter`.
    Add { delivery: Delivery, reason: String },
    /// `OrderBus::dead_letters`.
    Read { from: (u32, u64), limit: usize },
    /// `OrderBus::purge_dead_letters`.
    Purge { before: Vec<(u32, u64)> },
}

#[derive(Serialize, Deserialize)]
pub enum DeadLettersAnswer {
    Added,
    Page(DeadLetterPage),
    Purged(u64),
}
request!(DeadLetters => DeadLettersAnswer, 0x5e25);

// Engine (what clients call)
#[derive(Serialize, Deserialize)]
pub struct Purchase {
    pub user: UserId,
}
request!(Purchase => Result<PurchaseOutcome, String>, 0x5e31);

#[derive(Serialize, Deserialize)]
pub struct Status {
    pub user: UserId,
}
request!(Status => Result<StatusView, String>, 0x5e32);

#[derive(Serialize, Deserialize)]
pub struct PayOrder {
    pub id: ReservationId,
}
request!(PayOrder => Result<PayOutcome, String>, 0x5e33);

/// The operator's pause / resume / close, through one API node (it acts for all of them).
#[derive(Serialize, Deserialize)]
pub struct Operate {
    pub state: ActivityState,
}
request!(Operate => Result<Intent, String>, 0x5e34);

/// The operator's warmup through one API node: what it did.
#[derive(Serialize, Deserialize)]
pub struct Warmup;
request!(Warmup => Result<String, String>, 0x5e35);

#[cfg(test)]
mod tests {
    use super::*;

    /// Two request types with one id make the receiving node panic on a message type mismatch.
    #[test]
    fn request_ids_are_distinct() {
        let ids = [
            EvalSha::ID,
            RunId::ID,
            ScriptLoad::ID,
            Install::ID,
            Apply::ID,
            CancelUnpaid::ID,
            CancelOrder::ID,
            ActivityOf::ID,
            LedgerTransfer::ID,
            Pay::ID,
            OrderById::ID,
            OrderOf::ID,
            Snapshot::ID,
            ReconcileRead::ID,
            RegistryOf::ID,
            RegisteredAll::ID,
            SetIntent::ID,
            BumpGeneration::ID,
            Produce::ID,
            Fetch::ID,
            Commit::ID,
            GroupSync::ID,
            GroupLeave::ID,
            Committed::ID,
            Rewind::ID,
            Lag::ID,
            DeadLetters::ID,
            Purchase::ID,
            Status::ID,
            PayOrder::ID,
            Operate::ID,
            Warmup::ID,
        ];
        let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:x?}");
        // Every request type is listed above.
        assert_eq!(
            ids.len(),
            include_str!("rpc.rs").matches(concat!("request", "!(")).count()
        );
    }
}
