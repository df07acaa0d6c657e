//! Running the API: the router on a listener, plus — in the same process — the order consumer,
//! the self-healing jobs and the gauges. Shutdown is graceful: stop accepting, finish what is in
//! flight, then stop the consumer and the jobs (the caller flushes the producer after).

use super::config::ServeConfig;
use super::limits::Limits;
use super::nonce::NonceStore;
use super::token::TokenSigner;
use super::{router, Api, Shared};
use crate::clock::Clock;
use crate::jobs::{self, RebalanceConfig, ReconcileConfig, RecoveryConfig};
use crate::ports::{Ledger, OrderBus, StockCache};
use crate::service::consumer::{DEFAULT_MAX_BATCH, ORDER_GROUP};
use crate::service::{OrderConsumer, PurchaseConfig, PurchaseService};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How often the engine re-reads activity states (pause / resume / recovery reach it this fast).
const REFRESH_EVERY: Duration = Duration::from_millis(200);
/// How often the jobs run over every activity open here.
const JOBS_EVERY: Duration = Duration::from_secs(2);
/// How often the recorder folds recorded histogram samples into its summaries. Until then it
/// keeps every sample (8 bytes each, three per purchase); `/metrics` folds them too, but a
/// server nobody scrapes would grow without bound — `install_recorder` leaves upkeep to us.
const METRICS_UPKEEP_EVERY: Duration = Duration::from_secs(5);

fn recovery() -> RecoveryConfig {
    RecoveryConfig {
        // Engines refresh every REFRESH_EVERY; a publish gives up after the producer's timeout.
        quiesce: Duration::from_secs(4),
        drain_timeout: Duration::from_secs(30),
        group: ORDER_GROUP.to_string(),
    }
}

/// The process-wide Prometheus recorder (installed once; `None` if another recorder won).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}

/// The four stores a server runs on.
pub struct Stores<C, B, L, N> {
    pub cache: C,
    pub bus: B,
    pub ledger: L,
    pub nonces: N,
}

impl
    Stores<
        crate::adapters::embedded::EmbeddedStockCache,
        crate::adapters::embedded::EmbeddedBus,
        crate::adapters::embedded::EmbeddedLedger,
        super::nonce::EmbeddedNonces,
    >
{
    /// Fresh in-memory stores (not durable).
    pub fn embedded() -> Self {
        let b = crate::adapters::embedded::EmbeddedBackend::new();
        Stores {
            cache: b.cache,
            bus: b.bus,
            ledger: b.ledger,
            nonces: super::nonce::EmbeddedNonces::default(),
        }
    }
}

/// Secrets resolved for this process (generated when the configuration left them out).
pub struct Secrets {
    pub admin_token: String,
    pub token_secret: Vec<u8>,
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
            .clone()
            .unwrap_or_else(|| random(16).iter().map(|b| format!("{b:02x}")).collect());
        let token_secret = cfg
            .token_secret
            .as_ref()
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_else(|| random(32));
        Secrets {
            admin_token,
            token_secret,
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
    let mut service_rng = StdRng::seed_from_u64(rng.next_u64());
    Ok(Arc::new(Api {
        service: PurchaseService::new(
            stores.cache.clone(),
            stores.bus.clone(),
            clock,
            PurchaseConfig::default(),
            &mut service_rng,
        ),
        cache: stores.cache,
        bus: stores.bus,
        ledger: stores.ledger,
        nonces: stores.nonces,
        signer,
        limits: Limits::new(&cfg.rate),
        admin_token: secrets.admin_token.clone(),
        clock,
        trusted_proxy_header: cfg.trusted_proxy_header.clone(),
        token_rng: Mutex::new(StdRng::seed_from_u64(rng.next_u64())),
        metrics: metrics_handle(),
        body_limit_bytes: cfg.body_limit_bytes,
        request_timeout: cfg.request_timeout,
    }))
}

/// A running server: its address, and how to stop it.
pub struct Running {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    consumer_stop: Arc<AtomicBool>,
}

impl Running {
    /// Stop accepting, finish in-flight requests, then stop the consumer and the jobs.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(true);
        let served = self.server.await.unwrap_or(Ok(()));
        self.consumer_stop.store(true, Ordering::Release);
        for t in self.background {
            let _ = t.await;
        }
        served
    }
}

/// Serve `api` on `listener`, with the consumer and the jobs when `run_consumer`.
pub async fn start<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: Shared<C, B, L, N>,
    listener: TcpListener,
    run_consumer: bool,
) -> Result<Running, String> {
    let addr = listener.local_addr().map_err(|e| format!("listen: {e}"))?;
    let (stop, mut stopped) = watch::channel(false);
    let app = router(api.clone()).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    let consumer_stop = Arc::new(AtomicBool::new(false));
    let mut background = Vec::new();
    if let Some(handle) = api.metrics.clone() {
        let mut stopped = stop.subscribe();
        background.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(METRICS_UPKEEP_EVERY) => handle.run_upkeep(),
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        }));
    }
    if run_consumer {
        let source = api
            .bus
            .subscribe(ORDER_GROUP)
            .await
            .map_err(|e| format!("consumer: {e}"))?;
        let mut consumer =
            OrderConsumer::new(api.ledger.clone(), api.cache.clone(), source, DEFAULT_MAX_BATCH);
        let flag = consumer_stop.clone();
        background.push(tokio::spawn(async move {
            consumer.run(&flag).await;
        }));
        background.push(tokio::spawn(run_jobs(api.clone(), consumer_stop.clone())));
    }
    Ok(Running {
        addr,
        stop,
        server,
        background,
        consumer_stop,
    })
}

/// State refresh, then every `JOBS_EVERY`: recovery, reconciliation, payment timeouts,
/// rebalancing, gauges. A failed job is retried next round.
async fn run_jobs<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: Shared<C, B, L, N>,
    stop: Arc<AtomicBool>,
) {
    let mut since_jobs = Duration::ZERO;
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(REFRESH_EVERY).await;
        api.service.refresh_states().await;
        since_jobs += REFRESH_EVERY;
        if since_jobs < JOBS_EVERY {
            continue;
        }
        since_jobs = Duration::ZERO;
        api.limits.prune();
        if let Ok(lag) = api.bus.lag(ORDER_GROUP).await {
            metrics::gauge!("seckill_consumer_lag").set(lag as f64);
        }
        for a in api.service.activities() {
            let Some(plan) = api.service.plan(a) else { continue };
            let now = api.clock.now_ms();
            let _ = jobs::recover_if_needed(&api.cache, &api.ledger, &api.bus, &plan, &recovery()).await;
            if let Ok(r) = jobs::reconcile(
                &api.cache,
                &api.ledger,
                &api.bus,
                &plan,
                now,
                &ReconcileConfig::default(),
            )
            .await
            {
                metrics::gauge!("seckill_reconcile_differences", "activity" => a.to_string())
                    .set(r.differences.len() as f64);
                metrics::gauge!("seckill_open_reservations", "activity" => a.to_string()).set(r.open as f64);
            }
            let _ = jobs::cancel_unpaid(&api.cache, &api.ledger, &plan, now).await;
            let _ = jobs::rebalance(&api.cache, &api.ledger, &plan, now, &RebalanceConfig::default()).await;
        }
    }
}
