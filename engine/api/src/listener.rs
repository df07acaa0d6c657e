//! One listener's connections, on hyper directly: `axum::serve` sets no hyper timer (so no
//! header-read timeout: a client trickling its header holds a connection forever) and has no
//! connection cap. Here: the header of every request — the first, and each next one on a
//! keep-alive connection, so an idle connection too — must arrive within `header_read_timeout`;
//! beyond `max_connections` a connection is accepted and closed at once (the others are not
//! stalled); on stop, in-flight requests get `shutdown_deadline` to finish, then every
//! connection is dropped. A request head is bounded in bytes and in header lines (hyper answers
//! 431 past either): hyper's default read buffer of ~400 KiB per connection, times the
//! connection cap, would let a few thousand slow clients hold gigabytes.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_deadline: Duration,
    /// The most a request's head (request line and headers) may take, in bytes: also the
    /// connection's read buffer.
    pub max_header_bytes: usize,
    /// The most header lines a request may have.
    pub max_headers: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_read_timeout: Duration::from_secs(5),
            max_connections: 10_000,
            shutdown_deadline: Duration::from_secs(10),
            // A bearer JWT with an RSA signature is about 1 KiB, a browser's headers a few: 16
            // KiB is room for both and for the cookies of a shop's domain.
            max_header_bytes: 16 * 1024,
            max_headers: 64,
        }
    }
}

/// Serve `app` on `listener` until `stopped` turns true.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait a little instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("seckill_http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = app
            .clone()
            .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            });
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_deadline) => {
            tracing::warn!("shutdown deadline reached: dropping the connections still open");
        }
    }
    Ok(())
}
