//! Rate limits (GCRA, `governor`): one per client IP (IPv6 per /64: one subscriber's prefix),
//! one per user, one for the whole process, plus a warm-up ramp that admits a share of requests
//! rising linearly to all over the first `ramp_ms` of a sale. Checked in that order (DESIGN §12):
//! a flooding client is stopped by its own limit before it can drain the shared one, and the
//! per-user quota is charged only once the caller is known to be that user.
//!
//! With real stores a second layer holds across processes (`SharedLimits`): the per-user and
//! global limits again, in Redis (`lua/limit.lua`), for what this process's own layer admitted —
//! so that N API processes admit what the configuration says, not N times it.
//!
//! Time comes from `tokio::time` (a governor `Clock` over it), like everywhere in the engine; the
//! shared layer's from Redis's clock, the one every process sees.

use super::config::RateLimits;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use seckill_stores::redis::{Admission, RedisRateLimiter};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `governor`'s clock over `tokio::time`.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Clock for TokioClock {
    type Instant = Nanos;
    fn now(&self) -> Nanos {
        Nanos::from(self.origin.elapsed())
    }
}

type Keyed<K> = RateLimiter<K, DefaultKeyedStateStore<K>, TokioClock, NoOpMiddleware<Nanos>>;
type Direct = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>;

/// Which limit refused a request, and when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub scope: &'static str,
    pub retry_after: Duration,
}

pub struct Limits {
    clock: TokioClock,
    global: Direct,
    per_user: Keyed<u64>,
    per_ip: Keyed<IpAddr>,
    ramp_ms: u64,
    ramp_seen: AtomicU64,
    shared: Option<SharedLimits>,
}

/// The limits every API process shares, in Redis: a user's key per request, and the global key
/// leased a few permits at a time (a fiftieth of a second's worth), so that the global limit
/// costs each process at most about fifty Redis calls a second however busy it is. A lease not
/// spent within `LEASE_FOR` is dropped: permits counted and not used, never permits used twice.
/// A global lease refused is remembered until Redis said to come back: a flood costs no Redis
/// call per refused request. Redis failing fails open (counted, and the process's own layer
/// still holds) and is not asked again for `STAND_ASIDE`: a request does not wait for a store
/// that is down before it is answered — the purchase that follows needs Redis anyway and answers
/// 503 at once without it, and the order routes stay up.
pub struct SharedLimits {
    store: RedisRateLimiter,
    per_user_per_sec: u32,
    global_per_sec: u32,
    lease: std::sync::Mutex<Lease>,
    /// One refill of the lease at a time (the others wait for it and share what it took).
    refill: tokio::sync::Mutex<()>,
    /// Until when the shared limits stand aside after Redis failed to answer them.
    aside_until: std::sync::Mutex<Option<tokio::time::Instant>>,
}

#[derive(Default)]
struct Lease {
    left: u32,
    until: Option<tokio::time::Instant>,
    /// The last refill was refused: no permit before then.
    refused_until: Option<tokio::time::Instant>,
}

/// How long leased global permits may be spent.
const LEASE_FOR: Duration = Duration::from_millis(50);
/// How long the shared limits stand aside after Redis failed to answer them.
const STAND_ASIDE: Duration = Duration::from_secs(1);

impl SharedLimits {
    pub fn new(store: RedisRateLimiter, cfg: &RateLimits) -> SharedLimits {
        SharedLimits {
            store,
            per_user_per_sec: cfg.per_user_per_sec.max(1),
            global_per_sec: cfg.global_per_sec.max(1),
            lease: Default::default(),
            refill: Default::default(),
            aside_until: Default::default(),
        }
    }

    async fn acquire(&self, scope: &'static str, key: &str, per_sec: u32, cost: u32) -> Result<(), Limited> {
        let aside = *self.aside_until.lock().unwrap_or_else(|p| p.into_inner());
        if aside.is_some_and(|u| tokio::time::Instant::now() < u) {
            return Ok(());
        }
        match self.store.acquire(key, per_sec, per_sec, cost).await {
            Ok(Admission::Admitted) => Ok(()),
            Ok(Admission::Refused { retry_after }) => Err(Limited { scope, retry_after }),
            Err(e) => {
                metrics::counter!("seckill_shared_limit_errors_total", "scope" => scope).increment(1);
                tracing::debug!(scope, error = %e, "the shared rate limit is unavailable; admitted");
                *self.aside_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(tokio::time::Instant::now() + STAND_ASIDE);
                Ok(())
            }
        }
    }

