//! The HTTP API (axum): the purchase funnel's front door, the order routes, admin, metrics and
//! health. Generic over the ports, so the same router runs on the embedded stores and on the real
//! ones; never built under `cfg(madsim)` (the simulation drives the services directly).
//!
//! Order of checks on the purchase route, cheapest first: path and body decode (400), activity
//! known locally (404), the global rate limit (429), the local answer — window, state, sold-out
//! flag — (memory), the per-IP and per-user limits (429), the token's signature, binding and
//! expiry (memory), then the token's nonce is claimed (Redis or memory) and only then does the
//! request reach `PurchaseService` (Redis, Kafka).
//! Every error is `{"error": {"code", "message", "field"}}`.

pub mod body;
pub mod config;
pub mod limits;
pub mod nonce;
mod routes;
pub mod serve;
pub mod token;

use crate::clock::Clock;
use crate::roles::ApiRole;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use limits::Limits;
use metrics_exporter_prometheus::PrometheusHandle;
use rand::rngs::StdRng;
use std::sync::{Arc, Mutex};
use token::TokenSigner;

pub use routes::{router, ROUTES};

/// Everything a request may need. Shared behind an `Arc`; the only lock is the nonce RNG's
/// (a std Mutex held for one `next_u64`, never across an await).
pub struct Api<C, B, L, N> {
    /// The `api` role this server wraps: purchase service, refresher, admin operations.
    pub core: ApiRole<C, B, L>,
    /// The roles this process runs (readiness is per role).
    pub roles: crate::roles::Roles,
    pub nonces: N,
    pub signer: TokenSigner,
    pub limits: Limits,
    pub admin_token: String,
    pub clock: Clock,
    /// Client IPs come from this header (lowercase name) instead of the socket.
    pub trusted_proxy_header: Option<String>,
    pub token_rng: Mutex<StdRng>,
    pub metrics: Option<PrometheusHandle>,
    pub body_limit_bytes: usize,
    pub request_timeout: std::time::Duration,
}

pub type Shared<C, B, L, N> = Arc<Api<C, B, L, N>>;

/// An error answer: status, stable code, human message, and the input field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after_secs: None,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn bad_input(e: body::FieldError) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", e.message).field(e.field)
    }

    pub fn unavailable(reason: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", reason)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Serialized from structs (no JSON map per answer): refusals are the hot path of a sale.
        #[derive(serde::Serialize)]
        struct Body<'a> {
            error: Inner<'a>,
        }
        #[derive(serde::Serialize)]
        struct Inner<'a> {
            code: &'a str,
            message: &'a str,
            field: Option<&'a str>,
        }
        let body = Body {
            error: Inner {
                code: self.code,
                message: &self.message,
                field: self.field.as_deref(),
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs.max(1)));
        }
        resp
    }
}
