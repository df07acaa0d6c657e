//! The embedded backend: every port in memory, with the semantics of the real store it stands
//! for (see each module). Not durable — a process restart loses everything.

mod bus;
pub mod ledger;
mod redis_model;

pub use bus::{partition_of, DeadLetterLog, EmbeddedBus, EmbeddedConsumer, Fetch};
pub use ledger::EmbeddedLedger;
pub use redis_model::{exec, Keyspace, RedisModel, Value};

use crate::adapters::script::{Reply, ScriptConn, ScriptedStockCache};
use crate::ports::{PortError, PortResult};
use std::sync::Arc;

/// An in-process Redis Cluster of `RedisModel` shards: a key lives on the shard that owns its
/// hash slot (CRC16 of the hash tag, as Redis computes it, in contiguous slot ranges like a
/// cluster's masters). Every script touches one slot, so a script runs whole on one shard — the
/// cluster's atomicity — and scripts on different buckets do not wait for each other (one model
/// is one lock). Calls never fail in transport.
#[derive(Clone)]
pub struct EmbeddedRedis {
    shards: Arc<[Arc<RedisModel>]>,
}

/// Shards of a fresh embedded Redis: enough that two threads rarely want the same one.
pub const EMBEDDED_REDIS_SHARDS: usize = 16;

impl Default for EmbeddedRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedRedis {
    pub fn new() -> Self {
        EmbeddedRedis {
            shards: (0..EMBEDDED_REDIS_SHARDS)
                .map(|_| Arc::new(RedisModel::new()))
                .collect(),
        }
    }

    /// One model as the whole keyspace (the simulation's Redis node shares its store).
    pub fn from_model(model: Arc<RedisModel>) -> Self {
        EmbeddedRedis {
            shards: Arc::new([model]),
        }
    }

    fn shard_index(&self, key: &[u8]) -> usize {
        usize::from(key_slot(key)) * self.shards.len() / SLOTS
    }

    /// The shard a script with `keys` runs on: its first key's, or the first shard without keys.
    /// Keys in several slots are refused, as a cluster refuses them (ours never are).
    fn script_shard<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<&RedisModel, Reply> {
        let Some(first) = keys.first() else {
            return Ok(&self.shards[0]);
        };
        let slot = key_slot(first.as_ref());
        if self.shards.len() > 1 && keys.iter().any(|k| key_slot(k.as_ref()) != slot) {
            return Err(Reply::Error(
                "CROSSSLOT Keys in request don't hash to the same slot".into(),
            ));
        }
        Ok(&self.shards[self.shard_index(first.as_ref())])
    }

    /// Run one command on the shard of its first key, as a cluster client routes it (EVAL and
    /// EVALSHA: their first KEYS entry; without keys, the first shard). Other keyless commands
    /// have no shard: use `dump`, `restore` or `flush_all`.
    pub fn command(&self, argv: &[Vec<u8>]) -> Reply {
        let script = argv
            .first()
            .is_some_and(|n| n.eq_ignore_ascii_case(b"EVAL") || n.eq_ignore_ascii_case(b"EVALSHA"));
        if script {
            // EVAL script numkeys key… arg…: a bad numkeys is the model's to refuse.
            let numkeys = argv
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            let keys = argv.get(3..3 + numkeys).unwrap_or_default();
            return match self.script_shard(keys) {
                Ok(shard) => shard.command(argv),
                Err(e) => e,
            };
        }
        match argv.get(1) {
            Some(key) => self.shards[self.shard_index(key)].command(argv),
            None => Reply::Error("ERR the embedded cluster routes commands by their first key".into()),
        }
    }

    /// A copy of the whole keyspace (the shards' key sets are disjoint).
    pub fn dump(&self) -> Keyspace {
        self.shards.iter().flat_map(|m| m.dump()).collect()
    }

