//! Which stores a command runs on. With no service settings everything is embedded (in memory,
//! not durable); with them, the real adapters: Redis (one server or a Cluster), Apache Kafka and
//! MySQL / MariaDB. Settings come from the environment, each checked with an error naming the
//! variable, so a typo never silently falls back to the embedded stores.

use crate::adapters::kafka::{KafkaBus, KafkaConfig};
use crate::adapters::mysql::{MysqlConfig, MysqlLedger};
use crate::adapters::redis::{connect_stock_cache, RedisConfig, RedisStockCache};
use crate::ports::{OrderBus, PortError};

pub use crate::service::consumer::ORDER_GROUP;
pub const DEFAULT_TOPIC: &str = "seckill.orders";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealSettings {
    pub redis: RedisConfig,
    pub kafka: KafkaConfig,
    pub mysql: MysqlConfig,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {reason}")]
pub struct SettingError {
    pub var: &'static str,
    pub reason: String,
}

fn bad(var: &'static str, reason: impl Into<String>) -> SettingError {
    SettingError {
        var,
        reason: reason.into(),
    }
}

impl RealSettings {
    /// `Ok(None)` when no store is configured (the embedded default). Partial settings are an
    /// error: a sale half on real stores and half in memory would lose orders on restart.
    pub fn from_env() -> Result<Option<RealSettings>, SettingError> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<RealSettings>, SettingError> {
        let (single, cluster) = (
            get("REDIS_URL"),
            get("SECKILL_REDIS_CLUSTER").and(get("REDIS_CLUSTER_NODES")),
        );
        let (brokers, db) = (get("KAFKA_BROKERS"), get("DATABASE_URL"));
        if single.is_none() && cluster.is_none() && brokers.is_none() && db.is_none() {
            return Ok(None);
        }
        let redis = match (cluster, single) {
            (Some(nodes), _) => {
                let cfg = RedisConfig::cluster(&nodes);
                if cfg.urls.is_empty() {
                    return Err(bad("REDIS_CLUSTER_NODES", "no node URL"));
                }
                cfg
            }
            (None, Some(url)) => RedisConfig::single(&url),
            (None, None) => return Err(bad("REDIS_URL", "not set (the other stores are)")),
        };
        for url in &redis.urls {
            if !url.starts_with("redis://") {
                return Err(bad("REDIS_URL", format!("{url:?} is not a redis:// URL")));
            }
        }
        let brokers = brokers.ok_or_else(|| bad("KAFKA_BROKERS", "not set (the other stores are)"))?;
        let db = db.ok_or_else(|| bad("DATABASE_URL", "not set (the other stores are)"))?;
        if !db.starts_with("mysql://") && !db.starts_with("mariadb://") {
            return Err(bad("DATABASE_URL", format!("{db:?} is not a mysql:// URL")));
        }
        let topic = get("SECKILL_TOPIC").unwrap_or_else(|| DEFAULT_TOPIC.to_string());
        if topic.is_empty()
            || !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad(
                "SECKILL_TOPIC",
                format!("{topic:?} is not a Kafka topic name"),
            ));
        }
        let mut kafka = KafkaConfig::new(&brokers, &topic);
        let count = |var: &'static str, max: i32, default: i32| match get(var) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| bad(var, format!("{v:?} is not a whole number in 1..={max}"))),
        };
        kafka.partitions = count("SECKILL_TOPIC_PARTITIONS", 10_000, kafka.partitions)?;
        kafka.replication = count("SECKILL_TOPIC_REPLICATION", 32, kafka.replication)?;
        Ok(Some(RealSettings {
            redis,
            kafka,
            mysql: MysqlConfig::new(&db.replacen("mariadb://", "mysql://", 1)),
        }))
    }
}

/// The three real ports, connected: topics exist, migrations applied.
#[derive(Clone)]
pub struct RealBackend {
    pub cache: RedisStockCache,
    pub bus: KafkaBus,
    pub ledger: MysqlLedger,
}

