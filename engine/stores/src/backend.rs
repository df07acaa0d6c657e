//! Which stores a command runs on. With no service settings everything is embedded (in memory,
//! not durable); with them, the real adapters: Redis (one server or a Cluster), Apache Kafka and
//! MySQL / MariaDB. Settings come from the environment, each checked with an error naming the
//! variable, so a typo never silently falls back to the embedded stores.
//!
//! TLS and credentials, per store: Redis by `rediss://` URLs (`user:password@` in the URL) with
//! `SECKILL_REDIS_CA_FILE` (else the system's roots) and, for mutual TLS,
//! `SECKILL_REDIS_CERT_FILE` + `SECKILL_REDIS_KEY_FILE`; MySQL by `DATABASE_URL`'s own options
//! (`?ssl-mode=verify_identity&ssl-ca=/path/ca.pem`, also `ssl-cert` / `ssl-key`); Kafka by
//! `SECKILL_KAFKA_SECURITY_PROTOCOL` (`plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl`) with
//! `SECKILL_KAFKA_CA_FILE` / `_CERT_FILE` / `_KEY_FILE` and `SECKILL_KAFKA_SASL_MECHANISM` /
//! `_USERNAME` / `_PASSWORD`. Every file is checked here (it exists and holds PEM).

use crate::kafka::{KafkaBus, KafkaConfig, KafkaSecurity, Sasl};
use crate::mysql::{MysqlConfig, MysqlLedger};
use crate::redacted;
use crate::redis::{connect_stock_cache, RedisConfig, RedisStockCache};
use crate::{Secret, TlsFiles};
use seckill_core::ports::{OrderBus, PortError};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use seckill_core::service::consumer::ORDER_GROUP;
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

/// A PEM file named by `var`, if set: it must be readable and hold a PEM block.
fn pem_file(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<PathBuf>, SettingError> {
    let Some(path) = get(var) else { return Ok(None) };
    let text = std::fs::read(&path).map_err(|e| bad(var, format!("{path:?}: {e}")))?;
    if !text.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(bad(var, format!("{path:?} is not a PEM file")));
    }
    Ok(Some(PathBuf::from(path)))
}

/// `PREFIX_CA_FILE`, `PREFIX_CERT_FILE`, `PREFIX_KEY_FILE` (a certificate needs its key and a
/// key its certificate). `None` when none is set.
fn tls_files(
    get: &impl Fn(&str) -> Option<String>,
    [ca, cert, key]: [&'static str; 3],
) -> Result<Option<TlsFiles>, SettingError> {
    let ca = pem_file(get, ca)?;
    let client = match (pem_file(get, cert)?, pem_file(get, key)?) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(bad(
                key,
                format!("not set ({cert} is: a client certificate needs its key)"),
            ))
        }
        (None, Some(_)) => {
            return Err(bad(
                cert,
                format!("not set ({key} is: a client key needs its certificate)"),
            ))
        }
    };
    Ok((ca.is_some() || client.is_some()).then_some(TlsFiles { ca, client }))
}