    async fn user(&self, user: u64) -> Result<(), Limited> {
        self.acquire("user", &format!("sk:rl:{{u{user}}}"), self.per_user_per_sec, 1)
            .await
    }

    /// One permit of the leased global limit: `Some(Ok)` spent, `Some(Err)` refused until Redis
    /// said to come back, `None` a refill is due.
    fn spend(&self) -> Option<Result<(), Limited>> {
        let now = tokio::time::Instant::now();
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = lease.refused_until.filter(|u| now < *u) {
            let retry_after = until - now;
            return Some(Err(Limited {
                scope: "global",
                retry_after,
            }));
        }
        if lease.until.is_some_and(|u| now < u) && lease.left > 0 {
            lease.left -= 1;
            return Some(Ok(()));
        }
        None
    }

    async fn global(&self) -> Result<(), Limited> {
        if let Some(spent) = self.spend() {
            return spent;
        }
        let _one = self.refill.lock().await;
        // Another request refilled the lease (or was refused) while this one waited.
        if let Some(spent) = self.spend() {
            return spent;
        }
        let size = (self.global_per_sec / 50).max(1);
        let got = self
            .acquire("global", "sk:rl:{global}", self.global_per_sec, size)
            .await;
        let now = tokio::time::Instant::now();
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = match &got {
            Ok(()) => Lease {
                left: size - 1,
                until: Some(now + LEASE_FOR),
                refused_until: None,
            },
            Err(l) => Lease {
                refused_until: Some(now + l.retry_after),
                ..Lease::default()
            },
        };
        got
    }
}

/// The key a client address is limited under: IPv4 as is, IPv6 by its /64 (a subscriber gets a
/// whole /64 and picks addresses in it freely).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// A forwarding header's hop that is not an IP address (the header is refused, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnAddress;

/// The client's address (DESIGN §12). From a peer in `trusted` (a proxy of ours), the rightmost
/// hop of the forwarding header (`values`: every instance of it, in order, read as one list)
/// that is not itself a trusted proxy — the one the first proxy we trust saw; hops further left
/// were written by the client and prove nothing. From any other peer, the peer, whatever the
/// header says.
pub fn client_ip<'a>(
    peer: IpAddr,
    values: impl IntoIterator<Item = &'a [u8]>,
    trusted: &[ipnet::IpNet],
) -> Result<IpAddr, NotAnAddress> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Ok(peer);
    }
    let mut hops = Vec::new();
    for v in values {
        let v = std::str::from_utf8(v)
            .ok()
            .filter(|v| v.is_ascii())
            .ok_or(NotAnAddress)?;
        hops.extend(v.split(',').map(str::trim));
    }
    let mut client = peer;
    for hop in hops.iter().rev() {
        client = hop.parse().map_err(|_| NotAnAddress)?;
        if !is_trusted(&client) {
            break;
        }
    }
    Ok(client)
}

fn quota(per_sec: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(per_sec.max(1)).expect("at least 1"))
}

impl Limits {
    /// The process's own limits, and with `shared` the layer every process shares behind them.
    pub fn new(cfg: &RateLimits, shared: Option<RedisRateLimiter>) -> Limits {
        let clock = TokioClock {
            origin: tokio::time::Instant::now(),
        };
        Limits {
            global: RateLimiter::direct_with_clock(quota(cfg.global_per_sec), clock.clone()),
            per_user: RateLimiter::new(
                quota(cfg.per_user_per_sec),
                DefaultKeyedStateStore::default(),
                clock.clone(),
            ),
            per_ip: RateLimiter::new(
                quota(cfg.per_ip_per_sec),
                DefaultKeyedStateStore::default(),
                clock.clone(),
            ),
            clock,
            ramp_ms: cfg.ramp_ms,
            ramp_seen: AtomicU64::new(0),
            shared: shared.map(|store| SharedLimits::new(store, cfg)),
        }
    }

    fn wait(&self, not_until: &governor::NotUntil<Nanos>) -> Duration {
        not_until.wait_time_from(self.clock.now())
    }

    /// The per-client limit (before anything else: it costs one map lookup).
    pub fn check_ip(&self, ip: Option<IpAddr>) -> Result<(), Limited> {
        let Some(ip) = ip else { return Ok(()) };
        self.per_ip.check_key(&client_key(ip)).map_err(|n| Limited {
            scope: "ip",
            retry_after: self.wait(&n),
        })
    }

