//! `seckill serve`: the settings (file, environment, flags) checked as one, the stores they name
//! connected, the roles composed over them and the listeners started; stops on SIGTERM.

use super::tools::{run_on, runtime_multi, wall_now_ms};
use anyhow::Context;
use seckill_stores::backend::{RealBackend, RealSettings};
use std::process::ExitCode;
use std::time::Duration;

/// With real stores, every secret must be one somebody chose (`config::placeholder`): the
/// example environment file and the documentation's values are refused by name, the stores' URL
/// passwords included.
fn refuse_placeholders(cfg: &seckill_api::config::ServeConfig, s: &RealSettings) -> anyhow::Result<()> {
    use seckill_api::config::{placeholder, JwtKeys};
    let url_password = |u: &str| {
        url::Url::parse(u)
            .ok()
            .and_then(|u| u.password().map(str::to_string))
    };
    let (db, redis) = (
        url_password(&s.mysql.url),
        s.redis.urls.iter().map(|u| url_password(u)).collect::<Vec<_>>(),
    );
    let jwt = match &cfg.jwt {
        Some(JwtKeys::Secret(secret)) => Some(&**secret),
        _ => None,
    };
    let mut secrets: Vec<(&str, Option<&str>)> = vec![
        ("admin_token (SECKILL_ADMIN_TOKEN)", cfg.admin_token.as_deref()),
        ("token_secret (SECKILL_TOKEN_SECRET)", cfg.token_secret.as_deref()),
        ("jwt_secret (SECKILL_JWT_SECRET)", jwt),
        (
            "payment_secret (SECKILL_PAYMENT_SECRET)",
            cfg.payment_secret.as_deref(),
        ),
        (
            "payment_secret_previous (SECKILL_PAYMENT_SECRET_PREVIOUS)",
            cfg.payment_secret_previous.as_deref(),
        ),
        ("DATABASE_URL's password", db.as_deref()),
    ];
    secrets.extend(redis.iter().map(|p| ("REDIS_URL's password", p.as_deref())));
    if let Some(sasl) = &s.kafka.security.sasl {
        secrets.push(("SECKILL_KAFKA_SASL_PASSWORD", Some(&*sasl.password)));
    }
    for (what, secret) in secrets {
        if let Some(why) = secret.and_then(placeholder) {
            anyhow::bail!(format!(
                "{what}: {why}: with real stores every secret must be one you chose (e.g. `openssl rand -hex 32`)"
            ));
        }
    }
    Ok(())
}

/// The real-store nemesis plants a named bug (`SECKILL_PLANTED`, comma-separated names of
/// `seckill_core::planted::Bug`) and arms the engine's fault points (`SECKILL_STALLS`:
/// `<seed>[:<site>,…]`, the seed of their draws and the long ones armed, by name) in a binary
/// built with the `planted` feature, which no release build enables: any other build refuses
/// either variable instead of running a bug it cannot plant. The error names the variable.
fn plant_from_env() -> Result<(), String> {
    use seckill_core::planted::{plant_process, stall_process, Bug, Site};
    const NOT_PLANTED: &str = "this binary was built without the `planted` feature: it plants nothing";
    /// The comma-separated names in `list`, each one of `all` by `name`; the error names the
    /// variable, what it is and every known name.
    fn named<T: Copy>(
        var: &str,
        what: &str,
        list: &str,
        all: &[T],
        name: fn(T) -> &'static str,
    ) -> Result<Vec<T>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| {
                all.iter().copied().find(|x| name(*x) == n).ok_or_else(|| {
                    let known: Vec<&str> = all.iter().map(|x| name(*x)).collect();
                    format!("{var}: no {what} named '{n}' (known: {})", known.join(", "))
                })
            })
            .collect()
    }
    if let Ok(value) = std::env::var("SECKILL_STALLS") {
        let (seed, sites) = value.split_once(':').unwrap_or((&value, ""));
        let seed: u64 = seed.trim().parse().map_err(|_| {
            format!("SECKILL_STALLS: expected <seed>[:<site>,...] with an integer seed, got '{value}'")
        })?;
        let long = named("SECKILL_STALLS", "fault point", sites, &Site::ALL, Site::name)?
            .into_iter()
            .fold(0, |mask, site| mask | site.bit());
        if !stall_process(seed, long) {
            return Err(format!("SECKILL_STALLS: {NOT_PLANTED}"));
        }
        eprintln!("warning: the engine's fault points are armed (seed {seed}, long: '{sites}'): this process stalls on purpose");
    }
    let names = std::env::var("SECKILL_PLANTED").unwrap_or_default();
    for bug in named("SECKILL_PLANTED", "planted bug", &names, &Bug::ALL, Bug::name)? {
        if !plant_process(bug) {
            return Err(format!("SECKILL_PLANTED: {NOT_PLANTED}"));
        }
        eprintln!(
            "warning: planted bug '{}' is on: this process is broken on purpose",
            bug.name()
        );
    }
    Ok(())
}

