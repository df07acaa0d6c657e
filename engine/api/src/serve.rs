//! Running the API: the router on a listener, plus — in the same process — the order consumer,
//! the self-healing jobs and the gauges. Shutdown is graceful: stop accepting, finish what is in
//! flight, then stop the consumer and the jobs (the caller flushes the producer after).

use super::config::ServeConfig;
use super::identity::Identity;
use super::limits::Limits;
use super::nonce::NonceStore;
use super::payment::CallbackVerifier;
use super::token::TokenSigner;
use super::{admin_router, router, Api, Shared};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use seckill_core::clock::Clock;
use seckill_core::jobs::{RebalanceConfig, ReconcileConfig, RecoveryConfig};
use seckill_core::ports::{Ledger, OrderBus, StockCache};
use seckill_core::roles::{self, JobsConfig};
use seckill_core::service::consumer::{DEFAULT_MAX_BATCH, ORDER_GROUP};
use seckill_core::service::PurchaseConfig;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How often the `api` role re-reads the registry and the metas: a pause, resume, close or a new
/// activity reaches every API process within two of these.
pub const REFRESH_EVERY: Duration = Duration::from_millis(200);
/// How often readiness is probed (what `/readyz` answers).
const READY_EVERY: Duration = Duration::from_secs(1);
/// How often the jobs run over every registered activity.
const JOBS_EVERY: Duration = Duration::from_secs(2);
/// How often the API role prunes its limiters' idle keys.
const PRUNE_EVERY: Duration = Duration::from_secs(2);
/// How often the recorder folds recorded histogram samples into its histograms. Until then it
/// keeps every sample (8 bytes each, three per purchase); `/metrics` folds them too, but a
/// server nobody scrapes would grow without bound — `install_recorder` leaves upkeep to us.
const METRICS_UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Recovery on the real stores: the publish window is the producer's delivery timeout (3 s)
/// with a margin.
pub fn recovery() -> RecoveryConfig {
    RecoveryConfig {
        quiesce: Duration::from_secs(4),
        drain_timeout: Duration::from_secs(30),
        group: ORDER_GROUP.to_string(),
        lease: Duration::from_secs(20),
    }
}

fn jobs_config() -> JobsConfig {
    JobsConfig {
        recovery: recovery(),
        reconcile: ReconcileConfig::default(),
        rebalance: RebalanceConfig::default(),
    }
}

/// Bucket bounds (seconds) of every latency histogram: from a Redis round trip to a request
/// timeout.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The process-wide Prometheus recorder (installed once; `None` if another recorder won).
/// Latencies are exported as Prometheus histograms, which add up across processes (a summary's
/// quantiles do not).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .ok()?
                .install_recorder()
                .ok()
        })
        .clone()
}

/// Every counter and gauge this process's roles export, registered at zero from start, so that
/// an alert or a dashboard query over one nothing touched yet answers 0 rather than "no data".
/// (Per-activity series start with the jobs' first pass over the activity.)
fn export_at_zero(roles: seckill_core::roles::Roles) {
    super::routes::export_at_zero();
    // Which build runs where (the revision when the build was given one: `SECKILL_REVISION`).
    let revision = option_env!("SECKILL_REVISION").unwrap_or("unknown");
    metrics::gauge!("seckill_build_info", "version" => env!("CARGO_PKG_VERSION"), "revision" => revision,
        "roles" => roles.to_string())
    .set(1.0);
    metrics::counter!("seckill_http_connections_refused_total").increment(0);
    metrics::counter!("seckill_refresh_errors_total").increment(0);
    metrics::counter!("seckill_jwks_reload_failures_total").increment(0);
    if roles.api {
        for scope in ["user", "global"] {
            metrics::counter!("seckill_shared_limit_errors_total", "scope" => scope).increment(0);
        }
    }
    if roles.worker {
        seckill_core::service::consumer::BatchReport::default().record();
        metrics::counter!("seckill_consumer_batch_failures_total").increment(0);
    }
    if roles.jobs {
        metrics::counter!("seckill_job_failures_total", "job_name" => "consumer_lag", "activity" => "all")
            .increment(0);
    }
}

/// The stores a server runs on.
pub struct Stores<C, B, L, N> {
    pub cache: C,
    pub bus: B,
    pub ledger: L,
    pub nonces: N,
    /// The rate limits every API process shares (real stores; one process needs none).
    pub limiter: Option<seckill_stores::redis::RedisRateLimiter>,
}

impl
    Stores<
        seckill_core::adapters::embedded::EmbeddedStockCache,
        seckill_core::adapters::embedded::EmbeddedBus,
        seckill_core::adapters::embedded::EmbeddedLedger,
        super::nonce::EmbeddedNonces,
    >
{
    /// Fresh in-memory stores (not durable).
    pub fn embedded() -> Self {
        let b = seckill_core::adapters::embedded::EmbeddedBackend::new();
        Stores {
            cache: b.cache,
            bus: b.bus,
            ledger: b.ledger,
            nonces: super::nonce::EmbeddedNonces::default(),
            limiter: None,
        }
    }
}

