//! The embedded backend: every port in memory, with the semantics of the real store it stands
//! for (see each module). Not durable — a process restart loses everything.

mod bus;
mod ledger;
mod redis_model;

pub use bus::{partition_of, DeadLetter, EmbeddedBus, EmbeddedConsumer};
pub use ledger::EmbeddedLedger;
pub use redis_model::{exec, Keyspace, RedisModel, Value};

use crate::adapters::script::{Reply, ScriptConn, ScriptedStockCache};
use crate::ports::{PortError, PortResult};
use std::sync::Arc;

/// A "connection" to an in-process `RedisModel`: calls never fail in transport.
#[derive(Clone, Default)]
pub struct EmbeddedRedis {
    model: Arc<RedisModel>,
}

impl EmbeddedRedis {
    pub fn new() -> Self {
        Self::default()
    }

    /// A connection to an existing model (the simulation's Redis node shares its store).
    pub fn from_model(model: Arc<RedisModel>) -> Self {
        EmbeddedRedis { model }
    }

    pub fn model(&self) -> &RedisModel {
        &self.model
    }
}

impl ScriptConn for EmbeddedRedis {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        Ok(self.model.eval_sha(sha, keys, args))
    }

    async fn run_id(&self) -> PortResult<String> {
        Ok(self.model.run_id())
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        match self.model.script_load(source) {
            Reply::Error(e) => Err(PortError::determinate("script load", e)),
            _ => Ok(()),
        }
    }
}

pub type EmbeddedStockCache = ScriptedStockCache<EmbeddedRedis>;

/// Partitions of the embedded bus: as many as the seeds' 100k-QPS design uses for Kafka.
pub const EMBEDDED_PARTITIONS: u32 = 6;
/// Records that may wait uncommitted: a whole default sale's worth of queued orders, several times.
pub const EMBEDDED_BUS_CAPACITY: usize = 100_000;

/// All three embedded ports, wired to fresh stores.
#[derive(Clone)]
pub struct EmbeddedBackend {
    pub cache: EmbeddedStockCache,
    pub bus: EmbeddedBus,
    pub ledger: EmbeddedLedger,
}

impl Default for EmbeddedBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedBackend {
    pub fn new() -> Self {
        EmbeddedBackend {
            cache: ScriptedStockCache::new(EmbeddedRedis::new()),
            bus: EmbeddedBus::new(EMBEDDED_PARTITIONS, EMBEDDED_BUS_CAPACITY),
            ledger: EmbeddedLedger::new(),
        }
    }
}
