//! The routes and their handlers. Each handler decodes and checks its input first (nothing
//! touches a store before the input is known good) and maps every outcome to one status and code.

use super::body::{self, path_id};
use super::nonce::NonceStore;
use super::{ApiError, Shared};
use axum::body::Bytes;
use axum::extract::{
    ConnectInfo, FromRequest, FromRequestParts, MatchedPath, Path, RawQuery, Request, State,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::RngCore;
use seckill_core::domain::{
    Activity, ActivityId, ActivityState, BucketNo, Reservation, ReservationId, StockPlan, UserId,
};
use seckill_core::jobs::{self, ReconcileConfig};
use seckill_core::ports::{
    CancelOutcome, DeadLetter, GateWrite, Ledger, OrderBus, PayOutcome, ReleaseKind, StockCache,
};
use seckill_core::service::admin::{self, AdminError, Replayed, Warmed};
use seckill_core::service::consumer::ORDER_GROUP;
use seckill_core::service::{audit, order_status, reservation_status, PurchaseError, PurchaseOutcome};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

/// Every route of the public listener (method, path) — the OpenAPI document must describe
/// exactly these and `ADMIN_ROUTES`.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/api/v1/activities/{id}/token"),
    ("post", "/api/v1/activities/{id}/purchase"),
    ("get", "/api/v1/activities/{id}"),
    ("get", "/api/v1/activities/{id}/orders/{user}"),
    ("get", "/api/v1/activities/{id}/reservations/{reservation}"),
    ("post", "/api/v1/orders/{reservation}/cancel"),
    ("post", "/api/v1/payments/callback"),
    ("get", "/api/v1/openapi.json"),
    ("get", "/healthz"),
];

/// Every route of the admin listener (DESIGN §12: never on the public port).
pub const ADMIN_ROUTES: &[(&str, &str)] = &[
    ("post", "/api/v1/admin/activities"),
    ("get", "/api/v1/admin/activities"),
    ("get", "/api/v1/admin/activities/{id}"),
    ("post", "/api/v1/admin/activities/{id}/warmup"),
    ("post", "/api/v1/admin/activities/{id}/pause"),
    ("post", "/api/v1/admin/activities/{id}/resume"),
    ("post", "/api/v1/admin/activities/{id}/close"),
    ("post", "/api/v1/admin/activities/{id}/reconcile"),
    ("get", "/api/v1/admin/activities/{id}/audit"),
    ("get", "/api/v1/admin/activities/{id}/orders/{user}"),
    ("post", "/api/v1/admin/orders/{reservation}/cancel"),
    ("get", "/api/v1/admin/dead-letters"),
    ("get", "/api/v1/admin/dead-letters/{partition}/{offset}"),
    ("post", "/api/v1/admin/dead-letters/replay"),
    ("post", "/api/v1/admin/dead-letters/purge"),
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/readyz"),
];

/// Metric label of a matched route (both tables, bounded cardinality).
fn route_index(path: &str) -> Option<usize> {
    ROUTES.iter().chain(ADMIN_ROUTES).position(|(_, r)| *r == path)
}

fn route_name(i: usize) -> &'static str {
    ROUTES
        .iter()
        .chain(ADMIN_ROUTES)
        .nth(i)
        .map_or("unmatched", |r| r.1)
}

/// The public listener: the buyer's routes and the payment provider's callback.
pub fn router<C, B, L, N>(api: Shared<C, B, L, N>) -> Router
where
    C: StockCache,
    B: OrderBus,
    L: Ledger,
    N: NonceStore,
{
    let r = Router::new()
        .route("/api/v1/activities/{id}/token", post(issue_token::<C, B, L, N>))
        .route("/api/v1/activities/{id}/purchase", post(purchase::<C, B, L, N>))
        .route("/api/v1/activities/{id}", get(activity_view::<C, B, L, N>))
        .route(
            "/api/v1/activities/{id}/orders/{user}",
            get(order_view::<C, B, L, N>),
        )
        .route(
            "/api/v1/activities/{id}/reservations/{reservation}",
            get(reservation_view::<C, B, L, N>),
        )
        .route("/api/v1/orders/{reservation}/cancel", post(cancel::<C, B, L, N>))
        .route("/api/v1/payments/callback", post(payment_callback::<C, B, L, N>))
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([("content-type", "application/json")], super::openapi::document()) }),
        )
        .route("/healthz", get(|| async { "ok" }));
    finish(r, api)
}