/// Secrets resolved for this process (generated when the configuration left them out).
pub struct Secrets {
    pub admin_token: String,
    pub token_secret: Vec<u8>,
    /// The JWT keys: configured, or a random HS256 secret that nobody else knows (a process
    /// that serves no user: `serve` on the embedded default uses `identity::dev_secret`).
    pub jwt: super::config::JwtKeys,
}

impl Secrets {
    pub fn resolve(cfg: &ServeConfig, rng: &mut impl RngCore) -> Secrets {
        let mut random = |n: usize| {
            let mut b = vec![0u8; n];
            rng.fill_bytes(&mut b);
            b
        };
        let admin_token = cfg
            .admin_token
            .as_deref()
            .map(str::to_string)
            .unwrap_or_else(|| random(16).iter().map(|b| format!("{b:02x}")).collect());
        let token_secret = cfg
            .token_secret
            .as_ref()
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_else(|| random(32));
        let jwt = cfg.jwt.clone().unwrap_or_else(|| {
            super::config::JwtKeys::Secret(
                random(32)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
                    .into(),
            )
        });
        Secrets {
            admin_token,
            token_secret,
            jwt,
        }
    }
}

/// Build the shared state (no task started).
pub fn api<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    cfg: &ServeConfig,
    stores: Stores<C, B, L, N>,
    secrets: &Secrets,
    clock: Clock,
    rng: &mut impl RngCore,
) -> Result<Shared<C, B, L, N>, String> {
    let signer = TokenSigner::new(&secrets.token_secret, cfg.token_ttl_ms)
        .map_err(|e| format!("token_secret: {e}"))?;
    let (iss, aud) = (cfg.jwt_issuer.clone(), cfg.jwt_audience.clone());
    let identity = match &secrets.jwt {
        super::config::JwtKeys::Secret(s) => {
            Identity::hs256(s.as_bytes(), iss, aud).map_err(|e| format!("jwt_secret: {e}"))?
        }
        super::config::JwtKeys::Jwks { path, text } => {
            Identity::jwks(text, iss, aud).map_err(|e| format!("jwt_jwks_file: {path}: {e}"))?
        }
    };
    Ok(Arc::new(Api {
        core: roles::api_role(
            stores.cache,
            stores.bus,
            stores.ledger,
            clock,
            PurchaseConfig {
                sold_out_recheck_ms: cfg.sold_out_recheck_ms,
            },
            recovery(),
            rng,
        ),
        roles: cfg.roles,
        nonces: stores.nonces,
        signer,
        identity,
        jwks_file: match &secrets.jwt {
            super::config::JwtKeys::Jwks { path, text } => Some(super::JwksFile {
                path: path.clone(),
                every: cfg.jwt_jwks_reload,
                loaded: Mutex::new(text.clone()),
            }),
            super::config::JwtKeys::Secret(_) => None,
        },
        payments: cfg.payment_secret.as_ref().map(|s| {
            CallbackVerifier::new(s.as_bytes())
                .with_previous(cfg.payment_secret_previous.as_deref().map(str::as_bytes))
        }),
        limits: Limits::new(&cfg.rate, stores.limiter),
        admin_token: secrets.admin_token.clone(),
        clock,
        trusted_proxy_header: cfg.trusted_proxy_header.clone(),
        trusted_proxies: cfg.trusted_proxies.clone(),
        token_rng: Mutex::new(
            StdRng::from_rng(&mut *rng).map_err(|e| format!("the token nonces' generator: {e}"))?,
        ),
        metrics: metrics_handle(),
        body_limit_bytes: cfg.body_limit_bytes,
        request_timeout: cfg.request_timeout,
        conn_limits: cfg.conn_limits,
        readiness: Default::default(),
    }))
}

/// Read the JWKS file again; load it if it changed. A file that cannot be read or does not load
/// leaves the keys in use (and is tried again next time), counted and logged: a rotation that
/// went wrong must not lock every buyer out. Read with std::fs: a small local file.
fn reload_jwks<C, B, L, N>(api: &Shared<C, B, L, N>) {
    let Some(file) = &api.jwks_file else { return };
    let text = match std::fs::read_to_string(&file.path) {
        Ok(t) => t,
        Err(e) => {
            metrics::counter!("seckill_jwks_reload_failures_total").increment(1);
            tracing::warn!(path = %file.path, error = %e, "the JWKS file cannot be read; the keys loaded before stay");
            return;
        }
    };
    let mut loaded = file.loaded.lock().unwrap_or_else(|p| p.into_inner());
    if *loaded == text {
        return;
    }
    match api.identity.reload_jwks(&text) {
        Ok(keys) => {
            tracing::info!(path = %file.path, keys, "JWKS reloaded");
            *loaded = text;
        }
        Err(e) => {
            metrics::counter!("seckill_jwks_reload_failures_total").increment(1);
            tracing::warn!(path = %file.path, error = %e, "the JWKS file does not load; the keys loaded before stay");
        }
    }
}

