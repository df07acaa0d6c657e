//! `seckill load`: an HTTP load generator for running `seckill serve` API processes (on loopback,
//! or elsewhere with `--remote`; connection `i` goes to the `i`-th of them, round robin). Simulated
//! users click "buy" (each click: a token request, then the purchase with that token) over a
//! fixed number of keep-alive connections, optionally paced to a total rate, bounded in count
//! (the clicks) and in time (the duration). The result is the funnel — what the purchases were
//! answered — latency percentiles from an HDR histogram (of each click's last answer: the
//! purchase's, or the token request's that refused it), and throughput.
//!
//! `--target healthz` sends `GET /healthz` instead: the hello-world baseline the purchase route
//! is compared with (same server, same generator, same machine).

use crate::cli::client::Conn;
use anyhow::Context;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use seckill_core::domain::{BucketRouter, UserId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct LoadConfig {
    /// The servers (loopback): connection `i` goes to `addrs[i % addrs.len()]`.
    pub addrs: Vec<SocketAddr>,
    pub activity: u64,
    pub users: u64,
    pub connections: usize,
    /// Requests per second over all connections; 0: as fast as answers come.
    pub rate: u64,
    pub duration: Duration,
    pub skew: f64,
    pub clicks_per_user: u32,
    pub seed: u64,
    pub target: Target,
    /// The HS256 secret the server checks user JWTs with: each click mints its user's JWT.
    #[serde(skip)]
    pub jwt_secret: String,
    pub jwt_issuer: Option<String>,
    pub jwt_audience: Option<String>,
    /// Instead of minting: the login service's JWTs, by the user each names (the users are
    /// these, not `users` of them).
    #[serde(skip)]
    pub jwts: Option<Arc<BTreeMap<u64, String>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Token, then purchase, per click.
    Purchase,
    /// `GET /healthz` (the baseline).
    Healthz,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Purchases (or healthz requests) answered, by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Token requests refused (their status), which end a click without a purchase.
    pub tokens_refused: BTreeMap<u16, u64>,
    /// Requests that got no HTTP answer (connection errors).
    pub errors: u64,
    /// Every HTTP request sent (tokens included).
    pub requests: u64,
    pub elapsed_s: f64,
    pub requests_per_sec: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
    /// The clicks were all sent before the duration ran out.
    pub completed: bool,
}

/// The server of `http://HOST:PORT[/]`, resolved. Only a loopback one unless `remote`: loading a
/// server elsewhere (a staging cluster) must be asked for, never a slip of the URL.
pub fn parse_url(url: &str, remote: bool) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url:?}: not an http:// URL"))?;
    let host_port = rest.trim_end_matches('/');
    if host_port.contains('/')
        || host_port
            .rsplit_once(':')
            .is_none_or(|(_, p)| p.parse::<u16>().is_err())
    {
        return Err(format!("--url {url:?}: expected http://HOST:PORT"));
    }
    let addr = (host_port.to_socket_addrs().ok().and_then(|mut a| a.next()))
        .ok_or_else(|| format!("--url {url:?}: cannot resolve {host_port}"))?;
    if !remote && !addr.ip().is_loopback() {
        return Err(format!(
            "--url {url:?}: not a loopback address; pass --remote to load a server you run elsewhere"
        ));
    }
    Ok(addr)
}

/// The token of a token answer: `"token":"…"` read in place (tokens are base64url, never
/// escaped), else the JSON parsed properly.
fn token_of(body: &[u8]) -> Option<String> {
    const FIELD: &[u8] = b"\"token\":\"";
    let fast = body.windows(FIELD.len()).position(|w| w == FIELD).and_then(|i| {
        let rest = &body[i + FIELD.len()..];
        let end = rest.iter().position(|&c| c == b'"')?;
        let token = std::str::from_utf8(&rest[..end]).ok()?;
        (!token.contains('\\')).then(|| token.to_string())
    });
    fast.or_else(|| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_string))
    })
}