/// The admin listener: operator routes, metrics, readiness (loopback or the pod network only).
pub fn admin_router<C, B, L, N>(api: Shared<C, B, L, N>) -> Router
where
    C: StockCache,
    B: OrderBus,
    L: Ledger,
    N: NonceStore,
{
    // Pause, resume and close differ only in the state they set.
    let to_state = |state: ActivityState| {
        post(
            move |State(api): State<Shared<C, B, L, N>>, headers: HeaderMap, Path(id): Path<String>| {
                set_state(api, headers, id, state)
            },
        )
    };
    let r = Router::new()
        .route(
            "/api/v1/admin/activities",
            post(admin_create::<C, B, L, N>).get(admin_list::<C, B, L, N>),
        )
        .route("/api/v1/admin/activities/{id}", get(admin_show::<C, B, L, N>))
        .route(
            "/api/v1/admin/activities/{id}/warmup",
            post(admin_warmup::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/activities/{id}/pause",
            to_state(ActivityState::Paused),
        )
        .route(
            "/api/v1/admin/activities/{id}/resume",
            to_state(ActivityState::Open),
        )
        .route(
            "/api/v1/admin/activities/{id}/close",
            to_state(ActivityState::Closed),
        )
        .route(
            "/api/v1/admin/activities/{id}/reconcile",
            post(admin_reconcile::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/activities/{id}/audit",
            get(admin_audit::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/activities/{id}/orders/{user}",
            get(admin_order_view::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/orders/{reservation}/cancel",
            post(admin_cancel::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/dead-letters",
            get(admin_dead_letters::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/dead-letters/{partition}/{offset}",
            get(admin_dead_letter::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/dead-letters/replay",
            post(admin_replay::<C, B, L, N>),
        )
        .route(
            "/api/v1/admin/dead-letters/purge",
            post(admin_purge::<C, B, L, N>),
        )
        // Every operator call is audited; the probes and the scrapes below are not.
        .route_layer(axum::middleware::from_fn(audit_admin_call))
        .route("/metrics", get(metrics_text::<C, B, L, N>))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready::<C, B, L, N>));
    finish(r, api)
}

/// The audit line of an operator call, at info whatever the answer (who, from where, what, and
/// how it was answered), and `seckill_admin_calls_total` by outcome: a refused token counts as
/// `refused`, and a burst of those alerts (`SeckillAdminRefused`).
async fn audit_admin_call(req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| route_index(p.as_str()))
        .map_or("unmatched", route_name);
    let method = req.method().clone();
    let resp = next.run(req).await;
    let status = resp.status();
    let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    metrics::counter!("seckill_admin_calls_total", "outcome" => if refused { "refused" } else { "allowed" })
        .increment(1);
    let request_id = REQUEST_ID.try_with(Clone::clone).unwrap_or_default();
    tracing::info!(
        target: "seckill::audit",
        request_id = %request_id,
        peer = ?peer,
        %method,
        route,
        status = status.as_u16(),
        refused,
        "admin call"
    );
    resp
}

/// What both listeners share: JSON fallbacks, the time bound inside the observation (a request
/// that timed out is still logged and counted, with its request id), a caught panic answered
/// as JSON, the body limit.
fn finish<C, B, L, N>(r: Router<Shared<C, B, L, N>>, api: Shared<C, B, L, N>) -> Router
where
    C: StockCache,
    B: OrderBus,
    L: Ledger,
    N: NonceStore,
{
    let timeout = api.request_timeout;
    let limit = api.body_limit_bytes;
    r.fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed here",
            )
        })
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            within(timeout, req, next)
        }))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request failed inside the engine",
            )
            .into_response()
        }))
        .layer(axum::middleware::from_fn(observe))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(api)
}

/// Bound every request's time. Past it the client gets a 503 and the work is dropped at its
/// next await — a purchase may then have reserved a unit (the reconciler carries it through), so
/// the answer says the outcome is unknown and where to look.
async fn within(timeout: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            format!("no answer within {timeout:?}; a purchase's outcome is unknown: see its order status"),
        )
        .into_response(),
    }
}

tokio::task_local! {
    /// The request id of the request this task serves (`observe` sets it): every error body
    /// carries it, and the log line with the details of an internal error.
    pub(super) static REQUEST_ID: String;
}

/// Per request: a request id (the client's `x-request-id` if it sent a sane one, else a process
/// counter), echoed in the response and carried by the log lines; a counter by route and status;
/// a log line — debug for answers, warn for 5xx.
async fn observe(req: Request, next: Next) -> Response {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    // Labels from the static route table: bounded cardinality.
    let route_index = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| route_index(p.as_str()));
    let route: &'static str = route_index.map_or("unmatched", route_name);
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|c| c.is_ascii_graphic()))
        .map_or_else(
            || format!("r{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            str::to_string,
        );
    let method = req.method().clone();
    let span = super::telemetry::request_span(req.headers(), &request_id, route);
    let served = REQUEST_ID.scope(request_id.clone(), next.run(req));
    let mut resp = tracing::Instrument::instrument(served, span.clone()).await;
    // The request's log line inside its span: with traces on, it carries the trace id.
    let _in_span = span.enter();
    let status = resp.status();
    let status_index = STATUSES
        .iter()
        .position(|s| *s == status.as_u16())
        .unwrap_or(STATUSES.len());
    requests_counter(route_index.unwrap_or(ROUTE_COUNT), status_index).increment(1);
    if status.is_server_error() {
        tracing::warn!(request_id = %request_id, %method, route = %route, status = status.as_u16(), "request failed");
    } else {
        tracing::debug!(request_id = %request_id, %method, route = %route, status = status.as_u16(), "request");
    }
    if let Ok(v) = axum::http::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The statuses the API answers, as metric labels ("other" past the end).
const STATUSES: [u16; 15] = [
    200, 201, 202, 400, 401, 403, 404, 409, 410, 413, 415, 425, 429, 500, 503,
];
const STATUS_LABELS: [&str; 16] = [
    "200", "201", "202", "400", "401", "403", "404", "409", "410", "413", "415", "425", "429", "500", "503",
    "other",
];
const ROUTE_COUNT: usize = ROUTES.len() + ADMIN_ROUTES.len();

/// `seckill_http_requests_total` for (route, status), registered on first use and kept: the hot
/// path increments a handle instead of looking the labels up in the registry every request.
fn requests_counter(route: usize, status: usize) -> &'static metrics::Counter {
    const ROUTE_SLOTS: usize = ROUTE_COUNT + 1;
    static COUNTERS: [[OnceLock<metrics::Counter>; STATUS_LABELS.len()]; ROUTE_SLOTS] =
        [const { [const { OnceLock::new() }; STATUS_LABELS.len()] }; ROUTE_SLOTS];
    COUNTERS[route][status].get_or_init(|| {
        let route = route_name(route);
        metrics::counter!("seckill_http_requests_total", "route" => route, "status" => STATUS_LABELS[status])
    })
}