/// A running server: its address, and how to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    consumer_stop: Arc<AtomicBool>,
}

impl Running {
    /// Stop accepting, finish in-flight requests, then stop the consumer and the jobs.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(true);
        let mut served = Ok(());
        for s in self.servers {
            if let Err(e) = s.await.unwrap_or(Ok(())) {
                served = Err(e);
            }
        }
        self.consumer_stop.store(true, Ordering::Release);
        for t in self.background {
            let _ = t.await;
        }
        served
    }
}

/// Serve `api` on `listener` (public) and `admin` (operator routes, metrics, readiness) and
/// start the roles of `cfg.roles` beside them: the `api` role's refresher and limiter pruning,
/// the `worker`'s consumer, the `jobs`. Both listeners run whatever the roles (health,
/// readiness, metrics and the admin operations are everyone's).
pub async fn start<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: Shared<C, B, L, N>,
    listener: TcpListener,
    admin: TcpListener,
    rng: &mut impl RngCore,
) -> Result<Running, String> {
    let addr = listener.local_addr().map_err(|e| format!("listen: {e}"))?;
    let admin_addr = admin.local_addr().map_err(|e| format!("admin_listen: {e}"))?;
    export_at_zero(api.roles);
    if api.roles.api {
        // Load what is registered before the first request is taken, so a process that starts
        // during a sale serves it at once (no "unknown activity" while the refresher starts).
        let _ = api.core.refresh().await;
    }
    let (stop, _) = watch::channel(false);
    let mut servers = Vec::new();
    for (listener, app) in [
        (listener, router(api.clone())),
        (admin, admin_router(api.clone())),
    ] {
        servers.push(tokio::spawn(super::listener::serve(
            listener,
            app,
            api.conn_limits,
            stop.subscribe(),
        )));
    }
    let consumer_stop = Arc::new(AtomicBool::new(false));
    let mut background = Vec::new();
    // Every periodic task: `f` every `every` until the stop.
    let every = |every: Duration,
                 f: Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>| {
        let mut stopped = stop.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
                // Stopping mid-task is safe: every job is idempotent or fenced, as if the
                // process had crashed there.
                tokio::select! {
                    _ = f() => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        })
    };
    {
        let a = api.clone();
        background.push(every(
            READY_EVERY,
            Box::new(move || {
                let a = a.clone();
                Box::pin(async move { super::probe_readiness(&a).await })
            }),
        ));
    }
    if let Some(file) = &api.jwks_file {
        let a = api.clone();
        background.push(every(
            file.every,
            Box::new(move || {
                reload_jwks(&a);
                Box::pin(async {})
            }),
        ));
    }
    if let Some(handle) = api.metrics.clone() {
        background.push(every(
            METRICS_UPKEEP_EVERY,
            Box::new(move || {
                handle.run_upkeep();
                Box::pin(async {})
            }),
        ));
    }
    if api.roles.api {
        let a = api.clone();
        let mut stopped = stop.subscribe();
        background.push(tokio::spawn(async move {
            tokio::select! {
                _ = a.core.run_refresher(REFRESH_EVERY) => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        }));
        let a = api.clone();
        background.push(every(
            PRUNE_EVERY,
            Box::new(move || {
                a.limits.prune();
                Box::pin(async {})
            }),
        ));
    }
    if api.roles.worker {
        let core = &api.core;
        let mut consumer = roles::worker_role(
            core.cache.clone(),
            &core.bus,
            core.ledger.clone(),
            ORDER_GROUP,
            DEFAULT_MAX_BATCH,
        )
        .await
        .map_err(|e| format!("worker: {e}"))?;
        let flag = consumer_stop.clone();
        background.push(tokio::spawn(async move {
            consumer.run(&flag).await;
        }));
    }
    if api.roles.jobs {
        let core = &api.core;
        let jobs = Arc::new(roles::jobs_role(
            core.cache.clone(),
            core.bus.clone(),
            core.ledger.clone(),
            api.clock,
            jobs_config(),
            rng,
        ));
        background.push(every(
            JOBS_EVERY,
            Box::new(move || {
                let jobs = jobs.clone();
                Box::pin(async move {
                    match jobs.bus.lag(ORDER_GROUP).await {
                        Ok(lag) => metrics::gauge!("seckill_consumer_lag").set(lag as f64),
                        // The gauge goes stale while the bus is away: say so, and count it.
                        Err(e) => {
                            metrics::counter!("seckill_job_failures_total", "job_name" => "consumer_lag", "activity" => "all")
                                .increment(1);
                            tracing::warn!(job = "consumer_lag", error = %e, "job failed");
                        }
                    }
                    let _ = jobs.pass().await;
                    let _ = jobs.rebalance().await;
                })
            }),
        ));
    }
    // The first verdict now (the task above refreshes it every second).
    super::probe_readiness(&api).await;
    Ok(Running {
        addr,
        admin_addr,
        stop,
        servers,
        background,
        consumer_stop,
    })
}