impl RealBackend {
    pub async fn connect(s: &RealSettings) -> Result<RealBackend, PortError> {
        let cache = connect_stock_cache(&s.redis).await?;
        let bus = KafkaBus::connect(s.kafka.clone())?;
        bus.ensure_topics().await?;
        // Clears a "known down" the producer may have seen while the broker was starting.
        bus.probe().await?;
        let ledger = MysqlLedger::connect_lazy(&s.mysql)?;
        ledger.migrate().await?;
        Ok(RealBackend { cache, bus, ledger })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<RealSettings>, SettingError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RealSettings::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn no_settings_means_embedded_and_partial_settings_name_the_missing_variable() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(
            settings(&[("REDIS_URL", "redis://x")]).unwrap_err().var,
            "KAFKA_BROKERS"
        );
        assert_eq!(
            settings(&[("REDIS_URL", "redis://x"), ("KAFKA_BROKERS", "k:9092")])
                .unwrap_err()
                .var,
            "DATABASE_URL"
        );
        assert_eq!(
            settings(&[("DATABASE_URL", "mysql://x")]).unwrap_err().var,
            "REDIS_URL"
        );
        let full = [
            ("REDIS_URL", "redis://x"),
            ("KAFKA_BROKERS", "k:9092"),
            ("DATABASE_URL", "mysql://u@h/d"),
        ];
        let s = settings(&full).unwrap().unwrap();
        assert_eq!(s.kafka.topic, DEFAULT_TOPIC);
        assert!(!s.redis.cluster);
        let mut bad_db = full;
        bad_db[2] = ("DATABASE_URL", "postgres://h/d");
        assert_eq!(settings(&bad_db).unwrap_err().var, "DATABASE_URL");
        let mut bad_redis = full;
        bad_redis[0] = ("REDIS_URL", "http://x");
        assert_eq!(settings(&bad_redis).unwrap_err().var, "REDIS_URL");
        let mut topic = full.to_vec();
        topic.push(("SECKILL_TOPIC", "a b"));
        assert_eq!(settings(&topic).unwrap_err().var, "SECKILL_TOPIC");
        assert_eq!((s.kafka.partitions, s.kafka.replication), (6, 1));
        let mut shape = full.to_vec();
        shape.extend([
            ("SECKILL_TOPIC_PARTITIONS", "24"),
            ("SECKILL_TOPIC_REPLICATION", "3"),
        ]);
        let s = settings(&shape).unwrap().unwrap();
        assert_eq!((s.kafka.partitions, s.kafka.replication), (24, 3));
        for (var, value) in [
            ("SECKILL_TOPIC_PARTITIONS", "0"),
            ("SECKILL_TOPIC_PARTITIONS", "six"),
            ("SECKILL_TOPIC_REPLICATION", "-1"),
        ] {
            let mut wrong = full.to_vec();
            wrong.push((var, value));
            let e = settings(&wrong).unwrap_err();
            assert_eq!(e.var, var, "{e}");
            assert!(e.reason.contains(value), "{e}");
        }
    }

    #[test]
    fn cluster_mode_is_chosen_explicitly() {
        let base = [
            ("REDIS_CLUSTER_NODES", "redis://a:7000, redis://b:7001"),
            ("KAFKA_BROKERS", "k:9092"),
            ("DATABASE_URL", "mysql://u@h/d"),
        ];
        // The CI env file sets both URLs; cluster mode needs SECKILL_REDIS_CLUSTER as well.
        assert_eq!(settings(&base).unwrap_err().var, "REDIS_URL");
        let mut cluster = base.to_vec();
        cluster.push(("SECKILL_REDIS_CLUSTER", "1"));
        let s = settings(&cluster).unwrap().unwrap();
        assert!(s.redis.cluster);
        assert_eq!(s.redis.urls, vec!["redis://a:7000", "redis://b:7001"]);
    }
}