    /// The per-user limit: only for a verified caller (else anyone could lock a user out).
    pub fn check_user(&self, user: u64) -> Result<(), Limited> {
        self.per_user.check_key(&user).map_err(|n| Limited {
            scope: "user",
            retry_after: self.wait(&n),
        })
    }

    /// The ramp, then the process-wide limit. `since_open_ms`: how long the activity has been
    /// open (the ramp applies while it is below `ramp_ms`).
    pub fn check_global(&self, since_open_ms: Option<u64>) -> Result<(), Limited> {
        if let Some(t) = since_open_ms.filter(|t| *t < self.ramp_ms) {
            // Admit t/ramp of the requests: every request counts, a deterministic share passes.
            let n = self.ramp_seen.fetch_add(1, Ordering::Relaxed) % 1_000;
            if n * self.ramp_ms >= t * 1_000 {
                return Err(Limited {
                    scope: "ramp",
                    retry_after: Duration::from_millis((self.ramp_ms - t).min(1_000)),
                });
            }
        }
        self.global.check().map_err(|n| Limited {
            scope: "global",
            retry_after: self.wait(&n),
        })
    }

    /// Every limit, in order, for one request (the per-user one with a verified user).
    pub fn check(&self, user: u64, ip: Option<IpAddr>, since_open_ms: Option<u64>) -> Result<(), Limited> {
        self.check_ip(ip)?;
        self.check_user(user)?;
        self.check_global(since_open_ms)
    }

    /// The shared layer, for a request this process's own limits admitted: the user's limit,
    /// then (`global`: on the purchase funnel) the global one. Without it, nothing to check.
    pub async fn check_shared(&self, user: u64, global: bool) -> Result<(), Limited> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        shared.user(user).await?;
        if global {
            shared.global().await?;
        }
        Ok(())
    }

    /// Forget keys idle long enough to be back at full quota (bounds the maps' memory).
    pub fn prune(&self) {
        self.per_user.retain_recent();
        self.per_ip.retain_recent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(ramp_ms: u64) -> Limits {
        Limits::new(
            &RateLimits {
                global_per_sec: 1_000,
                per_user_per_sec: 2,
                per_ip_per_sec: 3,
                ramp_ms,
            },
            None,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn per_ip_then_per_user_then_recovery_with_time() {
        let l = limits(0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(l.check(1, Some(ip), None), Ok(()));
        assert_eq!(l.check(1, Some(ip), None), Ok(()));
        let e = l.check(1, Some(ip), None).unwrap_err();
        assert_eq!(e.scope, "user");
        assert!(e.retry_after > Duration::ZERO && e.retry_after <= Duration::from_millis(500));
        assert_eq!(l.check(2, Some(ip), None).unwrap_err().scope, "ip");
        assert_eq!(l.check(3, None, None), Ok(()), "no IP, no IP limit");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            l.check(1, Some(ip), None),
            Ok(()),
            "the quota comes back with time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_does_not_drain_the_global_quota() {
        let l = Limits::new(
            &RateLimits {
                global_per_sec: 10,
                per_user_per_sec: 100,
                per_ip_per_sec: 3,
                ramp_ms: 0,
            },
            None,
        );
        let flooder: IpAddr = "203.0.113.9".parse().unwrap();
        let refused = (0..100)
            .filter(|u| l.check(*u, Some(flooder), None).is_err())
            .count();
        assert_eq!(refused, 97, "the flooder is stopped by its own limit");
        let others = (0..7u8)
            .filter(|i| {
                l.check(1_000, Some(IpAddr::from([198, 51, 100, *i])), None)
                    .is_ok()
            })
            .count();
        assert_eq!(others, 7, "everyone else still has the global quota");
    }

    #[test]
    fn ipv6_clients_are_limited_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(client_key(mapped), "10.1.2.3".parse::<IpAddr>().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn the_ramp_admits_a_growing_share() {
        let l = limits(1_000);
        let admitted = |t: u64| {
            (0..1_000u64)
                .filter(|u| l.check(u + t * 10_000, None, Some(t)).is_ok())
                .count()
        };
        let early = admitted(100);
        tokio::time::advance(Duration::from_secs(2)).await;
        let late = admitted(900);
        assert!((90..=110).contains(&early), "{early} of 1000 at 10% of the ramp");
        assert!(late > 850, "{late} of 1000 at 90% of the ramp");
    }
}