/// The first of `vars` that is set (to name it when the files are set for a plaintext store).
fn first_set(get: &impl Fn(&str) -> Option<String>, vars: [&'static str; 3]) -> Option<&'static str> {
    vars.into_iter().find(|v| get(v).is_some())
}

const REDIS_TLS: [&str; 3] = [
    "SECKILL_REDIS_CA_FILE",
    "SECKILL_REDIS_CERT_FILE",
    "SECKILL_REDIS_KEY_FILE",
];
const KAFKA_TLS: [&str; 3] = [
    "SECKILL_KAFKA_CA_FILE",
    "SECKILL_KAFKA_CERT_FILE",
    "SECKILL_KAFKA_KEY_FILE",
];

fn kafka_security(get: &impl Fn(&str) -> Option<String>) -> Result<KafkaSecurity, SettingError> {
    const VAR: &str = "SECKILL_KAFKA_SECURITY_PROTOCOL";
    let protocol = get(VAR)
        .unwrap_or_else(|| "plaintext".into())
        .trim()
        .to_ascii_lowercase();
    let (tls, sasl) = match protocol.as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        _ => {
            return Err(bad(
                VAR,
                format!("{protocol:?} is not one of plaintext, ssl, sasl_plaintext, sasl_ssl"),
            ))
        }
    };
    let files = tls_files(get, KAFKA_TLS)?;
    if files.is_some() && !tls {
        let set = first_set(get, KAFKA_TLS).unwrap_or(VAR);
        return Err(bad(
            set,
            format!("set, but {VAR} is {protocol} (ssl or sasl_ssl uses it)"),
        ));
    }
    let sasl = if sasl {
        let need =
            |var: &'static str| get(var).ok_or_else(|| bad(var, format!("not set ({VAR} is {protocol})")));
        const MECH: &str = "SECKILL_KAFKA_SASL_MECHANISM";
        let mechanism = need(MECH)?.trim().to_ascii_uppercase();
        if !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"].contains(&mechanism.as_str()) {
            return Err(bad(
                MECH,
                format!("{mechanism:?} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
            ));
        }
        Some(Sasl {
            mechanism,
            username: need("SECKILL_KAFKA_SASL_USERNAME")?,
            password: Secret(need("SECKILL_KAFKA_SASL_PASSWORD")?),
        })
    } else {
        None
    };
    Ok(KafkaSecurity {
        tls: tls.then(|| files.unwrap_or_default()),
        sasl,
    })
}

/// `DATABASE_URL` as sqlx reads it, and the files its `ssl-ca` / `ssl-cert` / `ssl-key` name.
fn check_database_url(db: &str) -> Result<(), SettingError> {
    const VAR: &str = "DATABASE_URL";
    use std::str::FromStr;
    sqlx::mysql::MySqlConnectOptions::from_str(db).map_err(|e| bad(VAR, e.to_string()))?;
    let url = url::Url::parse(db).map_err(|e| bad(VAR, e.to_string()))?;
    for (k, v) in url.query_pairs() {
        if ["ssl-ca", "ssl-cert", "ssl-key"].contains(&k.as_ref()) {
            pem_file(&|_| Some(v.to_string()), VAR).map_err(|e| bad(VAR, format!("{k}: {}", e.reason)))?;
        }
    }
    Ok(())
}

/// The variable that lets `serve` use a ledger connection that does not verify its server
/// (`ledger_tls_unverified`): `1` accepts it, logged at start; unset or `0` refuses it.
pub const ALLOW_UNVERIFIED_LEDGER: &str = "SECKILL_MYSQL_ALLOW_UNVERIFIED";

/// Why the ledger's connection would not verify the server it talks to (DESIGN §12), or `None`
/// when it does: `ssl-mode=verify_ca` or `verify_identity` in `DATABASE_URL`, or a loopback
/// host (a MariaDB on the same machine, or a local TLS proxy: nobody is on the path). Without a
/// mode sqlx uses PREFERRED — no certificate or host check, and plaintext if the server offers
/// no TLS; `required` encrypts but never checks who answers. Either way anyone on the path could
/// read and rewrite the ledger (an order set to paid).
pub fn ledger_tls_unverified(db: &str) -> Option<String> {
    let url = url::Url::parse(db).ok()?;
    let loopback = match url.host() {
        // A mysql:// URL's host is opaque to `url` (not a special scheme): an IPv4 address
        // comes as a domain.
        Some(url::Host::Domain(d)) => {
            d.eq_ignore_ascii_case("localhost")
                || d.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => true, // a Unix socket
    };
    if loopback {
        return None;
    }
    let mode = (url.query_pairs())
        .find(|(k, _)| k == "ssl-mode")
        .map(|(_, v)| v.to_ascii_lowercase());
    match mode.as_deref() {
        Some("verify_ca" | "verify_identity") => None,
        Some(other) => Some(format!(
            "ssl-mode={other} does not verify the server's certificate"
        )),
        None => Some(
            "no ssl-mode: sqlx's default (preferred) verifies no certificate and may fall back to plaintext"
                .into(),
        ),
    }
}

/// The settings that hold a secret, each with the variable that names a file holding it instead.
pub const SECRET_FILES: [(&str, &str); 8] = [
    ("SECKILL_ADMIN_TOKEN", "SECKILL_ADMIN_TOKEN_FILE"),
    ("SECKILL_TOKEN_SECRET", "SECKILL_TOKEN_SECRET_FILE"),
    ("SECKILL_JWT_SECRET", "SECKILL_JWT_SECRET_FILE"),
    ("SECKILL_PAYMENT_SECRET", "SECKILL_PAYMENT_SECRET_FILE"),
    (
        "SECKILL_PAYMENT_SECRET_PREVIOUS",
        "SECKILL_PAYMENT_SECRET_PREVIOUS_FILE",
    ),
    ("SECKILL_KAFKA_SASL_PASSWORD", "SECKILL_KAFKA_SASL_PASSWORD_FILE"),
    ("REDIS_URL", "REDIS_URL_FILE"),
    ("DATABASE_URL", "DATABASE_URL_FILE"),
];

/// A secret file's value: its content less one trailing newline (as `echo` and editors leave it).
pub fn read_secret_file(path: &std::path::Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    Ok(value.strip_suffix('\r').unwrap_or(value).to_string())
}

/// The secrets that come from files rather than from the environment (`get` looks a variable
/// up): `VAR_FILE` names the file (a Kubernetes Secret or a Docker secret mounted as files),
/// or systemd's `LoadCredential=VAR:/path` puts it at `$CREDENTIALS_DIRECTORY/VAR`. The file's
/// content, less one trailing newline, is the value. A secret set both ways, or a file that
/// cannot be read, is an error naming the variable.
pub fn secret_files(
    get: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<&'static str, String>, SettingError> {
    let credentials = get("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let mut out = BTreeMap::new();
    for (var, file_var) in SECRET_FILES {
        let (path, named_by) = match (get(var), get(file_var)) {
            (Some(_), Some(_)) => {
                return Err(bad(file_var, format!("set, and so is {var}: set one of them")))
            }
            (Some(_), None) => continue,
            (None, Some(path)) => (PathBuf::from(path), file_var),
            (None, None) => match credentials.as_ref().map(|dir| dir.join(var)) {
                Some(path) if path.exists() => (path, "CREDENTIALS_DIRECTORY"),
                _ => continue,
            },
        };
        let value = read_secret_file(&path)
            .map_err(|e| bad(named_by, format!("{var}: cannot read {}: {e}", path.display())))?;
        out.insert(var, value);
    }
    Ok(out)
}

/// The process's environment with the secrets of `secret_files` in: what every command reads
/// its settings from.
pub fn lookup() -> Result<impl Fn(&str) -> Option<String>, SettingError> {
    let env = |k: &str| std::env::var(k).ok();
    let files = secret_files(|k| env(k).filter(|v| !v.trim().is_empty()))?;
    Ok(move |k: &str| env(k).or_else(|| files.get(k).cloned()))
}

impl RealSettings {
    /// `Ok(None)` when no store is configured (the embedded default). Partial settings are an
    /// error: a sale half on real stores and half in memory would lose orders on restart.
    pub fn from_env() -> Result<Option<RealSettings>, SettingError> {
        let get = lookup()?;
        Self::from_lookup(move |k| get(k).filter(|v| !v.trim().is_empty()))
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
        let mut redis = redis;
        let redis_var = if redis.cluster {
            "REDIS_CLUSTER_NODES"
        } else {
            "REDIS_URL"
        };
        let tls_urls = redis.urls.iter().filter(|u| u.starts_with("rediss://")).count();
        for url in &redis.urls {
            if !url.starts_with("redis://") && !url.starts_with("rediss://") {
                return Err(bad(
                    redis_var,
                    format!("{:?} is not a redis:// or rediss:// URL", redacted(url)),
                ));
            }
        }
        let files = tls_files(&get, REDIS_TLS)?;
        if tls_urls == 0 {
            if files.is_some() {
                let set = first_set(&get, REDIS_TLS).unwrap_or(redis_var);
                return Err(bad(
                    set,
                    format!("set, but {redis_var} is redis:// (rediss:// is TLS)"),
                ));
            }
        } else if tls_urls < redis.urls.len() {
            return Err(bad(redis_var, "mixes redis:// and rediss:// nodes"));
        } else {
            redis.tls = Some(files.unwrap_or_default());
        }
        let brokers = brokers.ok_or_else(|| bad("KAFKA_BROKERS", "not set (the other stores are)"))?;
        let db = db.ok_or_else(|| bad("DATABASE_URL", "not set (the other stores are)"))?;
        if !db.starts_with("mysql://") && !db.starts_with("mariadb://") {
            return Err(bad(
                "DATABASE_URL",
                format!("{:?} is not a mysql:// URL", redacted(&db)),
            ));
        }
        let db = db.replacen("mariadb://", "mysql://", 1);
        check_database_url(&db)?;
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
        // Default: a record is acknowledged once two replicas hold it, where there are three or
        // more (one broker may be down and the topic still takes writes); else by every replica.
        let min_insync = if kafka.replication >= 3 {
            2
        } else {
            kafka.replication
        };
        kafka.min_insync_replicas =
            count("SECKILL_TOPIC_MIN_INSYNC_REPLICAS", kafka.replication, min_insync)?;
        kafka.security = kafka_security(&get)?;
        Ok(Some(RealSettings {
            redis,
            kafka,
            mysql: MysqlConfig::new(&db),
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
    fn a_ledger_connection_that_does_not_verify_its_server_is_named() {
        for verified in [
            "mysql://u:p@db.internal:3306/s?ssl-mode=verify_identity",
            "mysql://u:p@db.internal/s?ssl-mode=VERIFY_CA&ssl-ca=/x.pem",
            "mysql://u:p@127.0.0.1:3306/s",
            "mysql://u:p@localhost/s",
            "mysql://u:p@[::1]:3306/s?ssl-mode=disabled",
        ] {
            assert_eq!(ledger_tls_unverified(verified), None, "{verified}");
        }
        let why = |u: &str| ledger_tls_unverified(u).unwrap_or_default();
        assert!(why("mysql://u:p@db.internal:3306/s").contains("no ssl-mode"));
        assert!(why("mysql://u:p@10.0.0.5/s?ssl-mode=required").contains("ssl-mode=required"));
        assert!(why("mysql://u:p@db/s?ssl-mode=preferred").contains("ssl-mode=preferred"));
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
        assert_eq!(
            (
                s.kafka.partitions,
                s.kafka.replication,
                s.kafka.min_insync_replicas
            ),
            (6, 1, 1)
        );
        let mut shape = full.to_vec();
        shape.extend([
            ("SECKILL_TOPIC_PARTITIONS", "24"),
            ("SECKILL_TOPIC_REPLICATION", "3"),
        ]);
        let s = settings(&shape).unwrap().unwrap();
        assert_eq!(
            (
                s.kafka.partitions,
                s.kafka.replication,
                s.kafka.min_insync_replicas
            ),
            (24, 3, 2)
        );
        let mut strict = shape.clone();
        strict.push(("SECKILL_TOPIC_MIN_INSYNC_REPLICAS", "3"));
        assert_eq!(settings(&strict).unwrap().unwrap().kafka.min_insync_replicas, 3);
        let mut above = shape.clone();
        above.push(("SECKILL_TOPIC_MIN_INSYNC_REPLICAS", "4"));
        assert_eq!(
            settings(&above).unwrap_err().var,
            "SECKILL_TOPIC_MIN_INSYNC_REPLICAS"
        );
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
    fn tls_follows_the_url_scheme_and_the_security_protocol() {
        let ca = std::env::temp_dir().join(format!("seckill-backend-ca-{}.pem", std::process::id()));
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n").unwrap();
        let ca = ca.to_str().unwrap();
        let base = [
            ("REDIS_URL", "rediss://u:p@h:6380"),
            ("KAFKA_BROKERS", "k:9094"),
            ("DATABASE_URL", "mysql://u@h/d?ssl-mode=verify_ca"),
        ];
        let s = settings(&base).unwrap().unwrap();
        assert_eq!(
            s.redis.tls,
            Some(TlsFiles::default()),
            "rediss:// with the system's roots"
        );
        assert_eq!(s.kafka.security.protocol(), "plaintext");
        let mut all = base.to_vec();
        all.extend([
            ("SECKILL_REDIS_CA_FILE", ca),
            ("SECKILL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("SECKILL_KAFKA_CA_FILE", ca),
            ("SECKILL_KAFKA_SASL_MECHANISM", "scram-sha-512"),
            ("SECKILL_KAFKA_SASL_USERNAME", "seckill"),
            ("SECKILL_KAFKA_SASL_PASSWORD", "pw"),
        ]);
        let s = settings(&all).unwrap().unwrap();
        assert_eq!(
            s.redis.tls.as_ref().and_then(|t| t.ca.as_deref()),
            Some(std::path::Path::new(ca))
        );
        assert_eq!(s.kafka.security.protocol(), "sasl_ssl");
        let sasl = s.kafka.security.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, "SCRAM-SHA-512");
        assert!(
            !format!("{s:?}").contains("\"pw\""),
            "the password is never printed: {s:?}"
        );
        let mut mixed = base.to_vec();
        mixed[0] = ("REDIS_CLUSTER_NODES", "rediss://a:7000,redis://b:7001");
        mixed.push(("SECKILL_REDIS_CLUSTER", "1"));
        assert_eq!(settings(&mixed).unwrap_err().var, "REDIS_CLUSTER_NODES");
        let mut plain_with_ca = base.to_vec();
        plain_with_ca[0] = ("REDIS_URL", "redis://h");
        plain_with_ca.push(("SECKILL_REDIS_CA_FILE", ca));
        assert_eq!(settings(&plain_with_ca).unwrap_err().var, "SECKILL_REDIS_CA_FILE");
        let mut with_passwords = base.to_vec();
        with_passwords[0] = ("REDIS_URL", "redis://u:r3dis-pw-91x@h:6379");
        with_passwords[2] = ("DATABASE_URL", "mysql://u:my-pw-7qz@h/d");
        let s = settings(&with_passwords).unwrap().unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("r3dis-pw-91x") && !shown.contains("my-pw-7qz") && shown.contains("u:***@h"),
            "the stores' passwords are never printed: {shown}"
        );
        for (u, shown) in [
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("redis://:secret@h", "redis://:***@h"),
            ("redis://h:1", "redis://h:1"),
            ("mysql://u@h/d", "mysql://u@h/d"),
        ] {
            assert_eq!(redacted(u), shown);
        }
    }

    #[test]
    fn secrets_come_from_files_named_by_a_variable_or_from_systemd_credentials() {
        let dir = std::env::temp_dir().join(format!("seckill-secret-files-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("creds")).unwrap();
        std::fs::write(dir.join("jwt"), "jwt-from-a-file-0123456789abcdef\n").unwrap();
        std::fs::write(dir.join("creds/SECKILL_ADMIN_TOKEN"), "admin-from-systemd-0123").unwrap();
        let (jwt, creds) = (
            dir.join("jwt").display().to_string(),
            dir.join("creds").display().to_string(),
        );
        let files = |vars: &[(&str, &str)]| {
            secret_files(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        let got = files(&[
            ("SECKILL_JWT_SECRET_FILE", &jwt),
            ("CREDENTIALS_DIRECTORY", &creds),
            ("SECKILL_TOKEN_SECRET", "from-the-environment"),
        ])
        .unwrap();
        assert_eq!(got["SECKILL_JWT_SECRET"], "jwt-from-a-file-0123456789abcdef");
        assert_eq!(got["SECKILL_ADMIN_TOKEN"], "admin-from-systemd-0123");
        assert!(
            !got.contains_key("SECKILL_TOKEN_SECRET"),
            "the environment's own value stands"
        );
        let e = files(&[("SECKILL_JWT_SECRET_FILE", &jwt), ("SECKILL_JWT_SECRET", "x")]).unwrap_err();
        assert_eq!(e.var, "SECKILL_JWT_SECRET_FILE");
        let e = files(&[("DATABASE_URL_FILE", "/nonexistent/db-url")]).unwrap_err();
        assert_eq!(e.var, "DATABASE_URL_FILE");
        assert!(e.reason.contains("/nonexistent/db-url"), "{}", e.reason);
        std::fs::remove_dir_all(&dir).unwrap();
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
