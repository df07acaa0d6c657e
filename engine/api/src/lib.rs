//! The HTTP API (axum): the purchase funnel's front door, the order routes, admin, metrics and
//! health. Generic over the ports, so the same router runs on the embedded stores and on the real
//! ones; the simulation does not link it (it drives the services directly).
//!
//! Two listeners (DESIGN §12): the public one (buyers, the payment provider's callback) and the
//! admin one (operator routes, `/metrics`, `/readyz`; loopback by default).
//!
//! Order of checks on the purchase route, cheapest first: path and body decode (400), activity
//! known locally (404), the per-IP limit (429), the caller's JWT (401; a body `user_id` must be
//! the caller: 403), the local answer — window, state, sold-out flag — (memory), the per-user,
//! ramp and global limits (429), the token's signature, binding and expiry (memory), then the
//! token's nonce is claimed (Redis or memory) and only then does the request reach
//! `PurchaseService` (Redis, Kafka).
//! Every error is `{"error": {"code", "message", "field"}}`.

pub mod body;
pub mod config;
pub mod identity;
pub mod limits;
pub mod listener;
pub mod nonce;
mod openapi;
pub mod payment;
mod routes;
pub mod serve;
pub mod telemetry;
pub mod token;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use limits::Limits;
use metrics_exporter_prometheus::PrometheusHandle;
use rand::rngs::StdRng;
use seckill_core::clock::Clock;
use seckill_core::roles::ApiRole;
use std::sync::{Arc, Mutex};
use token::TokenSigner;

pub use routes::{admin_router, probe_readiness, router, ADMIN_ROUTES, ROUTES};

/// A JWKS file being watched: its path, how often it is read, and the text last loaded (a std
/// Mutex: only the reloader touches it, never across an await).
pub struct JwksFile {
    pub path: String,
    pub every: std::time::Duration,
    pub loaded: Mutex<String>,
}

/// What `/readyz` answers: the last probe's verdict (not ready until the first probe).
#[derive(Debug, Clone)]
pub struct Readiness {
    pub ok: bool,
    pub body: serde_json::Value,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            ok: false,
            body: serde_json::json!({ "starting": "not probed yet" }),
        }
    }
}

/// Everything a request may need. Shared behind an `Arc`; the only lock is the nonce RNG's
/// (a std Mutex held for one `next_u64`, never across an await).
pub struct Api<C, B, L, N> {
    /// The `api` role this server wraps: purchase service, refresher, admin operations.
    pub core: ApiRole<C, B, L>,
    /// The roles this process runs (readiness is per role).
    pub roles: seckill_core::roles::Roles,
    pub nonces: N,
    pub signer: TokenSigner,
    /// Who the caller is (a bearer JWT on every user route).
    pub identity: identity::Identity,
    /// The JWKS file the identity's keys came from, read again every so often.
    pub jwks_file: Option<JwksFile>,
    /// The payment provider's callback signatures; `None`: not configured (503).
    pub payments: Option<payment::CallbackVerifier>,
    pub limits: Limits,
    pub admin_token: String,
    pub clock: Clock,
    /// From peers in `trusted_proxies`, the client IP comes from this header (lowercase name).
    pub trusted_proxy_header: Option<String>,
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub token_rng: Mutex<StdRng>,
    pub metrics: Option<PrometheusHandle>,
    pub body_limit_bytes: usize,
    pub request_timeout: std::time::Duration,
    pub conn_limits: listener::ConnLimits,
    /// The readiness probe's last verdict.
    pub readiness: std::sync::RwLock<Readiness>,
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
    /// A 401's `WWW-Authenticate: Bearer` challenge: the RFC 6750 error (`invalid_token`), or
    /// `missing` for none (no credential was sent).
    pub challenge: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after_secs: None,
            challenge: None,
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

    /// A 503 whose cause is internal (a store's error, a host name): the answer says `public`;
    /// `detail` goes to the log at warn, with the request id the answer carries.
    pub fn internal(public: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        let request_id = routes::REQUEST_ID.try_with(|id| id.clone()).unwrap_or_default();
        tracing::warn!(request_id = %request_id, detail = %detail, "unavailable");
        ApiError::unavailable(public)
    }
}

// Serialized from structs (no JSON map per answer): refusals are the hot path of a sale. The doc
// comments are the OpenAPI document's descriptions.
/// Every answer that is not a success.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
struct ErrorAnswer<'a> {
    error: ErrorDetail<'a>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct ErrorDetail<'a> {
    /// Stable, for programs (`sold_out`, `invalid_input`, ...).
    code: &'a str,
    /// For people. Never internal detail (hosts, store errors): those are in the log, under the
    /// request id.
    message: &'a str,
    /// The input field the answer is about, if any.
    #[schema(required = true)]
    field: Option<&'a str>,
    /// The request's id (as in the `x-request-id` header): what to quote when asking about it.
    request_id: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = |request_id: &str| {
            let body = ErrorAnswer {
                error: ErrorDetail {
                    code: self.code,
                    message: &self.message,
                    field: self.field.as_deref(),
                    request_id,
                },
            };
            (self.status, axum::Json(body)).into_response()
        };
        let mut resp = routes::REQUEST_ID
            .try_with(|id| body(id))
            .unwrap_or_else(|_| body(""));
        if let Some(secs) = self.retry_after_secs {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs.max(1)));
        }
        match self.challenge {
            Some("missing") => {
                resp.headers_mut()
                    .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            }
            Some(error) => {
                if let Ok(v) = HeaderValue::from_str(&format!("Bearer error=\"{error}\"")) {
                    resp.headers_mut().insert("www-authenticate", v);
                }
            }
            None => {}
        }
        resp
    }
}