/// Every route's 500 and 503 counters, the purchase funnel's outcomes, the rate limiter's scopes
/// and the payment callbacks' outcomes, at zero from start: an alert or a dashboard query over
/// a series nothing touched yet answers 0, not "no data".
pub(super) fn export_at_zero() {
    metrics::counter!("seckill_token_store_errors_total").increment(0);
    for route in 0..ROUTE_COUNT {
        for status in ["500", "503"] {
            let i = STATUS_LABELS
                .iter()
                .position(|s| *s == status)
                .expect("a status label");
            requests_counter(route, i).increment(0);
        }
    }
    for outcome in [
        "queued",
        "duplicate",
        "sold_out",
        "not_started",
        "ended",
        "unavailable",
        "rate_limited",
        "token_invalid",
        "token_used",
    ] {
        metrics::counter!("seckill_purchases_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["allowed", "refused"] {
        metrics::counter!("seckill_admin_calls_total", "outcome" => outcome).increment(0);
    }
    for scope in ["ip", "user", "ramp", "global"] {
        metrics::counter!("seckill_rate_limited_total", "scope" => scope).increment(0);
    }
    for outcome in [
        "paid",
        "repeated",
        "double",
        "after_cancel",
        "not_payable",
        "unknown",
        "bad_signature",
        "wrong_amount",
    ] {
        metrics::counter!("seckill_payment_callbacks_total", "outcome" => outcome).increment(0);
    }
}

/// The body as bytes; a body over the limit (or unreadable) is refused as JSON like every error,
/// and so is a body that is not declared JSON (415): a form or a text body is not decoded as if
/// it were, whatever it contains. An empty body needs no content type (the routes whose body is
/// optional).
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            let status = rej.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "body_too_large"
            } else {
                "body_unreadable"
            };
            ApiError::new(status, code, rej.body_text()).field("body")
        })?;
        if !bytes.is_empty() && !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "a request body must be JSON: send Content-Type: application/json",
            )
            .field("content-type"));
        }
        Ok(RawBody(bytes))
    }
}

/// `application/json` or `application/<anything>+json`, parameters (a charset) allowed.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// The client's IP: the socket's peer, or from a trusted proxy the forwarding header's
/// rightmost untrusted hop (`limits::client_ip`).
pub struct ClientIp(pub Option<IpAddr>);

impl<C, B, L, N> FromRequestParts<Shared<C, B, L, N>> for ClientIp
where
    C: Send + Sync + 'static,
    B: Send + Sync + 'static,
    L: Send + Sync + 'static,
    N: Send + Sync + 'static,
{
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, api: &Shared<C, B, L, N>) -> Result<Self, ApiError> {
        let socket = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let (Some(peer), Some(header)) = (socket, &api.trusted_proxy_header) else {
            return Ok(ClientIp(socket));
        };
        let values = parts
            .headers
            .get_all(header.as_str())
            .into_iter()
            .map(|v| v.as_bytes());
        let client = super::limits::client_ip(peer, values, &api.trusted_proxies).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                "not a list of IP addresses",
            )
            .field(header.clone())
        })?;
        Ok(ClientIp(Some(client)))
    }
}

fn id_from(segment: &str) -> Result<ActivityId, ApiError> {
    path_id("id", segment)
        .map(ActivityId)
        .map_err(ApiError::bad_input)
}

fn unknown_activity(a: ActivityId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_activity",
        format!("activity {a} is not open here"),
    )
    .field("id")
}

fn known<C: StockCache, B: OrderBus, L: Ledger, N>(
    api: &Shared<C, B, L, N>,
    a: ActivityId,
) -> Result<(Activity, ActivityState), ApiError> {
    if !api.roles.api {
        return Err(ApiError::unavailable(format!(
            "this process runs the roles {} (not api): send purchases to an api process",
            api.roles
        )));
    }
    api.core.service.activity(a).ok_or_else(|| {
        if api.core.loaded() {
            unknown_activity(a)
        } else {
            // Not "no such activity": this process has not read the registry yet (it started
            // while a store was away); /readyz says so too.
            ApiError::unavailable("this process has not loaded the activity registry yet")
        }
    })
}

fn rate_limited(l: super::limits::Limited) -> ApiError {
    metrics::counter!("seckill_rate_limited_total", "scope" => l.scope).increment(1);
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("{} rate limit", l.scope),
    );
    e.retry_after_secs = Some(l.retry_after.as_millis().div_ceil(1_000) as u64);
    e
}

fn unauthenticated(e: super::identity::AuthError) -> ApiError {
    let mut err = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", e.reason).field("authorization");
    err.challenge = Some(e.kind);
    err
}

/// The verified caller; a `user_id` in the body must name the same user.
/// The caller of a buyer's route outside the purchase funnel, within its limits (DESIGN §12:
/// every route is limited): the client's, then — once the identity verifies — the user's, both
/// before any store is read, so a loop of order polls or cancels is refused before it reaches the
/// ledger's connection pool (which the workers' writes share).
async fn limited_caller<C, B, L, N>(
    api: &Shared<C, B, L, N>,
    headers: &HeaderMap,
    ip: Option<IpAddr>,
) -> Result<UserId, ApiError> {
    api.limits.check_ip(ip).map_err(rate_limited)?;
    let me = caller(api, headers, None)?;
    api.limits.check_user(me.0).map_err(rate_limited)?;
    api.limits.check_shared(me.0, false).await.map_err(rate_limited)?;
    Ok(me)
}

fn caller<C, B, L, N>(
    api: &Shared<C, B, L, N>,
    headers: &HeaderMap,
    body_user: Option<u64>,
) -> Result<UserId, ApiError> {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let super::identity::Caller(user) = api
        .identity
        .verify(auth, api.clock.now_ms())
        .map_err(unauthenticated)?;
    match body_user {
        Some(u) if u != user.0 => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "identity_mismatch",
            format!("user_id {u} is not the caller (user {user})"),
        )
        .field("user_id")),
        _ => Ok(user),
    }
}

/// The funnel's front, in order (DESIGN §12): the per-client limit, the caller's identity, then
/// whatever memory can answer — not started, ended, paused, known sold out — and only then the
/// per-user limit (charged to a verified user) and the ramp and global limit (a flooding client
/// was stopped by its own limit before it could drain the shared one); each of them first in this
/// process, then in the layer every process shares.
async fn front<C: StockCache, B: OrderBus, L, N>(
    api: &Shared<C, B, L, N>,
    activity: &Activity,
    headers: &HeaderMap,
    body_user: Option<u64>,
    qty: u32,
    ip: Option<IpAddr>,
) -> Result<UserId, ApiError> {
    api.limits.check_ip(ip).map_err(rate_limited)?;
    let user = caller(api, headers, body_user)?;
    if let Some(answer) = api.core.service.precheck(activity.id(), user, qty) {
        let o = answer.map_err(purchase_error)?;
        return Err(outcome_error(&o).expect("memory never queues"));
    }
    api.limits.check_user(user.0).map_err(rate_limited)?;
    let since_open = api.clock.now_ms().checked_sub(activity.spec().start_ms);
    api.limits.check_global(since_open).map_err(rate_limited)?;
    api.limits
        .check_shared(user.0, true)
        .await
        .map_err(rate_limited)?;
    Ok(user)
}