/// The clicks in arrival order: users (a `skew` share crowded onto the hot eighth of `buckets`),
/// each clicking 1..=K times, shuffled by the seed.
pub fn clicks(cfg: &LoadConfig, buckets: u32) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut out = Vec::new();
    if let Some(jwts) = &cfg.jwts {
        for &user in jwts.keys() {
            out.extend(std::iter::repeat_n(
                user,
                rng.gen_range(1..=cfg.clicks_per_user) as usize,
            ));
        }
        out.shuffle(&mut rng);
        return out;
    }
    let hot = (buckets / 8).max(1);
    let mut next = 1u64;
    for _ in 0..cfg.users {
        if buckets > 0 && rng.gen_bool(cfg.skew) {
            while BucketRouter::route(UserId(next), buckets).0 >= hot {
                next += 1;
            }
        }
        for _ in 0..rng.gen_range(1..=cfg.clicks_per_user) {
            out.push(next);
        }
        next += 1;
    }
    out.shuffle(&mut rng);
    out
}

/// Run the load; `on_answer` is called per answered click (progress).
pub async fn run(
    cfg: &LoadConfig,
    on_answer: impl Fn() + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    let buckets = if cfg.target == Target::Purchase {
        let first = *cfg.addrs.first().context("no server to load")?;
        let mut c = Conn::new(first);
        let status = c
            .request("GET", &format!("/api/v1/activities/{}", cfg.activity), "", "")
            .await
            .with_context(|| format!("--url: cannot reach {first}"))?;
        let body = c.body;
        if status != 200 {
            anyhow::bail!(format!(
                "--activity: the server answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        v["buckets"].as_u64().unwrap_or(1) as u32
    } else {
        0
    };
    let clicks = Arc::new(match cfg.target {
        Target::Purchase => clicks(cfg, buckets),
        // The baseline: as many requests as the purchase run would send purchases.
        Target::Healthz => vec![0; (cfg.users * cfg.clicks_per_user as u64) as usize],
    });
    let next = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let on_answer = Arc::new(on_answer);
    let started = tokio::time::Instant::now();
    let deadline = started + cfg.duration;
    // Pacing: each connection sends one click per `interval` (the rate split over connections).
    let interval = (cfg.rate > 0).then(|| Duration::from_secs_f64(cfg.connections as f64 / cfg.rate as f64));
    let workers: Vec<_> = (0..cfg.connections)
        .map(|i| {
            let (clicks, next, sent, on_answer, cfg) = (
                clicks.clone(),
                next.clone(),
                sent.clone(),
                on_answer.clone(),
                cfg.clone(),
            );
            tokio::spawn(async move {
                let mut conn = Conn::new(cfg.addrs[i % cfg.addrs.len()]);
                let token_path = format!("/api/v1/activities/{}/token", cfg.activity);
                let purchase_path = format!("/api/v1/activities/{}/purchase", cfg.activity);
                let mut out_body = String::with_capacity(256);
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
                let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
                let mut refused: BTreeMap<u16, u64> = BTreeMap::new();
                let mut errors = 0u64;
                let mut tick = interval.map(tokio::time::interval);
                loop {
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&user) = clicks.get(i) else { break };
                    if let Some(t) = tick.as_mut() {
                        t.tick().await;
                    }
                    let answer = match cfg.target {
                        Target::Healthz => {
                            sent.fetch_add(1, Ordering::Relaxed);
                            let t = tokio::time::Instant::now();
                            let r = conn.request("GET", "/healthz", "", "").await;
                            let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                            r.map(Some)
                        }
                        Target::Purchase => {
                            sent.fetch_add(1, Ordering::Relaxed);
                            use std::fmt::Write;
                            // The user's JWT: the login service's, or minted as it would have.
                            let minted;
                            let jwt = match &cfg.jwts {
                                Some(jwts) => &jwts[&user],
                                None => {
                                    let exp = crate::cli::tools::wall_now_ms() / 1_000 + 3_600;
                                    minted = seckill_api::identity::mint(
                                        cfg.jwt_secret.as_bytes(),
                                        seckill_core::domain::UserId(user),
                                        exp,
                                        cfg.jwt_issuer.as_deref(),
                                        cfg.jwt_audience.as_deref(),
                                    );
                                    &minted
                                }
                            };
                            let asked = tokio::time::Instant::now();
                            match conn.request("POST", &token_path, jwt, "").await {
                                Ok(200) => {
                                    let token = token_of(&conn.body).unwrap_or_default();
                                    sent.fetch_add(1, Ordering::Relaxed);
                                    out_body.clear();
                                    let _ = write!(out_body, "{{\"token\":\"{token}\"}}");
                                    let t = tokio::time::Instant::now();
                                    let r = conn.request("POST", &purchase_path, jwt, &out_body).await;
                                    let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                                    r.map(Some)
                                }
                                Ok(status) => {
                                    // The click's answer is the refusal: its latency counts.
                                    let _ = h.record(asked.elapsed().as_micros().max(1) as u64);
                                    *refused.entry(status).or_default() += 1;
                                    Ok(None)
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    match answer {
                        Ok(Some(status)) => *by_status.entry(status).or_default() += 1,
                        Ok(None) => {}
                        Err(_) => errors += 1,
                    }
                    on_answer();
                }
                (h, by_status, refused, errors)
            })
        })
        .collect();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut by_status, mut tokens_refused, mut errors) = (BTreeMap::new(), BTreeMap::new(), 0u64);
    for w in workers {
        let (h, s, r, e) = w.await?;
        let _ = latency.add(&h);
        for (k, v) in s {
            *by_status.entry(k).or_insert(0) += v;
        }
        for (k, v) in r {
            *tokens_refused.entry(k).or_insert(0) += v;
        }
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let requests = sent.load(Ordering::Relaxed);
    Ok(LoadReport {
        by_status,
        tokens_refused,
        errors,
        requests,
        elapsed_s: elapsed,
        requests_per_sec: requests as f64 / elapsed.max(1e-9),
        latency_us_p50: latency.value_at_quantile(0.5),
        latency_us_p99: latency.value_at_quantile(0.99),
        latency_us_p999: latency.value_at_quantile(0.999),
        latency_us_max: latency.max(),
        completed: next.load(Ordering::Relaxed) >= clicks.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_urls_are_accepted_without_remote() {
        assert_eq!(parse_url("http://127.0.0.1:8080", false).unwrap().port(), 8080);
        assert_eq!(parse_url("http://localhost:9000/", false).unwrap().port(), 9000);
        assert!(parse_url("http://[::1]:80", false).unwrap().ip().is_loopback());
        assert!(parse_url("https://127.0.0.1:1", false).is_err());
        assert!(parse_url("http://127.0.0.1", false)
            .unwrap_err()
            .contains("HOST:PORT"));
        assert!(parse_url("http://127.0.0.1:80/api", false)
            .unwrap_err()
            .contains("HOST:PORT"));
        assert!(parse_url("http://10.0.0.1:80", false)
            .unwrap_err()
            .contains("--remote"));
        assert_eq!(
            parse_url("http://10.0.0.1:80", true).unwrap().to_string(),
            "10.0.0.1:80"
        );
    }

    #[test]
    fn tokens_are_read_from_token_answers() {
        assert_eq!(
            token_of(br#"{"expires_at_ms":5,"token":"ab-_.cd"}"#).as_deref(),
            Some("ab-_.cd")
        );
        // An escaped token (not ours, but valid JSON) goes through the parser.
        assert_eq!(token_of(br#"{"token":"a\/b"}"#).as_deref(), Some("a/b"));
        assert_eq!(token_of(br#"{"error":{"code":"sold_out"}}"#), None);
    }

    #[test]
    fn clicks_are_seeded_and_skewed() {
        let cfg = LoadConfig {
            addrs: vec!["127.0.0.1:1".parse().unwrap()],
            activity: 1,
            users: 1_000,
            connections: 1,
            rate: 0,
            duration: Duration::from_secs(1),
            skew: 0.9,
            clicks_per_user: 2,
            seed: 5,
            target: Target::Purchase,
            jwt_secret: String::new(),
            jwt_issuer: None,
            jwt_audience: None,
            jwts: None,
        };
        let a = clicks(&cfg, 32);
        assert_eq!(a, clicks(&cfg, 32));
        let users: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(users.len(), 1_000);
        let hot = users
            .iter()
            .filter(|u| BucketRouter::route(UserId(***u), 32).0 < 4)
            .count();
        assert!(hot > 850, "{hot}");
    }
}
