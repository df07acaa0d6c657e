//! Single use of purchase tokens: a token's nonce is claimed before the purchase runs, and a
//! second claim of the same nonce fails. Real stores: Redis `SET key 1 NX PX ttl` (shared by every
//! engine); embedded: a map in this process. Both forget a nonce once its token has expired.

use seckill_core::ports::PortResult;
pub use seckill_stores::redis::RedisNonces;
use std::collections::{BTreeSet, HashMap};
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
    used: Arc<Mutex<Used>>,
}

/// Claimed nonces, with their expiries in order so that forgetting the expired ones costs only
/// what expired (a scan of the whole map on every claim made a second 100k-user sale in one
/// process run at a seventh of the first). Bounded by the claim rate × the token lifetime.
#[derive(Default)]
struct Used {
    expiry_of: HashMap<u64, u64>,
    by_expiry: BTreeSet<(u64, u64)>,
}

impl EmbeddedNonces {
    /// Nonces remembered now (claimed and not yet known expired).
    pub fn remembered(&self) -> usize {
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expiry_of
            .len()
    }
}

impl NonceStore for EmbeddedNonces {
    async fn claim(&self, nonce: u64, expires_ms: u64, now_ms: u64) -> PortResult<bool> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let Used { expiry_of, by_expiry } = &mut *used;
        while let Some(&(exp, n)) = by_expiry.first() {
            if exp > now_ms {
                break;
            }
            by_expiry.pop_first();
            // A nonce claimed again after it expired has a newer entry: keep that one.
            if expiry_of.get(&n) == Some(&exp) {
                expiry_of.remove(&n);
            }
        }
        if expiry_of.contains_key(&nonce) {
            return Ok(false);
        }
        expiry_of.insert(nonce, expires_ms);
        by_expiry.insert((expires_ms, nonce));
        Ok(true)
    }
}

/// Nonces in Redis (`seckill_stores::redis::RedisNonces`), shared by every engine.
impl NonceStore for RedisNonces {
    async fn claim(&self, nonce: u64, expires_ms: u64, now_ms: u64) -> PortResult<bool> {
        self.claim_nonce(nonce, expires_ms, now_ms).await
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
        assert!(!n.claim(1, 300, 200).await.unwrap(), "and claimed once again");
    }

    #[tokio::test]
    async fn expired_nonces_are_forgotten_as_time_passes() {
        let n = EmbeddedNonces::default();
        for nonce in 0..1_000 {
            assert!(n.claim(nonce, 100 + nonce, 0).await.unwrap());
        }
        assert_eq!(n.remembered(), 1_000);
        // At 600, the tokens that expired by then (nonces 0..=500) are forgotten.
        assert!(n.claim(5_000, 10_000, 600).await.unwrap());
        assert_eq!(n.remembered(), 1_000 - 501 + 1);
        assert!(
            !n.claim(700, 10_000, 600).await.unwrap(),
            "a live nonce stays claimed"
        );
        assert!(
            n.claim(3, 10_000, 600).await.unwrap(),
            "an expired one may be claimed again"
        );
    }
}