fn outcome_error(o: &PurchaseOutcome) -> Option<ApiError> {
    let (status, code, message) = match o {
        PurchaseOutcome::Queued(_) => return None,
        PurchaseOutcome::Duplicate => (
            StatusCode::CONFLICT,
            "duplicate",
            "this user already holds a unit".to_string(),
        ),
        PurchaseOutcome::SoldOut => (StatusCode::GONE, "sold_out", "sold out".to_string()),
        PurchaseOutcome::NotStarted => (
            StatusCode::TOO_EARLY,
            "not_started",
            "the sale has not started".to_string(),
        ),
        PurchaseOutcome::Ended => (StatusCode::GONE, "ended", "the sale has ended".to_string()),
        PurchaseOutcome::Unavailable { why, reason } => {
            return Some(ApiError::internal(why.message(), reason));
        }
    };
    Some(ApiError::new(status, code, message))
}

fn purchase_error(e: PurchaseError) -> ApiError {
    match e {
        PurchaseError::UnknownActivity(a) => unknown_activity(a),
        PurchaseError::Invalid(f) => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", f.reason).field(f.field)
        }
    }
}

async fn issue_token<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path(id): Path<String>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Json<TokenAnswer>, ApiError> {
    let a = id_from(&id)?;
    let req = body::token_request(&bytes).map_err(ApiError::bad_input)?;
    let (activity, _) = known(&api, a)?;
    // Tokens only for the caller, inside the window, while the sale takes orders and has stock.
    let user = front(&api, &activity, &headers, req.user_id, 1, ip).await?;
    let nonce = api.token_rng.lock().unwrap_or_else(|p| p.into_inner()).next_u64();
    let (token, expires_at_ms) = api.signer.issue(a, user, api.clock.now_ms(), nonce);
    Ok(Json(TokenAnswer { token, expires_at_ms }))
}

// The answers as structs: serialized directly (no JSON map built per request), and described in
// the OpenAPI document by the same types (`api::openapi`).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = Token)]
pub(super) struct TokenAnswer {
    token: String,
    expires_at_ms: u64,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub(super) struct Queued {
    status: QueuedStatus,
    reservation_id: String,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum QueuedStatus {
    Queued,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub(super) struct ActivityView {
    id: u64,
    state: ActivityState,
    total_stock: u64,
    buckets: u32,
    per_user_limit: u32,
    start_ms: u64,
    end_ms: u64,
    pay_timeout_ms: u64,
    /// The price of one unit, in the currency's minor unit.
    unit_price_minor: u64,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = OrderStatus)]
pub(super) struct OrderAnswer {
    state: seckill_core::service::OrderState,
    /// Once the ledger has the order.
    reservation_id: Option<String>,
}

async fn purchase<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path(id): Path<String>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Response {
    let started = tokio::time::Instant::now();
    let result = purchase_inner(&api, &id, ip, &headers, &bytes).await;
    let label = match &result {
        Ok(_) => "queued",
        Err(e) => e.code,
    };
    metrics::counter!("seckill_purchases_total", "outcome" => label).increment(1);
    metrics::histogram!("seckill_purchase_seconds").record(started.elapsed().as_secs_f64());
    match result {
        Ok(r) => (
            StatusCode::ACCEPTED,
            Json(Queued {
                status: QueuedStatus::Queued,
                reservation_id: r.to_string(),
            }),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn purchase_inner<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: &Shared<C, B, L, N>,
    id: &str,
    ip: Option<IpAddr>,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<ReservationId, ApiError> {
    let a = id_from(id)?;
    let req = body::purchase_request(bytes).map_err(ApiError::bad_input)?;
    let (activity, _) = known(api, a)?;
    let user = front(api, &activity, headers, req.user_id, req.qty, ip).await?;
    let now = api.clock.now_ms();
    let token = api.signer.verify(&req.token, a, user, now).map_err(|e| {
        let status = if e.code == "token_malformed" {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::FORBIDDEN
        };
        ApiError::new(status, e.code, e.reason).field("token")
    })?;
    match api.nonces.claim(token.nonce, token.expires_ms, now).await {
        Ok(true) => {}
        Ok(false) => {
            return Err(
                ApiError::new(StatusCode::CONFLICT, "token_used", "this token was already used")
                    .field("token"),
            )
        }
        Err(e) => {
            metrics::counter!("seckill_token_store_errors_total").increment(1);
            return Err(ApiError::internal(
                "the token service is unavailable; try again",
                format!("token store: {e}"),
            ));
        }
    }
    match api
        .core
        .service
        .purchase(a, user, req.qty)
        .await
        .map_err(purchase_error)?
    {
        PurchaseOutcome::Queued(r) => Ok(r.id),
        other => Err(outcome_error(&other).expect("not queued")),
    }
}

async fn activity_view<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path(id): Path<String>,
    ClientIp(ip): ClientIp,
) -> Result<Json<ActivityView>, ApiError> {
    api.limits.check_ip(ip).map_err(rate_limited)?;
    let a = id_from(&id)?;
    let (activity, state) = known(&api, a)?;
    let s = activity.spec();
    Ok(Json(ActivityView {
        id: a.0,
        state,
        total_stock: s.total_stock,
        buckets: s.buckets,
        per_user_limit: s.per_user_limit,
        start_ms: s.start_ms,
        end_ms: s.end_ms,
        pay_timeout_ms: s.pay_timeout_ms,
        unit_price_minor: s.unit_price_minor,
    }))
}

/// The caller's own order (another user's answers 404 like no order: existence is not revealed).
async fn order_view<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path((id, user)): Path<(String, String)>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
) -> Result<Json<OrderAnswer>, ApiError> {
    let a = id_from(&id)?;
    let user = UserId(path_id("user", &user).map_err(ApiError::bad_input)?);
    let me = limited_caller(&api, &headers, ip).await?;
    if me != user {
        return Err(no_order().field("user"));
    }
    order_of_user(&api, a, user).await
}

async fn order_of_user<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: &Shared<C, B, L, N>,
    a: ActivityId,
    user: UserId,
) -> Result<Json<OrderAnswer>, ApiError> {
    let plan = known_plan(api, a)?;
    let view = order_status(&api.core.cache, &api.core.ledger, &plan, user)
        .await
        .map_err(|e| ApiError::internal("the order's status is unavailable; try again", e))?;
    Ok(Json(view.into()))
}

/// The stock plan of an activity this process knows.
fn known_plan<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: &Shared<C, B, L, N>,
    a: ActivityId,
) -> Result<StockPlan, ApiError> {
    known(api, a)?;
    api.core.service.plan(a).ok_or_else(|| unknown_activity(a))
}

impl From<seckill_core::service::StatusView> for OrderAnswer {
    fn from(view: seckill_core::service::StatusView) -> Self {
        OrderAnswer {
            state: view.state,
            reservation_id: view.reservation.map(|r| r.to_string()),
        }
    }
}

/// One of the caller's reservations, by the id its 202 answered: "queued" from Redis while it is
/// in flight, so a client polling through the burst never reaches the ledger (DESIGN §12).
async fn reservation_view<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path((id, r)): Path<(String, String)>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
) -> Result<Json<OrderAnswer>, ApiError> {
    let a = id_from(&id)?;
    let r = reservation_from(&r)?;
    let me = limited_caller(&api, &headers, ip).await?;
    let plan = known_plan(&api, a)?;
    let view = reservation_status(&api.core.cache, &api.core.ledger, &plan, me, r)
        .await
        .map_err(|e| ApiError::internal("the reservation's status is unavailable; try again", e))?
        .ok_or_else(no_order)?;
    Ok(Json(view.into()))
}

