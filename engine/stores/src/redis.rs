//! Real Redis behind `ScriptConn`: one server through a `ConnectionManager` (reconnects by
//! itself), or a Redis Cluster through `redis::cluster_async`. Everything else — keys, script
//! arguments, reply shapes — is `ScriptedStockCache`, shared with the embedded model, so the
//! same Lua runs in production and in the simulation.
//!
//! Cluster mode needs nothing special: every script touches the keys of one bucket, which share
//! the hash tag `{A.b}` (DESIGN §4), so EVALSHA is routed by its first key to the bucket's node.
//!
//! TLS: `rediss://` URLs (one server or every cluster node), trusting `RedisConfig::tls`'s CA
//! file or else the system's roots; credentials go in the URL (`rediss://user:password@host`).
//!
//! Failure mapping (DESIGN §3): an answer from the server, error replies included, is a `Reply`;
//! a refused connection is `Determinate` (nothing was sent); a timeout or a dropped connection is
//! `Indeterminate` (the script may have run). Every call is bounded by `RedisConfig::timeout`.

use crate::TlsFiles;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ClientTlsConfig, ErrorKind, RedisError, TlsCertificates, Value};
use seckill_core::adapters::script::{Reply, ScriptConn, ScriptedStockCache};
use seckill_core::ports::{PortError, PortResult};
use std::time::Duration;

#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://host:port` (or `rediss://` for TLS) of one server, or several cluster nodes
    /// (seed list).
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Set with `rediss://` URLs: what to trust and how to prove who we are.
    pub tls: Option<TlsFiles>,
    /// Bound on one script call, connect included: past it the outcome is unknown.
    pub timeout: Duration,
}

/// The URLs' passwords are never shown (`redis://user:***@host:6379`).
impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| super::redacted(u)).collect();
        f.debug_struct("RedisConfig")
            .field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisConfig {
    pub fn single(url: &str) -> Self {
        RedisConfig {
            urls: vec![url.to_string()],
            cluster: false,
            tls: None,
            timeout: Duration::from_millis(500),
        }
    }

    /// From a comma-separated list of node URLs.
    pub fn cluster(nodes: &str) -> Self {
        RedisConfig {
            urls: nodes
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            cluster: true,
            tls: None,
            timeout: Duration::from_millis(500),
        }
    }
}

fn read_pem(path: &std::path::Path) -> PortResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        PortError::determinate("redis connect", format!("reading {}: {e}", path.display())).caused_by(e)
    })
}

fn certificates(tls: &TlsFiles) -> PortResult<TlsCertificates> {
    Ok(TlsCertificates {
        client_tls: match &tls.client {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: read_pem(cert)?,
                client_key: read_pem(key)?,
            }),
            None => None,
        },
        root_cert: tls.ca.as_deref().map(read_pem).transpose()?,
    })
}

