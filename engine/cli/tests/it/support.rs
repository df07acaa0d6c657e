//! Test doubles built from the real embedded ports: a script connection that counts calls or
//! fails on demand, and a bus whose publish fails on demand. Faults live in wrappers, not in
//! the code under test (STYLE §6).

use seckill_core::adapters::embedded::{EmbeddedBus, EmbeddedRedis};
use seckill_core::adapters::script::{Reply, ScriptConn, ScriptedStockCache};
use seckill_core::domain::Reservation;
use seckill_core::ports::{DeadLetterPage, OrderBus, PortError, PortResult};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// What the next calls through a wrapper do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    FailDeterminate = 1,
    /// The call happens, but the caller hears an error (a lost reply).
    FailAfter = 2,
    /// The request is lost on the way: nothing happens, and the caller hears a timeout.
    LostBefore = 3,
}

#[derive(Clone, Default)]
pub struct Knob(Arc<AtomicU8>);

impl Knob {
    pub fn set(&self, m: Mode) {
        self.0.store(m as u8, Ordering::SeqCst);
    }
    fn get(&self) -> Mode {
        match self.0.load(Ordering::SeqCst) {
            1 => Mode::FailDeterminate,
            2 => Mode::FailAfter,
            3 => Mode::LostBefore,
            _ => Mode::Pass,
        }
    }
}

#[derive(Clone, Default)]
pub struct TestRedis {
    pub inner: EmbeddedRedis,
    pub calls: Arc<AtomicU64>,
    pub knob: Knob,
}

impl ScriptConn for TestRedis {
    async fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> PortResult<Reply> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.knob.get() {
            Mode::Pass => self.inner.eval_sha(sha, keys, args).await,
            Mode::FailDeterminate => Err(PortError::determinate("redis", "connection refused")),
            Mode::FailAfter => {
                let _ = self.inner.eval_sha(sha, keys, args).await;
                Err(PortError::indeterminate(
                    "redis",
                    "timed out waiting for the reply",
                ))
            }
            Mode::LostBefore => Err(PortError::indeterminate("redis", "timed out")),
        }
    }

    async fn script_load(&self, source: &str) -> PortResult<()> {
        self.inner.script_load(source).await
    }

    async fn run_id(&self) -> PortResult<String> {
        self.inner.run_id().await
    }
}

pub type TestCache = ScriptedStockCache<TestRedis>;

type Hook = Box<dyn Fn() + Send + Sync>;

#[derive(Clone)]
pub struct TestBus {
    pub inner: EmbeddedBus,
    pub knob: Knob,
    /// Runs at every publish, before the knob decides (something else happening meanwhile).
    hook: Arc<std::sync::Mutex<Option<Hook>>>,
}

impl TestBus {
    pub fn new(inner: EmbeddedBus) -> Self {
        TestBus {
            inner,
            knob: Knob::default(),
            hook: Arc::default(),
        }
    }

    pub fn on_publish(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(f));
    }
}

impl OrderBus for TestBus {
    type Source = <EmbeddedBus as OrderBus>::Source;

    async fn publish(&self, r: &Reservation) -> PortResult<()> {
        if let Some(f) = self.hook.lock().unwrap().as_ref() {
            f();
        }
        match self.knob.get() {
            Mode::Pass => self.inner.publish(r).await,
            Mode::FailDeterminate => Err(PortError::determinate("publish", "broker refused")),
            Mode::FailAfter => {
                self.inner.publish(r).await?;
                Err(PortError::indeterminate(
                    "publish",
                    "no ack within message.timeout.ms",
                ))
            }
            Mode::LostBefore => Err(PortError::indeterminate(
                "publish",
                "no ack within message.timeout.ms",
            )),
        }
    }

    async fn publish_raw(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        self.inner.publish_raw(key, payload).await
    }

    async fn lag(&self, group: &str) -> PortResult<u64> {
        self.inner.lag(group).await
    }

    async fn dead_letters(&self, from: (u32, u64), limit: usize) -> PortResult<DeadLetterPage> {
        self.inner.dead_letters(from, limit).await
    }

    async fn purge_dead_letters(&self, before: &[(u32, u64)]) -> PortResult<u64> {
        self.inner.purge_dead_letters(before).await
    }

    async fn subscribe(&self, group: &str) -> PortResult<Self::Source> {
        self.inner.subscribe(group).await
    }
}

/// A user's HS256 JWT signed with `secret`, valid for ten minutes of wall time: what the login
/// service gives a client that talks to a served engine.
pub fn user_jwt(secret: &str, user: u64) -> String {
    user_jwt_for(secret, user, None)
}

/// The same, for the audience `aud` (what a served engine on real stores requires).
pub fn user_jwt_for(secret: &str, user: u64, aud: Option<&str>) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    seckill_api::identity::mint(
        secret.as_bytes(),
        seckill_core::domain::UserId(user),
        exp,
        None,
        aud,
    )
}

/// The admin token of [`embedded_server`].
pub const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// A server of the embedded stores on two loopback sockets (public, admin) as `seckill serve`
/// runs it, with [`ADMIN_TOKEN`], buyers' JWTs checked with `jwt_secret`, the per-IP limit out of
/// the way, and — with `sale: Some((id, stock, buckets))` — that activity open for an hour.
pub async fn embedded_server(
    jwt_secret: &str,
    seed: u64,
    sale: Option<(u64, u64, u32)>,
) -> seckill_api::serve::Running {
    let stores = seckill_core::adapters::embedded::EmbeddedBackend::new();
    let roles = seckill_core::roles::Roles::ALL;
    server_on(&stores, roles, jwt_secret, seed, sale).await
}

/// [`embedded_server`] on `stores` (which other servers may share) running `roles`.
pub async fn server_on(
    stores: &seckill_core::adapters::embedded::EmbeddedBackend,
    roles: seckill_core::roles::Roles,
    jwt_secret: &str,
    seed: u64,
    sale: Option<(u64, u64, u32)>,
) -> seckill_api::serve::Running {
    use rand::SeedableRng;
    use seckill_api::config::{JwtKeys, RateLimits, ServeConfig};
    use seckill_api::serve::{self, Secrets, Stores};
    use seckill_core::domain::{Activity, ActivityId, ActivitySpec};
    let cfg = ServeConfig {
        roles,
        admin_token: Some(ADMIN_TOKEN.into()),
        token_secret: Some("k".repeat(32).into()),
        jwt: Some(JwtKeys::Secret(jwt_secret.to_string().into())),
        rate: RateLimits {
            per_ip_per_sec: 1_000_000,
            ..ServeConfig::default().rate
        },
        ..ServeConfig::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let secrets = Secrets::resolve(&cfg, &mut rng);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let clock = seckill_core::clock::Clock::new(now, tokio::time::Instant::now());
    let stores = Stores {
        cache: stores.cache.clone(),
        bus: stores.bus.clone(),
        ledger: stores.ledger.clone(),
        nonces: seckill_api::nonce::EmbeddedNonces::default(),
        limiter: None,
    };
    let api = serve::api(&cfg, stores, &secrets, clock, &mut rng).unwrap();
    if let Some((id, stock, buckets)) = sale {
        let activity = Activity::new(ActivitySpec {
            id: ActivityId(id),
            total_stock: stock,
            buckets,
            fallback_pct: 10,
            per_user_limit: 1,
            start_ms: now - 1_000,
            end_ms: now + 3_600_000,
            pay_timeout_ms: 900_000,
            unit_price_minor: 0,
        })
        .unwrap();
        api.core.create(&activity).await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve::start(api, listener, admin, &mut rng).await.unwrap()
}