fn reservation_from(segment: &str) -> Result<ReservationId, ApiError> {
    segment
        .parse()
        .map_err(|e: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", e).field("reservation"))
}

fn no_order() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_order",
        "no order with this reservation id",
    )
    .field("reservation")
}

/// The payment provider's signed callback: the only way an order becomes paid (DESIGN §12).
async fn payment_callback<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Json<Value>, ApiError> {
    // Before the signature is checked: a flood of forged callbacks costs an HMAC each at most.
    api.limits.check_ip(ip).map_err(rate_limited)?;
    let Some(verifier) = &api.payments else {
        return Err(ApiError::unavailable(
            "payment callbacks are not configured here (payment_secret)",
        ));
    };
    let sig = headers
        .get(super::payment::SIGNATURE_HEADER)
        .map(|v| v.as_bytes());
    verifier.verify(sig, &bytes, api.clock.now_ms()).map_err(|e| {
        paid_metric("bad_signature");
        // Audited (and a burst alerts: SeckillPaymentSignaturesRefused): somebody who is not
        // the payment provider is trying to mark orders paid, or the provider's key changed.
        tracing::info!(
            target: "seckill::audit",
            request_id = %REQUEST_ID.try_with(Clone::clone).unwrap_or_default(),
            peer = ?ip,
            reason = %e.0,
            "payment callback signature refused"
        );
        ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", e.0).field("x-seckill-signature")
    })?;
    let cb = super::payment::callback(&bytes).map_err(ApiError::bad_input)?;
    let unavailable = |e| ApiError::internal("the ledger is unavailable; send the callback again", e);
    let Some(order) = api.core.ledger.order(cb.reservation).await.map_err(unavailable)? else {
        paid_metric("unknown");
        return Err(no_order().field("reservation_id"));
    };
    // The amount is signed with the rest of the body: an order is paid by its own price only
    // (its quantity times the activity's unit price). Any other amount pays nothing.
    let a = order.reservation.activity;
    let activity = match api.core.service.activity(a) {
        Some((activity, _)) => Some(activity),
        None => api.core.ledger.activity(a).await.map_err(unavailable)?,
    };
    let due = activity.map(|x| {
        x.spec()
            .unit_price_minor
            .saturating_mul(u64::from(order.reservation.qty))
    });
    if due != Some(cb.amount_minor) {
        paid_metric("wrong_amount");
        tracing::warn!(
            target: "seckill::audit",
            request_id = %REQUEST_ID.try_with(Clone::clone).unwrap_or_default(),
            reservation = %cb.reservation,
            payment = %cb.payment_id,
            amount_minor = cb.amount_minor,
            due_minor = ?due,
            "payment callback refused: the amount is not the order's"
        );
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "wrong_amount",
            "the amount paid is not the order's price; nothing was paid, this payment is to be refunded",
        )
        .field("amount_minor"));
    }
    let outcome = api
        .core
        .ledger
        .pay(cb.reservation, &cb.payment_id)
        .await
        .map_err(|e| ApiError::internal("the ledger is unavailable; send the callback again", e))?;
    let (label, answer) = match outcome {
        PayOutcome::Paid => ("paid", Ok(Json(json!({ "status": "paid" })))),
        PayOutcome::AlreadyPaid => ("repeated", Ok(Json(json!({ "status": "paid" })))),
        PayOutcome::PaidWithOther(other) => (
            "double",
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "already_paid",
                format!("the order was paid by payment {other}; this payment is to be refunded"),
            )
            .field("payment_id")),
        ),
        PayOutcome::NotPayable(seckill_core::ports::OrderStatus::Cancelled) => (
            "after_cancel",
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "order_cancelled",
                "the order was cancelled (payment timeout or the buyer); this payment is to be refunded",
            )
            .field("reservation_id")),
        ),
        PayOutcome::NotPayable(s) => (
            "not_payable",
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_payable",
                format!("the order is {}; no stock moved", s.as_str()),
            )
            .field("reservation_id")),
        ),
        PayOutcome::NotFound => ("unknown", Err(no_order().field("reservation_id"))),
    };
    paid_metric(label);
    answer
}