/// A cheap-to-clone handle (both connection kinds multiplex over shared sockets).
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConn {
    pub async fn connect(cfg: &RedisConfig) -> PortResult<RedisConn> {
        let fail = |e: RedisError| PortError::determinate_from("redis connect", e);
        let connect = async {
            if cfg.cluster {
                let mut builder = ClusterClient::builder(cfg.urls.clone())
                    .connection_timeout(cfg.timeout)
                    .response_timeout(cfg.timeout)
                    // A node that is down must fail the call fast (503), not be retried for seconds.
                    .retries(1);
                if let Some(tls) = &cfg.tls {
                    builder = builder.certs(certificates(tls)?);
                }
                let client = builder.build().map_err(fail)?;
                Ok(RedisConn::Cluster(
                    client.get_async_connection().await.map_err(fail)?,
                ))
            } else {
                let url = cfg
                    .urls
                    .first()
                    .ok_or_else(|| PortError::determinate("redis connect", "no url"))?;
                let client = match &cfg.tls {
                    Some(tls) => redis::Client::build_with_tls(url.as_str(), certificates(tls)?),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(fail)?;
                let manager_cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(cfg.timeout))
                    .set_response_timeout(Some(cfg.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                Ok(RedisConn::Single(
                    client
                        .get_connection_manager_with_config(manager_cfg)
                        .await
                        .map_err(fail)?,
                ))
            }
        };
        match tokio::time::timeout(cfg.timeout * 4, connect).await {
            Ok(conn) => conn,
            Err(_) => Err(PortError::determinate("redis connect", "timed out")),
        }
    }

    /// Run one command; server error replies come back as `Reply::Error`.
    pub async fn query(&self, op: &'static str, cmd: &redis::Cmd) -> PortResult<Reply> {
        let result = match self.clone() {
            RedisConn::Single(mut c) => cmd.query_async::<Value>(&mut c).await,
            RedisConn::Cluster(mut c) => cmd.query_async::<Value>(&mut c).await,
        };
        match result {
            Ok(v) => Ok(reply_of(v)),
            Err(e) => match server_error(&e) {
                Some(text) => Ok(Reply::Error(text)),
                None if e.is_connection_refusal() => Err(PortError::determinate_from(op, e)),
                None => Err(PortError::indeterminate_from(op, e)),
            },
        }
    }

    /// EVALSHA of `sha` once per call of `calls` (keys, arguments), in one pipeline: one round
    /// trip for all of them (single server only: a cluster's keys live on several nodes). For
    /// `seckill bench`'s limit row: what one Redis core does when the client is not the
    /// bottleneck.
    pub async fn eval_sha_pipelined(
        &self,
        sha: &str,
        calls: &[(Vec<String>, Vec<String>)],
    ) -> PortResult<Vec<Reply>> {
        const OP: &str = "evalsha pipeline";
        let RedisConn::Single(mut c) = self.clone() else {
            return Err(PortError::determinate(
                OP,
                "a pipeline of scripts needs a single server",
            ));
        };
        let mut pipe = redis::pipe();
        for (keys, args) in calls {
            pipe.cmd("EVALSHA").arg(sha).arg(keys.len()).arg(keys).arg(args);
        }
        match pipe.query_async::<Vec<Value>>(&mut c).await {
            Ok(values) => Ok(values.into_iter().map(reply_of).collect()),
            Err(e) => Err(PortError::indeterminate_from(OP, e)),
        }
    }

    /// Run one command against every node (cluster: every master), for tests and tools.
    pub async fn query_nodes(&self, op: &'static str, cmd: &redis::Cmd) -> PortResult<Vec<Reply>> {
        match self {
            RedisConn::Single(_) => Ok(vec![self.query(op, cmd).await?]),
            RedisConn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
                let route = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::Special),
                ));
                let mut c = c.clone();
                match c.route_command(cmd.clone(), route).await {
                    Ok(Value::Map(per_node)) => Ok(per_node.into_iter().map(|(_, v)| reply_of(v)).collect()),
                    Ok(v) => Ok(vec![reply_of(v)]),
                    Err(e) => Err(PortError::indeterminate_from(op, e)),
                }
            }
        }
    }
}

/// `Some("CODE detail")` if the server answered with an error reply.
fn server_error(e: &RedisError) -> Option<String> {
    match e.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => {
            let code = e.code().unwrap_or("ERR");
            Some(match e.detail() {
                Some(d) => format!("{code} {d}"),
                None => code.to_string(),
            })
        }
        _ => None,
    }
}

/// RESP2/RESP3 value → the `Reply` the scripts' callers understand (RESP2 shapes).
pub fn reply_of(v: Value) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(b) => Reply::Bulk(b),
        Value::SimpleString(s) => Reply::Status(s),
        Value::Okay => Reply::Status("OK".to_string()),
        Value::Array(items) | Value::Set(items) => Reply::Array(items.into_iter().map(reply_of).collect()),
        Value::Map(kvs) => Reply::Array(
            kvs.into_iter()
                .flat_map(|(k, v)| [reply_of(k), reply_of(v)])
                .collect(),
        ),
        Value::Boolean(b) => Reply::Int(b as i64),
        Value::VerbatimString { text, .. } => Reply::Bulk(text.into_bytes()),
        Value::ServerError(e) => Reply::Error(match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_string(),
        }),
        other => Reply::Bulk(format!("{other:?}").into_bytes()),
    }
}

