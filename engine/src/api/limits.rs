//! Rate limits (GCRA, `governor`): one for the whole process, one per user, one per client IP —
//! checked cheapest first, before anything touches a store — plus a warm-up ramp that admits a
//! share of requests rising linearly to all over the first `ramp_ms` of a sale.
//!
//! Time comes from `tokio::time` (a governor `Clock` over it), like everywhere in the engine.

use super::config::RateLimits;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
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
}

fn quota(per_sec: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(per_sec.max(1)).expect("at least 1"))
}

impl Limits {
    pub fn new(cfg: &RateLimits) -> Limits {
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
        }
    }

    fn wait(&self, not_until: &governor::NotUntil<Nanos>) -> Duration {
        not_until.wait_time_from(self.clock.now())
    }

    /// Check every limit for one request (the global one, then the keyed ones).
    pub fn check(&self, user: u64, ip: Option<IpAddr>, since_open_ms: Option<u64>) -> Result<(), Limited> {
        self.check_global()?;
        self.check_keyed(user, ip, since_open_ms)
    }

    /// The process-wide limit: one atomic step.
    pub fn check_global(&self) -> Result<(), Limited> {
        self.global.check().map_err(|n| Limited {
            scope: "global",
            retry_after: self.wait(&n),
        })
    }

    /// The ramp, then the per-IP and per-user limits (map lookups). `since_open_ms`: how long the
    /// activity has been open (the ramp applies while it is below `ramp_ms`).
    pub fn check_keyed(
        &self,
        user: u64,
        ip: Option<IpAddr>,
        since_open_ms: Option<u64>,
    ) -> Result<(), Limited> {
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
        if let Some(ip) = ip {
            self.per_ip.check_key(&ip).map_err(|n| Limited {
                scope: "ip",
                retry_after: self.wait(&n),
            })?;
        }
        self.per_user.check_key(&user).map_err(|n| Limited {
            scope: "user",
            retry_after: self.wait(&n),
        })
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
        Limits::new(&RateLimits {
            global_per_sec: 1_000,
            per_user_per_sec: 2,
            per_ip_per_sec: 3,
            ramp_ms,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn per_user_then_per_ip_then_recovery_with_time() {
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