fn paid_metric(outcome: &'static str) {
    metrics::counter!("seckill_payment_callbacks_total", "outcome" => outcome).increment(1);
}

/// The buyer cancels their own unpaid order (another user's answers 404, as if there were none).
async fn cancel<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    Path(r): Path<String>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let id = reservation_from(&r)?;
    let me = limited_caller(&api, &headers, ip).await?;
    let order = (api.core.ledger.order(id).await)
        .map_err(|e| ApiError::internal("the ledger is unavailable; try again", e))?;
    if order.is_none_or(|o| o.reservation.user != me) {
        return Err(no_order());
    }
    cancel_order(&api, id).await
}

async fn cancel_order<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: &Shared<C, B, L, N>,
    id: ReservationId,
) -> Result<Json<Value>, ApiError> {
    let cancelled = (api.core.ledger.cancel(id).await)
        .map_err(|e| ApiError::internal("the ledger is unavailable; try again", e))?;
    match cancelled {
        CancelOutcome::Cancelled(r) => {
            // The unit goes back to its own bucket; if Redis is down now, the reconciler gives it
            // back later (a cancelled order not yet released).
            let _ = api.core.cache.release(&r, ReleaseKind::Cancelled).await;
            Ok(Json(json!({ "status": "cancelled" })))
        }
        CancelOutcome::AlreadyCancelled => Ok(Json(json!({ "status": "cancelled" }))),
        CancelOutcome::NotCancellable(s) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_cancellable",
            format!("the order is {}", s.as_str()),
        )),
        CancelOutcome::NotFound => Err(no_order()),
    }
}

// ---------------------------------------------------------------------------------------------
// Admin

fn admin<C, B, L, N>(api: &Shared<C, B, L, N>, headers: &HeaderMap) -> Result<(), ApiError> {
    use subtle::ConstantTimeEq;
    let Some(v) = headers.get("authorization") else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "admin routes need a bearer token",
        )
        .field("authorization"));
    };
    let given = v
        .to_str()
        .ok()
        .and_then(|s| s.strip_prefix("Bearer "))
        .unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(api.admin_token.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "wrong admin token").field("authorization"))
    }
}

fn store_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(e.to_string())
}

fn admin_error(e: AdminError) -> ApiError {
    match e {
        AdminError::UnknownActivity(a) => unknown_activity(a),
        AdminError::OtherPlan(a) => ApiError::new(
            StatusCode::CONFLICT,
            "activity_exists",
            format!("activity {a} exists with another plan"),
        )
        .field("id"),
        AdminError::BadIntent(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", e.to_string()),
        AdminError::Busy { .. } => ApiError::unavailable(e.to_string()),
        AdminError::Store(e) => store_error(e),
    }
}

async fn admin_order_view<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path((id, user)): Path<(String, String)>,
) -> Result<Json<OrderAnswer>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let user = UserId(path_id("user", &user).map_err(ApiError::bad_input)?);
    order_of_user(&api, a, user).await
}

async fn admin_cancel<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path(r): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let id = reservation_from(&r)?;
    cancel_order(&api, id).await
}

fn warmed_view(w: &Warmed) -> Value {
    match w {
        Warmed::FromPlan(r) => json!({
            "warmup": "from_plan", "buckets_created": r.created, "buckets_existing": r.existing,
        }),
        Warmed::Recovered(r) => json!({
            "warmup": "recovered", "cause": r.cause, "generation": r.generation,
            "units_in_redis": r.stock, "buyer_marks": r.buyers, "rescued": r.rescued,
        }),
    }
}

async fn admin_create<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Response, ApiError> {
    admin(&api, &headers)?;
    let spec = body::activity_spec(&bytes).map_err(ApiError::bad_input)?;
    let activity = Activity::new(spec)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", e.reason).field(e.field))?;
    // Creating again with the same plan is idempotent; with another plan it is refused.
    let (created, warmed) = api.core.create(&activity).await.map_err(admin_error)?;
    let mut view = warmed_view(&warmed);
    view["id"] = json!(activity.id().0);
    view["created"] = json!(created);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

async fn admin_warmup<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let warmed = api.core.warmup(a).await.map_err(admin_error)?;
    Ok(Json(warmed_view(&warmed)))
}

/// Pause, resume, close: the registry, then every gate, for every process (§11.2).
async fn set_state<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    api: Shared<C, B, L, N>,
    headers: HeaderMap,
    id: String,
    state: ActivityState,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let (intent, gates) = api.core.set_intent(a, state).await.map_err(admin_error)?;
    let recovering = gates.iter().filter(|g| **g == GateWrite::Recorded).count();
    Ok(Json(json!({
        "id": a.0, "state": state.as_str(), "version": intent.version,
        "buckets_recovering": recovering,
    })))
}

/// The plan of a registered activity, from the registry (whatever this process's roles).
async fn registered_plan<C, B, L: Ledger, N>(
    api: &Shared<C, B, L, N>,
    a: ActivityId,
) -> Result<StockPlan, ApiError> {
    let activity = api.core.ledger.activity(a).await.map_err(store_error)?;
    activity
        .map(|x| StockPlan::new(&x))
        .ok_or_else(|| unknown_activity(a))
}

/// Every installed activity as the registry holds it: the spec and the operator's intent.
async fn admin_list<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let all = api.core.ledger.registered().await.map_err(store_error)?;
    Ok(Json(json!({ "activities": all })))
}

