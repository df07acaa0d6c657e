//! Single use of purchase tokens: a token's nonce is claimed before the purchase runs, and a
//! second claim of the same nonce fails. Real stores: Redis `SET key 1 NX PX ttl` (shared by every
//! engine); embedded: a map in this process. Both forget a nonce once its token has expired.

use crate::adapters::redis::RedisConn;
use crate::adapters::script::Reply;
use crate::ports::{PortError, PortResult};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

pub trait NonceStore: Clone + Send + Sync + 'static {
    /// Claim `nonce` until `expires_ms` (clock ms). `Ok(false)`: already used.
    fn claim(
        &self,
        nonce: u64,
        expires_ms: u64,
        now_ms: u64,
    ) -> impl Future<Output = PortResult<bool>> + Send;
}

/// In-process nonces. A std Mutex: nothing awaits while it is held.
#[derive(Clone, Default)]
pub struct EmbeddedNonces {
    used: Arc<Mutex<HashMap<u64, u64>>>,
}

/// Prune expired nonces when the map grows past this (bounded by issue rate × token lifetime).
const PRUNE_AT: usize = 100_000;

impl NonceStore for EmbeddedNonces {
    async fn claim(&self, nonce: u64, expires_ms: u64, now_ms: u64) -> PortResult<bool> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if used.len() >= PRUNE_AT {
            used.retain(|_, exp| *exp > now_ms);
        }
        match used.get(&nonce) {
            Some(exp) if *exp > now_ms => Ok(false),
            _ => {
                used.insert(nonce, expires_ms);
                Ok(true)
            }
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
}

impl NonceStore for RedisNonces {
    async fn claim(&self, nonce: u64, expires_ms: u64, now_ms: u64) -> PortResult<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_nonce_is_claimed_once_until_it_expires() {
        let n = EmbeddedNonces::default();
        assert!(n.claim(1, 100, 0).await.unwrap());
        assert!(!n.claim(1, 100, 50).await.unwrap());
        assert!(n.claim(2, 100, 50).await.unwrap());
        assert!(
            n.claim(1, 300, 100).await.unwrap(),
            "an expired token's nonce is forgotten"
        );
    }
}