impl ScriptConn for RedisConn {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(keys.len()).arg(keys).arg(args);
        self.query("evalsha", &cmd).await
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(source);
        // In a cluster the script must be known on every master (any bucket may live anywhere).
        for reply in self.query_nodes("script load", &cmd).await? {
            if let Reply::Error(e) = reply {
                return Err(PortError::determinate("script load", e));
            }
        }
        Ok(())
    }

    async fn run_id(&self) -> PortResult<String> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let mut ids = Vec::new();
        for reply in self.query_nodes("info", &cmd).await? {
            let text = match reply {
                Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
                Reply::Status(s) => s,
                other => {
                    return Err(PortError::indeterminate(
                        "info",
                        format!("unexpected reply {other:?}"),
                    ))
                }
            };
            ids.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("run_id:"))
                    .map(|s| s.trim().to_string()),
            );
        }
        if ids.is_empty() {
            return Err(PortError::indeterminate("info", "no run_id in INFO server"));
        }
        // A cluster's epoch changes when any master restarts.
        ids.sort();
        Ok(ids.join(","))
    }
}

pub type RedisStockCache = ScriptedStockCache<RedisConn>;

pub async fn connect_stock_cache(cfg: &RedisConfig) -> PortResult<RedisStockCache> {
    Ok(ScriptedStockCache::new(RedisConn::connect(cfg).await?))
}

/// A rate limit shared by every process through Redis (`lua/limit.lua`: GCRA on Redis's clock).
/// Kept apart from the stock scripts (`Script`): it touches no bucket, and neither the embedded
/// stores nor the simulation run it.
#[derive(Clone)]
pub struct RedisRateLimiter {
    conn: RedisConn,
}

/// What the shared limit answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Refused: `cost` requests fit again after this long.
    Refused {
        retry_after: Duration,
    },
}

const LIMIT_LUA: &str = include_str!("../../../lua/limit.lua");

impl RedisRateLimiter {
    pub fn new(conn: RedisConn) -> Self {
        RedisRateLimiter { conn }
    }

    /// Take `cost` requests of the limit `key` (`per_sec`, `burst` at once).
    pub async fn acquire(&self, key: &str, per_sec: u32, burst: u32, cost: u32) -> PortResult<Admission> {
        static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let sha = SHA.get_or_init(|| seckill_core::adapters::script::sha1_hex(LIMIT_LUA));
        let keys = [key.to_string()];
        let args = [per_sec.to_string(), burst.to_string(), cost.to_string()];
        let mut reply = self.conn.eval_sha(sha, &keys, &args).await?;
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            self.conn.script_load(LIMIT_LUA).await?;
            reply = self.conn.eval_sha(sha, &keys, &args).await?;
        }
        match reply {
            Reply::Array(a) => match a.as_slice() {
                [Reply::Int(1), Reply::Int(_)] => Ok(Admission::Admitted),
                [Reply::Int(0), Reply::Int(ms)] => Ok(Admission::Refused {
                    retry_after: Duration::from_millis((*ms).max(1) as u64),
                }),
                other => Err(PortError::indeterminate(
                    "limit",
                    format!("unexpected reply {other:?}"),
                )),
            },
            // The script checks its arguments before it writes: an error reply changed nothing.
            Reply::Error(e) => Err(PortError::determinate("limit", e)),
            other => Err(PortError::indeterminate(
                "limit",
                format!("unexpected reply {other:?}"),
            )),
        }
    }
}

/// Nonces in Redis, one key each (`sk:tok:{<nonce>}`: spread over a cluster by their own tag).
#[derive(Clone)]
pub struct RedisNonces {
    conn: RedisConn,
}

impl RedisNonces {
    pub fn new(conn: RedisConn) -> Self {
        RedisNonces { conn }
    }

    /// Claim `nonce` until `expires_ms` (clock ms): `SET key 1 NX PX ttl`. `Ok(false)`: already
    /// used.
    pub async fn claim_nonce(&self, nonce: u64, expires_ms: u64, now_ms: u64) -> PortResult<bool> {
        let ttl_ms = expires_ms.saturating_sub(now_ms).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("sk:tok:{{{nonce:016x}}}"))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms);
        match self.conn.query("claim token", &cmd).await? {
            Reply::Status(s) if s == "OK" => Ok(true),
            Reply::Nil => Ok(false),
            other => Err(PortError::indeterminate(
                "claim token",
                format!("unexpected reply {other:?}"),
            )),
        }
    }
}