/// One activity: the registry's row; per bucket what Redis holds now — the stock, the open
/// reservations (told "queued", not yet in the ledger), the gate — and the units the ledger's
/// orders hold; the funnel of its units from those and the consumer lag; and a recovery's
/// progress (its claim, the gates it holds, the gates at the registry's generation).
async fn admin_show<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let registered =
        (api.core.ledger.registry(a).await.map_err(store_error)?).ok_or_else(|| unknown_activity(a))?;
    let plan = StockPlan::new(&registered.activity);
    let view = api.core.cache.summary(&plan).await.map_err(store_error)?;
    let ledger = (api.core.ledger.reconcile_view(a, &Default::default()).await).map_err(store_error)?;
    let sold = |b: BucketNo| ledger.sold.get(&b).copied().unwrap_or(0);
    let buckets: Vec<Value> = view
        .buckets
        .iter()
        .map(|b| {
            json!({
                "bucket": b.bucket.0,
                "initial": plan.initial(b.bucket),
                "stock": b.stock,
                "open_reservations": b.open.len(),
                "sold": sold(b.bucket),
                "gate": b.gate.as_ref().map(|g| json!({
                    "state": g.state, "intent": g.intent, "version": g.version, "generation": g.generation,
                })),
            })
        })
        .collect();
    let gates: Vec<_> = view.buckets.iter().filter_map(|b| b.gate.as_ref()).collect();
    let claim = view.meta.as_ref().and_then(|m| m.claim.clone());
    let mut body = serde_json::to_value(&registered).expect("plain data");
    body["recovering"] = json!(claim.is_some());
    body["buckets"] = json!(buckets);
    body["funnel"] = json!({
        "units": plan.all_buckets().map(|b| plan.initial(b)).sum::<u64>(),
        "in_redis": view.buckets.iter().filter_map(|b| b.stock).sum::<i64>(),
        "queued": view.buckets.iter().map(|b| b.open.iter().map(|r| u64::from(r.qty)).sum::<u64>()).sum::<u64>(),
        "sold": ledger.sold.values().sum::<u64>(),
        "cancelled_orders": ledger.cancelled.len(),
        // The records published and not yet applied (every activity's): null if the bus is down.
        "consumer_lag": api.core.bus.lag(ORDER_GROUP).await.ok(),
    });
    body["recovery"] = json!({
        "claim": claim,
        "gates_recovering": gates.iter().filter(|g| g.state == ActivityState::Recovering).count(),
        "gates_at_generation": gates.iter().filter(|g| g.generation == registered.intent.generation).count(),
        "gates_missing": view.buckets.len() - gates.len(),
    });
    Ok(Json(body))
}

async fn admin_reconcile<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let plan = registered_plan(&api, a).await?;
    let r = jobs::reconcile(
        &api.core.cache,
        &api.core.ledger,
        &api.core.bus,
        &plan,
        api.clock.now_ms(),
        &ReconcileConfig::default(),
    )
    .await
    .map_err(store_error)?;
    Ok(Json(serde_json::to_value(&r).expect("plain data")))
}

async fn admin_audit<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let a = id_from(&id)?;
    let plan = registered_plan(&api, a).await?;
    let audit = audit::audit(&api.core.cache, &api.core.ledger, &api.core.bus, &plan)
        .await
        .map_err(store_error)?;
    let mut body = serde_json::to_value(&audit).expect("plain data");
    body["activity"] = json!(a.0);
    body["units_sold"] = json!(audit.snapshot.units_sold());
    body["verdict"] = json!(audit.verdict());
    body["violations"] = json!(audit.violations.iter().map(|v| v.to_string()).collect::<Vec<_>>());
    Ok(Json(body))
}

// ---------------------------------------------------------------------------------------------
// Dead letters

/// A dead letter as an operator reads it: its place, where it came from and why, the payload as
/// text and, when it decodes, the reservation it carries.
fn letter_view(d: &DeadLetter) -> Value {
    json!({
        "partition": d.partition, "offset": d.offset, "origin": d.origin, "key": d.key,
        "reason": d.reason, "payload": String::from_utf8_lossy(&d.payload),
        "reservation": Reservation::decode(&d.payload).ok(),
    })
}

fn positions(at: &[(u32, u64)]) -> Vec<body::Position> {
    (at.iter())
        .map(|&(partition, offset)| body::Position { partition, offset })
        .collect()
}

/// A page of the dead-letter topic, with where the next starts and what a purge of everything
/// counted in `total` names.
async fn admin_dead_letters<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let (from, limit) = body::dead_letter_query(query.as_deref()).map_err(ApiError::bad_input)?;
    let page = api
        .core
        .bus
        .dead_letters(from, limit)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({
        "total": page.total,
        "dead_letters": page.letters.iter().map(letter_view).collect::<Vec<_>>(),
        "next": page.next.map(|(partition, offset)| body::Position { partition, offset }),
        "purge_before": positions(&page.ends),
    })))
}

async fn one_dead_letter<C, B: OrderBus, L, N>(
    api: &Shared<C, B, L, N>,
    (p, o): (u32, u64),
) -> Result<DeadLetter, ApiError> {
    let page = api.core.bus.dead_letters((p, o), 1).await.map_err(store_error)?;
    (page.letters.into_iter())
        .find(|d| (d.partition, d.offset) == (p, o))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_dead_letter",
                format!("no dead letter at partition {p}, offset {o}"),
            )
            .field("offset")
        })
}

async fn admin_dead_letter<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    Path((p, o)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let at = body::dead_letter_position(&p, &o).map_err(ApiError::bad_input)?;
    Ok(Json(letter_view(&one_dead_letter(&api, at).await?)))
}

/// Dead letters replayed at once: each is a ledger read and maybe a publish, independent of the
/// others (the ledger dedupes and fences whatever order they arrive in); one after another, a
/// few thousand would outlast the request timeout.
const REPLAYS_IN_FLIGHT: usize = 64;

/// Replay one dead letter: its outcome's index among (replayed, already an order, undecodable)
/// and its line of the answer.
async fn replay_one<C, B: OrderBus, L: Ledger, N>(
    api: &Shared<C, B, L, N>,
    d: &DeadLetter,
) -> Result<(usize, Value), ApiError> {
    let done = admin::replay(&api.core.bus, &api.core.ledger, d)
        .await
        .map_err(admin_error)?;
    let (i, outcome, detail) = match done {
        Replayed::Published => (0, "replayed", Value::Null),
        Replayed::AlreadyAnOrder(s) => (1, "already_an_order", json!(s)),
        Replayed::DoesNotDecode(e) => (2, "does_not_decode", json!(e)),
    };
    let line = json!({
        "partition": d.partition, "offset": d.offset, "outcome": outcome, "detail": detail,
    });
    Ok((i, line))
}