    /// Every shard restarts and reloads its part of `keyspace` (an AOF/RDB image).
    pub fn restore(&self, keyspace: Keyspace) {
        let mut parts: Vec<Keyspace> = vec![Keyspace::new(); self.shards.len()];
        for (k, v) in keyspace {
            parts[self.shard_index(&k)].insert(k, v);
        }
        for (m, part) in self.shards.iter().zip(parts) {
            m.restore(part);
        }
    }

    /// Every shard restarts without persistence.
    pub fn flush_all(&self) {
        self.shards.iter().for_each(|m| m.flush_all());
    }
}

const SLOTS: usize = 16_384;

/// Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag — the part between the first `{`
/// and the next `}` when that is not empty — or of the whole key, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

impl ScriptConn for EmbeddedRedis {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        Ok(match self.script_shard(keys) {
            Ok(shard) => shard.eval_sha(sha, keys, args),
            Err(e) => e,
        })
    }

    /// The shards' run ids, like a cluster's masters': any restart changes it.
    async fn run_id(&self) -> PortResult<String> {
        Ok(self
            .shards
            .iter()
            .map(|m| m.run_id())
            .collect::<Vec<_>>()
            .join(","))
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        for m in self.shards.iter() {
            if let Reply::Error(e) = m.script_load(source) {
                return Err(PortError::determinate("script load", e));
            }
        }
        Ok(())
    }
}

pub type EmbeddedStockCache = ScriptedStockCache<EmbeddedRedis>;

/// Partitions of the embedded bus: as many as the seeds' 100k-QPS design uses for Kafka.
pub const EMBEDDED_PARTITIONS: u32 = 6;
/// Records that may wait uncommitted: a whole default sale's worth of queued orders, several times.
pub const EMBEDDED_BUS_CAPACITY: usize = 100_000;

/// How the embedded backend's consumers fetch: a batch waits up to 2 ms to fill (an order
/// reaches the ledger that much later; the consumer applies dozens per transaction instead of one).
pub const EMBEDDED_FETCH: Fetch = Fetch {
    min_records: crate::service::consumer::DEFAULT_MAX_BATCH,
    max_wait: std::time::Duration::from_millis(2),
};

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
            bus: EmbeddedBus::new(EMBEDDED_PARTITIONS, EMBEDDED_BUS_CAPACITY).with_fetch(EMBEDDED_FETCH),
            ledger: EmbeddedLedger::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_are_redis_cluster_slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 0x31C3); // the CRC16 check value
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"sk:{7.3}:stock"), key_slot(b"sk:{7.3}:resv"));
    }

    #[tokio::test]
    async fn a_bucket_lives_on_one_shard_and_dump_restore_round_trips() {
        let r = EmbeddedRedis::new();
        let set = |k: &str, v: &str| r.command(&[b"SET".to_vec(), k.into(), v.into()]);
        for b in 0..64 {
            set(&format!("sk:{{1.{b}}}:stock"), "5");
        }
        let shards_used = r.shards.iter().filter(|m| !m.dump().is_empty()).count();
        assert!(
            shards_used > EMBEDDED_REDIS_SHARDS / 2,
            "{shards_used} shards used"
        );
        let image = r.dump();
        assert_eq!(image.len(), 64);
        let before = r.run_id().await.unwrap();
        r.flush_all();
        assert!(r.dump().is_empty());
        r.restore(image.clone());
        assert_eq!(r.dump(), image);
        assert_ne!(r.run_id().await.unwrap(), before);
        let got = r.command(&[b"GET".to_vec(), b"sk:{1.9}:stock".to_vec()]);
        assert_eq!(got, Reply::Bulk(b"5".to_vec()));
        let eval = |numkeys: &str, key: &str| {
            r.command(&[
                b"EVAL".to_vec(),
                b"return redis.call('GET', KEYS[1])".to_vec(),
                numkeys.into(),
                key.into(),
            ])
        };
        assert_eq!(
            eval("1", "sk:{1.9}:stock"),
            Reply::Bulk(b"5".to_vec()),
            "EVAL goes to its key's shard"
        );
        assert!(matches!(r.command(&[b"DBSIZE".to_vec()]), Reply::Error(_)));
    }
}