/// `seckill serve`: settings, stores, then the API until SIGTERM or Ctrl-C.
pub fn serve(
    config: Option<std::path::PathBuf>,
    listen: Option<std::net::SocketAddr>,
    admin_listen: Option<std::net::SocketAddr>,
    roles: Option<seckill_core::roles::Roles>,
    check_config: bool,
) -> ExitCode {
    use rand::SeedableRng;
    use seckill_api::config::ServeConfig;
    use seckill_api::nonce::RedisNonces;
    use seckill_api::serve::{self, Secrets, Stores};
    use seckill_core::clock::Clock;
    use seckill_stores::redis::RedisRateLimiter;

    if let Err(e) = plant_from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let text = match &config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: --config: cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let flags = seckill_api::config::Flags {
        listen,
        admin_listen,
        roles,
    };
    let env = match seckill_stores::backend::lookup() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = match ServeConfig::load(text.as_deref(), &env, &flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // JSON log lines (SECKILL_LOG), and traces when an OTLP endpoint is configured: the engine's
    // spans (debug level) go to the traces only.
    let telemetry = {
        use tracing::Level;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::Layer;
        let logs = tracing_subscriber::fmt::layer().json().with_filter(
            tracing_subscriber::EnvFilter::try_from_env("SECKILL_LOG").unwrap_or_else(|_| "info".into()),
        );
        let (traces, telemetry) = match seckill_api::telemetry::layer(&env, &cfg.roles.to_string()) {
            Ok(Some((layer, t))) => {
                let ours = ["seckill", "seckill_core", "seckill_api", "seckill_stores"];
                let targets = (ours.iter()).fold(tracing_subscriber::filter::Targets::new(), |t, c| {
                    t.with_target(*c, Level::DEBUG)
                });
                (
                    Some(layer.with_filter(targets.with_default(Level::WARN))),
                    Some(t),
                )
            }
            Ok(None) => (None, None),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let _ = tracing_subscriber::registry().with(logs).with(traces).try_init();
        telemetry
    };
    let runtime = match runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = run_on(runtime, async move {
        let settings = RealSettings::from_lookup(|k| env(k).filter(|v| !v.trim().is_empty()))?;
        let mut rng = rand::rngs::StdRng::from_entropy();
        // What is allowed but said loudly: printed by --check-config, logged at warn at start.
        let mut warnings = Vec::new();
        if settings.is_some() {
            // Many processes share one sale: each must verify what another issued, and no
            // process may invent its own keys.
            for (missing, what) in [
                (cfg.token_secret.is_none(), "token_secret (SECKILL_TOKEN_SECRET)"),
                (cfg.admin_token.is_none(), "admin_token (SECKILL_ADMIN_TOKEN)"),
                (
                    cfg.jwt.is_none(),
                    "jwt_secret or jwt_jwks_file (SECKILL_JWT_SECRET / SECKILL_JWT_JWKS_FILE)",
                ),
                // Without it, a JWT the login service issued for another of the shop's services
                // (signed with the same key) buys here as its user.
                (
                    cfg.jwt_audience.is_none(),
                    "jwt_audience (SECKILL_JWT_AUDIENCE), the `aud` the login service puts in this engine's JWTs",
                ),
            ] {
                if missing {
                    anyhow::bail!(format!("{what}: required with real stores"));
                }
            }
            if let Some(s) = &settings {
                refuse_placeholders(&cfg, s)?;
                if let Some(why) = seckill_stores::backend::ledger_tls_unverified(&s.mysql.url) {
                    let var = seckill_stores::backend::ALLOW_UNVERIFIED_LEDGER;
                    match env(var).as_deref().map(str::trim) {
                        Some("1") => warnings.push(format!(
                            "DATABASE_URL: {why}; accepted because {var}=1: whoever is on the path to \
                             the ledger can read and rewrite it"
                        )),
                        None | Some("0") => {
                            anyhow::bail!(format!(
                                "DATABASE_URL: {why}: anyone on the path could read and rewrite the ledger \
                                 (an order set to paid). Add ssl-mode=verify_identity (and ssl-ca=<the CA's \
                                 PEM file> unless the system's roots sign the server's certificate), or set \
                                 {var}=1 to accept an unverified connection (logged at every start)"
                            ))
                        }
                        Some(other) => anyhow::bail!(format!("{var}: must be 1 or 0, got {other:?}")),
                    }
                }
            }
            let delivery = settings
                .as_ref()
                .map_or(Duration::ZERO, |s| s.kafka.message_timeout);
            if cfg.request_timeout <= delivery {
                anyhow::bail!(format!(
                    "request_timeout_ms: {} ms is not longer than the order bus's delivery timeout ({} ms): \
                     a slow bus would answer \"outcome unknown\" instead of \"queued\"",
                    cfg.request_timeout.as_millis(),
                    delivery.as_millis()
                ));
            }
        }
        warnings.extend(cfg.warnings());
        for warning in warnings {
            if check_config {
                println!("warning: {warning}");
            } else {
                tracing::warn!("{warning}");
            }
        }
        if check_config {
            println!(
                "configuration ok: roles {}, listen {}, admin listen {}, stores {}",
                cfg.roles,
                cfg.listen,
                cfg.admin_listen,
                match &settings {
                    Some(s) => format!(
                        "real (redis: {} node(s){}{}, kafka {} ({}) topic {} x{} partitions, replication {}, mysql{})",
                        s.redis.urls.len(),
                        if s.redis.cluster { ", cluster" } else { "" },
                        if s.redis.tls.is_some() { ", tls" } else { "" },
                        s.kafka.brokers,
                        s.kafka.security.protocol(),
                        s.kafka.topic,
                        s.kafka.partitions,
                        s.kafka.replication,
                        if s.mysql.url.contains("ssl-mode=") { " (ssl-mode in its URL)" } else { "" }
                    ),
                    None => "embedded (not durable)".to_string(),
                }
            );
            return Ok(ExitCode::SUCCESS);
        }
        if settings.is_none() && cfg.jwt.is_none() {
            let path = seckill_api::identity::dev_secret_path();
            let secret = seckill_api::identity::dev_secret(&mut rng).map_err(anyhow::Error::msg)?;
            eprintln!(
                "no jwt_secret: user JWTs are checked with the development key in {} \
                 (mint one with `seckill jwt --user N`; never in production)",
                path.display()
            );
            cfg.jwt = Some(seckill_api::config::JwtKeys::Secret(secret.into()));
        }
        let secrets = Secrets::resolve(&cfg, &mut rng);
        if cfg.admin_token.is_none() {
            eprintln!("admin token for this process: {}", secrets.admin_token);
        }
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("listen {}", cfg.listen))?;
        let admin = tokio::net::TcpListener::bind(cfg.admin_listen)
            .await
            .with_context(|| format!("admin_listen {}", cfg.admin_listen))?;
        let clock = Clock::new(wall_now_ms(), tokio::time::Instant::now());
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            Ok::<(), anyhow::Error>(())
        };
        match settings {
            None => {
                tracing::warn!("no store settings: serving on the embedded stores (in memory, not durable)");
                let stores = Stores::embedded();
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng).map_err(anyhow::Error::msg)?;
                let running = serve::start(api, listener, admin, &mut rng)
                    .await
                    .map_err(anyhow::Error::msg)?;
                tracing::info!(addr = %running.addr, admin = %running.admin_addr, "listening");
                shutdown.await?;
                running.shutdown().await?;
            }
            Some(s) => {
                let real = RealBackend::connect(&s).await?;
                let nonces = RedisNonces::new(real.cache.conn().clone());
                let limiter = RedisRateLimiter::new(real.cache.conn().clone());
                let bus = real.bus.clone();
                let stores = Stores {
                    cache: real.cache,
                    bus: real.bus,
                    ledger: real.ledger,
                    nonces,
                    limiter: Some(limiter),
                };
                let pool = stores.ledger.pool().clone();
                let api = serve::api(&cfg, stores, &secrets, clock, &mut rng).map_err(anyhow::Error::msg)?;
                let running = serve::start(api, listener, admin, &mut rng)
                    .await
                    .map_err(anyhow::Error::msg)?;
                tracing::info!(addr = %running.addr, admin = %running.admin_addr, roles = %cfg.roles, "listening on the real stores");
                let gauges = tokio::spawn(async move {
                    loop {
                        metrics::gauge!("seckill_ledger_pool_connections").set(pool.size() as f64);
                        metrics::gauge!("seckill_ledger_pool_idle").set(pool.num_idle() as f64);
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                });
                shutdown.await?;
                running.shutdown().await?;
                gauges.abort();
                bus.flush().await?;
            }
        }
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    });
    if let Some(t) = telemetry {
        t.shutdown();
    }
    code
}