/// Replay one dead letter or every one the topic holds now (not those that arrive meanwhile: a
/// replay that is dead-lettered again waits for the next call). Each is published again unless
/// the ledger holds its reservation already; the letters stay until purged.
async fn admin_replay<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Json<Value>, ApiError> {
    use futures::{StreamExt, TryStreamExt};
    admin(&api, &headers)?;
    let target = body::replay_request(&bytes).map_err(ApiError::bad_input)?;
    let mut done: Vec<(usize, Value)> = Vec::new();
    match target {
        body::ReplayTarget::One(p, o) => {
            done.push(replay_one(&api, &one_dead_letter(&api, (p, o)).await?).await?)
        }
        body::ReplayTarget::All => {
            const PAGE: usize = 500;
            let (mut from, mut ends) = (Some((0, 0)), None);
            while let Some(at) = from {
                let page = api.core.bus.dead_letters(at, PAGE).await.map_err(store_error)?;
                let ends: &Vec<(u32, u64)> = ends.get_or_insert(page.ends);
                let counted = |p: u32, o: u64| ends.iter().any(|&(q, end)| q == p && o < end);
                let letters: Vec<DeadLetter> = (page.letters.into_iter())
                    .filter(|d| counted(d.partition, d.offset))
                    .collect();
                // Owned letters and a clone of the state per replay: a borrowed one makes the
                // handler's future lifetime-generic, which axum's handler bound refuses.
                let replayed: Vec<_> = futures::stream::iter(letters)
                    .map(|d| {
                        let api = api.clone();
                        async move { replay_one(&api, &d).await }
                    })
                    .buffered(REPLAYS_IN_FLIGHT)
                    .try_collect()
                    .await?;
                done.extend(replayed);
                // On while a letter counted at the start may lie at or after the next page.
                from = (page.next).filter(|&(p, o)| counted(p, o) || ends.iter().any(|&(q, _)| q > p));
            }
        }
    }
    let count = |i: usize| done.iter().filter(|(k, _)| *k == i).count();
    Ok(Json(json!({
        "replayed": count(0), "already_orders": count(1), "undecodable": count(2),
        "letters": done.into_iter().map(|(_, line)| line).collect::<Vec<_>>(),
    })))
}

/// Delete the dead letters below the positions given (a listing's `purge_before`).
async fn admin_purge<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(
    State(api): State<Shared<C, B, L, N>>,
    headers: HeaderMap,
    RawBody(bytes): RawBody,
) -> Result<Json<Value>, ApiError> {
    admin(&api, &headers)?;
    let before = body::purge_request(&bytes).map_err(ApiError::bad_input)?;
    let purged = api
        .core
        .bus
        .purge_dead_letters(&before)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({ "purged": purged })))
}

// ---------------------------------------------------------------------------------------------
// Operations

async fn metrics_text<C, B, L, N>(State(api): State<Shared<C, B, L, N>>) -> Response {
    // The process's CPU, memory, open files and threads, read at each scrape.
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    match &api.metrics {
        Some(h) => {
            let process = PROCESS.get_or_init(|| {
                let c = metrics_process::Collector::default();
                c.describe();
                c
            });
            process.collect();
            ([("content-type", "text/plain; version=0.0.4")], h.render()).into_response()
        }
        None => ApiError::unavailable("metrics are not recorded in this process").into_response(),
    }
}

/// Ready for this process's roles (DESIGN §11.1), from the state the probe task last saw
/// (`probe_readiness`, every second): a flood of probes costs no store a single call.
async fn ready<C, B, L, N>(State(api): State<Shared<C, B, L, N>>) -> Response {
    let seen = api.readiness.read().unwrap_or_else(|p| p.into_inner()).clone();
    let status = if seen.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(seen.body)).into_response()
}

/// Probe what this process's roles need: api = Redis answers and the registry was loaded;
/// worker = Kafka and MySQL answer; jobs = all three. Stored for `/readyz`.
pub async fn probe_readiness<C: StockCache, B: OrderBus, L: Ledger, N: NonceStore>(api: &Shared<C, B, L, N>) {
    let roles = api.roles;
    let redis = (roles.api || roles.jobs).then_some(api.core.cache.meta(ActivityId(0)).await.map(|_| ()));
    let ledger =
        (roles.worker || roles.jobs).then_some(api.core.ledger.activity(ActivityId(0)).await.map(|_| ()));
    let bus = (roles.worker || roles.jobs).then_some(api.core.bus.lag(ORDER_GROUP).await.map(|_| ()));
    let loaded = roles.api.then(|| api.core.loaded());
    let verdict = |r: &Option<Result<(), seckill_core::ports::PortError>>| match r {
        None => Value::Null,
        Some(Ok(())) => json!("ok"),
        Some(Err(e)) => json!(e.to_string()),
    };
    let body = json!({
        "roles": roles.to_string(), "redis": verdict(&redis), "ledger": verdict(&ledger),
        "bus": verdict(&bus), "activities_loaded": loaded,
    });
    // Each store this process talks to, up (1) or down (0), for the store-down alerts. An API
    // process does not probe the bus (it needs none to be ready); it says whether its producer
    // knows the bus down.
    for (store, seen) in [("redis", &redis), ("ledger", &ledger), ("bus", &bus)] {
        let up = match seen {
            Some(r) => r.is_ok(),
            None if store == "bus" && roles.api => api.core.bus.known_down().is_none(),
            None => continue,
        };
        metrics::gauge!("seckill_store_up", "store" => store).set(if up { 1.0 } else { 0.0 });
    }
    let ok = [&redis, &ledger, &bus]
        .iter()
        .all(|r| r.as_ref().is_none_or(|r| r.is_ok()))
        && loaded.unwrap_or(true);
    *api.readiness.write().unwrap_or_else(|p| p.into_inner()) = super::Readiness { ok, body };
}
