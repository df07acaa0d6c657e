//! The HTTP API through `tower::ServiceExt::oneshot` (no sockets): every outcome of every route,
//! a table of bad inputs (each with its status and code, and no stock moved), admin auth, the
//! OpenAPI document against the router, metrics.

use crate::support::{Mode, TestRedis};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use rand::SeedableRng;
use seckill_api::config::ServeConfig;
use seckill_api::nonce::EmbeddedNonces;
use seckill_api::serve::{self, Secrets, Stores};
use seckill_api::{admin_router, router, Shared, ADMIN_ROUTES, ROUTES};
use seckill_core::adapters::embedded::{EmbeddedBus, EmbeddedLedger};
use seckill_core::adapters::script::ScriptedStockCache;
use seckill_core::clock::Clock;
use seckill_core::domain::{ActivityId, StockPlan, UserId};
use seckill_core::ports::{Ledger, OrderBus, StockCache};
use seckill_core::service::OrderConsumer;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};
use tower::ServiceExt;

type TestApi = Shared<ScriptedStockCache<TestRedis>, EmbeddedBus, EmbeddedLedger, EmbeddedNonces>;

const ADMIN: &str = "admin-token-0123456789";
/// The price of a unit in the harness's sales (minor units): what a payment callback must say.
const PRICE: u64 = 1_999;
const JWT_SECRET: &str = "jwt-secret-of-the-login-service-0123";

struct Harness {
    /// The public listener's router.
    app: Router,
    /// The admin listener's router.
    admin: Router,
    api: TestApi,
    redis: TestRedis,
    bus: EmbeddedBus,
    ledger: EmbeddedLedger,
    now_ms: u64,
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn harness_with(tweak: impl FnOnce(&mut ServeConfig)) -> Harness {
    let mut cfg = ServeConfig {
        admin_token: Some(ADMIN.into()),
        token_secret: Some("s".repeat(32).into()),
        jwt: Some(seckill_api::config::JwtKeys::Secret(JWT_SECRET.into())),
        payment_secret: Some(PAYMENT_SECRET.into()),
        ..ServeConfig::default()
    };
    // The tests click fast as one user; the rate-limit tests set their own limits.
    cfg.rate.per_user_per_sec = 1_000;
    tweak(&mut cfg);
    let redis = TestRedis::default();
    let (bus, ledger) = (EmbeddedBus::new(3, 10_000), EmbeddedLedger::new());
    let stores = Stores {
        cache: ScriptedStockCache::new(redis.clone()),
        bus: bus.clone(),
        ledger: ledger.clone(),
        nonces: EmbeddedNonces::default(),
        limiter: None,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let secrets = Secrets::resolve(&cfg, &mut rng);
    let now_ms = wall_ms();
    let clock = Clock::new(now_ms, tokio::time::Instant::now());
    let api = serve::api(&cfg, stores, &secrets, clock, &mut rng).unwrap();
    Harness {
        app: router(api.clone()),
        admin: admin_router(api.clone()),
        api,
        redis,
        bus,
        ledger,
        now_ms,
    }
}

fn harness() -> Harness {
    harness_with(|_| {})
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value, HeaderMap) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    // A body is JSON, as every client sends it, unless the test says otherwise.
    if body.is_some()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value, headers)
}

const AUTH: (&str, &str) = ("authorization", "Bearer admin-token-0123456789");
const PAYMENT_SECRET: &str = "payment-provider-secret";

/// A request to the listener that serves `uri` (admin routes, metrics and readiness on the admin
/// one; `the_listeners_serve_their_own_routes_only` checks that neither serves the other's).
async fn at(
    h: &Harness,
    method: &str,
    uri: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value, HeaderMap) {
    let admin = uri.starts_with("/api/v1/admin") || uri == "/metrics" || uri == "/readyz";
    call(if admin { &h.admin } else { &h.app }, method, uri, body, headers).await
}

impl Harness {
    /// `Bearer <JWT>` of `user`, as the login service would issue it.
    fn jwt(&self, user: u64) -> String {
        let exp = self.now_ms / 1_000 + 3_600;
        format!(
            "Bearer {}",
            seckill_api::identity::mint(JWT_SECRET.as_bytes(), UserId(user), exp, None, None)
        )
    }

    /// Create an activity through the admin route; `start`/`end` relative to now.
    async fn activity(&self, id: u64, stock: u64, buckets: u32, start: i64, end: i64) {
        let spec = json!({
            "id": id, "total_stock": stock, "buckets": buckets, "fallback_pct": 0,
            "start_ms": (self.now_ms as i64 + start) as u64, "end_ms": (self.now_ms as i64 + end) as u64,
            "pay_timeout_ms": 60_000, "unit_price_minor": PRICE,
        });
        let (status, body, _) = call(
            &self.admin,
            "POST",
            "/api/v1/admin/activities",
            Some(&spec.to_string()),
            &[AUTH],
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    async fn open(&self, id: u64, stock: u64) {
        self.activity(id, stock, 2, -1_000, 3_600_000).await;
    }

    async fn token(&self, a: u64, user: u64) -> String {
        let (status, body, _) = call(
            &self.app,
            "POST",
            &format!("/api/v1/activities/{a}/token"),
            None,
            &[("authorization", &self.jwt(user))],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    async fn buy(&self, a: u64, user: u64) -> (StatusCode, Value, HeaderMap) {
        let token = self.token(a, user).await;
        self.buy_with(a, user, &json!({ "token": token }).to_string())
            .await
    }

    /// A purchase (its token taken first) while every Redis call does what `mode` says.
    async fn buy_while_redis(&self, a: u64, user: u64, mode: Mode) -> (StatusCode, Value, HeaderMap) {
        let token = self.token(a, user).await;
        self.redis.knob.set(mode);
        let answer = self
            .buy_with(a, user, &json!({ "token": token }).to_string())
            .await;
        self.redis.knob.set(Mode::Pass);
        answer
    }

    /// A purchase with `body`, as `user`.
    async fn buy_with(&self, a: u64, user: u64, body: &str) -> (StatusCode, Value, HeaderMap) {
        call(
            &self.app,
            "POST",
            &format!("/api/v1/activities/{a}/purchase"),
            Some(body),
            &[("authorization", &self.jwt(user))],
        )
        .await
    }

    /// Apply everything on the bus to the ledger.
    async fn drain(&self) {
        let source = self.bus.subscribe("api-test").await.unwrap();
        let cache = ScriptedStockCache::new(self.redis.clone());
        let mut consumer = OrderConsumer::new(self.ledger.clone(), cache, source, 64);
        while consumer.run_once().await.unwrap().delivered > 0 {}
    }

    /// Everything that counts as stock, for "nothing moved" comparisons.
    async fn stock_state(&self, a: u64) -> String {
        let plan = self.api.core.service.plan(ActivityId(a)).unwrap();
        let cache = ScriptedStockCache::new(self.redis.clone());
        format!(
            "{:?} {:?} {}",
            cache.snapshot(&plan).await.unwrap(),
            self.ledger.snapshot(ActivityId(a)).await.unwrap(),
            self.bus.backlog()
        )
    }
}

/// A request of the bad-input table: method, path, body, headers.
type Req<'a> = (&'a str, String, String, Vec<(&'a str, &'a str)>);

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn purchase_answers_every_outcome() {
    let h = harness();
    h.open(1, 1).await;
    let (s, body, _) = h.buy(1, 10).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "queued");
    assert_eq!(body["reservation_id"].as_str().unwrap().len(), 32);
    let (s, body, _) = h.buy(1, 10).await;
    assert_eq!((s, code(&body)), (StatusCode::CONFLICT, "duplicate"));
    // One unit: the next user finds it sold out, and from then on that user's bucket is known
    // empty — a token and a purchase are refused from memory, with no Redis call at all.
    let (s, body, _) = h.buy(1, 11).await;
    assert_eq!((s, code(&body)), (StatusCode::GONE, "sold_out"));
    let before = h.redis.calls.load(Ordering::SeqCst);
    let (s, body, _) = at(
        &h,
        "POST",
        "/api/v1/activities/1/token",
        None,
        &[("authorization", &h.jwt(11))],
    )
    .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::GONE, "sold_out"),
        "no token for a sold-out bucket"
    );
    let (issued, _) = h.api.signer.issue(ActivityId(1), UserId(11), h.now_ms, 77);
    let (s, body, _) = h.buy_with(1, 11, &json!({ "token": issued }).to_string()).await;
    assert_eq!((s, code(&body)), (StatusCode::GONE, "sold_out"));
    assert_eq!(
        h.redis.calls.load(Ordering::SeqCst),
        before,
        "sold out is answered from memory"
    );

    h.activity(2, 10, 2, 3_600_000, 7_200_000).await;
    let (s, body, _) = at(
        &h,
        "POST",
        "/api/v1/activities/2/token",
        None,
        &[("authorization", &h.jwt(1))],
    )
    .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::TOO_EARLY, "not_started"),
        "no token before the start"
    );
    let (early, _) = h.api.signer.issue(ActivityId(2), UserId(1), h.now_ms, 99);
    let (s, body, _) = h.buy_with(2, 1, &json!({ "token": early }).to_string()).await;
    assert_eq!((s, code(&body)), (StatusCode::TOO_EARLY, "not_started"));

    h.activity(3, 10, 2, -7_200_000, -3_600_000).await;
    let (s, body, _) = at(
        &h,
        "POST",
        "/api/v1/activities/3/token",
        None,
        &[("authorization", &h.jwt(1))],
    )
    .await;
    assert_eq!((s, code(&body)), (StatusCode::GONE, "ended"));

    h.open(4, 10).await;
    let (s, _, _) = at(&h, "POST", "/api/v1/admin/activities/4/pause", None, &[AUTH]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, body, _) = at(
        &h,
        "POST",
        "/api/v1/activities/4/token",
        None,
        &[("authorization", &h.jwt(1))],
    )
    .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        "{body}"
    );
    at(&h, "POST", "/api/v1/admin/activities/4/resume", None, &[AUTH]).await;
    let (s, body, headers) = h.buy_while_redis(4, 1, Mode::FailDeterminate).await;
    assert_eq!((s, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    // The buyer is told the public reason alone (the store's error is in the log, under the
    // request id the answer carries).
    assert_eq!(
        body["error"]["message"],
        seckill_core::service::Unserved::StockCache.message(),
        "{body}"
    );
    let request_id = headers["x-request-id"].to_str().unwrap();
    assert!(!request_id.is_empty());
    assert_eq!(body["error"]["request_id"], request_id, "{body}");
    // A reserve whose reply was lost may have run: the buyer is told its outcome is unknown
    // (never "nothing was bought"), and the order view shows the reservation it holds.
    let (s, body, _) = h.buy_while_redis(4, 2, Mode::FailAfter).await;
    assert_eq!((s, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    assert_eq!(
        body["error"]["message"],
        seckill_core::service::Unserved::OutcomeUnknown.message(),
        "{body}"
    );
    let (s, body, _) = at(
        &h,
        "GET",
        "/api/v1/activities/4/orders/2",
        None,
        &[("authorization", &h.jwt(2))],
    )
    .await;
    assert_eq!(
        (s, body["state"].as_str()),
        (StatusCode::OK, Some("queued")),
        "{body}"
    );
}

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let h = harness_with(|c| c.rate.per_user_per_sec = 2);
    h.open(1, 100).await;
    let ask = |user: u64| {
        let me = h.jwt(user);
        let h = &h;
        async move {
            at(
                h,
                "POST",
                "/api/v1/activities/1/token",
                None,
                &[("authorization", &me)],
            )
            .await
        }
    };
    assert_eq!(ask(5).await.0, StatusCode::OK);
    assert_eq!(ask(5).await.0, StatusCode::OK);
    let (s, body, headers) = ask(5).await;
    assert_eq!((s, code(&body)), (StatusCode::TOO_MANY_REQUESTS, "rate_limited"));
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert_eq!(
        ask(6).await.0,
        StatusCode::OK,
        "another user has a quota of its own"
    );
    // Nobody can spend user 6's quota without being user 6: refused before the per-user limit.
    for _ in 0..5 {
        let (s, _, _) = at(&h, "POST", "/api/v1/activities/1/token", None, &[]).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        ask(6).await.0,
        StatusCode::OK,
        "anonymous requests did not lock user 6 out"
    );
}

/// A POST from the socket address `peer` (what `ConnectInfo` gives a served request).
async fn from_peer(h: &Harness, peer: &str, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    request_from_peer(h, "POST", peer, uri, headers).await
}

async fn request_from_peer(
    h: &Harness,
    method: &str,
    peer: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    let addr: std::net::SocketAddr = peer.parse().unwrap();
    req.extensions_mut().insert(axum::extract::ConnectInfo(addr));
    let resp = h.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_per_ip_limit_believes_only_trusted_proxies() {
    let h = harness_with(|c| {
        c.rate.per_ip_per_sec = 1;
        c.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        c.trusted_proxy_header = Some("x-forwarded-for".into());
    });
    h.open(1, 100).await;
    let token = "/api/v1/activities/1/token";
    let ask = |user: u64, peer: &'static str, xff: &'static str| {
        let me = h.jwt(user);
        let h = &h;
        async move {
            let mut headers = vec![("authorization", me.as_str())];
            if !xff.is_empty() {
                headers.push(("x-forwarded-for", xff));
            }
            from_peer(h, peer, token, &headers).await.0
        }
    };
    // Through our proxy (10.1.1.1): the client is the rightmost address that is not a proxy of
    // ours; what the client wrote further left proves nothing.
    assert_eq!(ask(1, "10.1.1.1:5000", "203.0.113.7").await, StatusCode::OK);
    assert_eq!(
        ask(2, "10.1.1.1:5000", "198.51.100.1, 203.0.113.7").await,
        StatusCode::TOO_MANY_REQUESTS,
        "a spoofed left entry changes nothing"
    );
    assert_eq!(
        ask(3, "10.1.1.1:5000", "203.0.113.8, 10.2.2.2").await,
        StatusCode::OK,
        "a chain of our proxies is skipped"
    );
    // From a peer we do not trust, the header is ignored: the socket is the client.
    assert_eq!(ask(4, "192.0.2.5:5000", "203.0.113.99").await, StatusCode::OK);
    assert_eq!(
        ask(5, "192.0.2.5:5000", "203.0.113.100").await,
        StatusCode::TOO_MANY_REQUESTS,
        "X-Forwarded-For from an untrusted peer does not escape the limit"
    );
    // IPv6 clients are limited per /64.
    assert_eq!(ask(6, "[2001:db8:1:2::1]:5000", "").await, StatusCode::OK);
    assert_eq!(
        ask(7, "[2001:db8:1:2::ffff]:5000", "").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (s, body) = from_peer(&h, "10.1.1.1:5000", token, &[("x-forwarded-for", "not-an-ip")]).await;
    assert_eq!(
        (s, body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("x-forwarded-for"))
    );
}

/// Every buyer's route is limited (DESIGN §12), not only the purchase funnel: per client address
/// before anything else, and the routes that read the ledger per user as well, so a loop of
/// order polls or cancels is refused before it reaches the ledger's connection pool.
#[tokio::test]
async fn every_buyer_route_is_limited_before_it_reads_a_store() {
    let h = harness_with(|c| {
        c.rate.per_ip_per_sec = 1;
        c.rate.per_user_per_sec = 1;
    });
    h.open(1, 100).await;
    let seven = h.jwt(7);
    let as7 = [("authorization", seven.as_str())];
    let cancel = format!("/api/v1/orders/{}/cancel", "ab".repeat(16));
    let routes = [
        ("GET", "/api/v1/activities/1", StatusCode::OK),
        ("GET", "/api/v1/activities/1/orders/7", StatusCode::OK),
        ("POST", cancel.as_str(), StatusCode::NOT_FOUND),
        ("POST", "/api/v1/payments/callback", StatusCode::UNAUTHORIZED),
    ];
    for (i, (method, uri, first)) in routes.into_iter().enumerate() {
        // A user of their own per route: only the address's limit is under test here.
        let me = h.jwt(20 + i as u64);
        let me = [("authorization", me.as_str())];
        let peer = format!("192.0.2.{}:5000", 10 + i);
        let (s, _) = request_from_peer(
            &h,
            method,
            &peer,
            &uri.replace("/7", &format!("/{}", 20 + i)),
            &me,
        )
        .await;
        assert_eq!(s, first, "{method} {uri}");
        let (s, body) = request_from_peer(&h, method, &peer, uri, &as7).await;
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited")),
            "{method} {uri}: a second request from the same address in the same second"
        );
    }
    // User 7 polls its order from two addresses: the second poll is over the user's limit.
    let order = "/api/v1/activities/1/orders/7";
    assert_eq!(
        request_from_peer(&h, "GET", "192.0.2.50:5000", order, &as7)
            .await
            .0,
        StatusCode::OK
    );
    let (s, body) = request_from_peer(&h, "GET", "192.0.2.51:5000", order, &as7).await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
    );
}

/// A body that is not declared JSON is refused (415, naming the header) before it is decoded,
/// and moves nothing; an empty body needs no content type.
#[tokio::test]
async fn a_body_not_declared_json_is_refused_and_moves_nothing() {
    let h = harness();
    h.open(1, 10).await;
    let before = h.stock_state(1).await;
    let token = h.token(1, 7).await;
    let body = json!({ "token": token }).to_string();
    let me = h.jwt(7);
    let send = |content_type: Option<&'static str>| {
        let (me, body) = (me.clone(), body.clone());
        let app = h.app.clone();
        async move {
            let mut req = Request::builder()
                .method("POST")
                .uri("/api/v1/activities/1/purchase")
                .header("authorization", me);
            if let Some(ct) = content_type {
                req = req.header("content-type", ct);
            }
            let resp = app.oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            (
                status,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonp"),
    ] {
        let (s, body) = send(ct).await;
        assert_eq!(
            (s, body["error"]["code"].as_str(), body["error"]["field"].as_str()),
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some("unsupported_media_type"),
                Some("content-type")
            ),
            "content type {ct:?}"
        );
    }
    assert_eq!(h.stock_state(1).await, before, "a refused body moved stock");
    // The token was not spent by the refusals: declared JSON (a charset allowed), it buys.
    let (s, _) = send(Some("application/json; charset=utf-8")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    // An empty body needs no content type (the token route's body is optional).
    let (s, _, _) = at(
        &h,
        "POST",
        "/api/v1/activities/1/token",
        None,
        &[("authorization", &h.jwt(8))],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}

/// A payment callback signed with `secret` at `t` (unix seconds).
async fn callback(h: &Harness, body: &str, secret: &str, t: u64) -> (StatusCode, Value, HeaderMap) {
    let sig = seckill_api::payment::CallbackVerifier::new(secret.as_bytes()).sign(t, body.as_bytes());
    at(
        h,
        "POST",
        "/api/v1/payments/callback",
        Some(body),
        &[("x-seckill-signature", &sig)],
    )
    .await
}

/// A reservation's status by the id its 202 answered: "queued" from Redis while its outbox
/// entry is open — even once the ledger holds the order and before Redis settled it, which shows
/// the ledger was not asked — then the ledger's word; another user's, an unknown one and a
/// malformed id answer as they must.
#[tokio::test]
async fn a_reservation_in_flight_is_answered_from_redis() {
    let h = harness();
    h.open(1, 10).await;
    let (seven, eight) = (h.jwt(7), h.jwt(8));
    let as7 = [("authorization", seven.as_str())];
    let as8 = [("authorization", eight.as_str())];
    let (_, q, _) = h.buy(1, 7).await;
    let rid = q["reservation_id"].as_str().unwrap().to_string();
    let path = format!("/api/v1/activities/1/reservations/{rid}");
    let (s, queued, _) = at(&h, "GET", &path, None, &as7).await;
    assert_eq!(
        (s, queued["state"].as_str()),
        (StatusCode::OK, Some("queued")),
        "{queued}"
    );
    assert_eq!(queued["reservation_id"].as_str(), Some(rid.as_str()));

    // The ledger takes the order; Redis has not settled it yet.
    let plan = h.api.core.service.plan(ActivityId(1)).unwrap();
    let cache = ScriptedStockCache::new(h.redis.clone());
    let open: Vec<_> = (cache.snapshot(&plan).await.unwrap().buckets)
        .into_iter()
        .flat_map(|b| b.open)
        .collect();
    assert_eq!(open.len(), 1, "{open:?}");
    h.ledger.apply(&open).await.unwrap();
    let (_, by_user, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as7).await;
    assert_eq!(
        by_user["state"], "created",
        "the user's order view asks the ledger first"
    );
    let (_, still, _) = at(&h, "GET", &path, None, &as7).await;
    assert_eq!(
        still["state"], "queued",
        "answered from Redis alone while the entry is open"
    );

    h.drain().await;
    let (s, created, _) = at(&h, "GET", &path, None, &as7).await;
    assert_eq!((s, created["state"].as_str()), (StatusCode::OK, Some("created")));

    let (s, body, _) = at(&h, "GET", &path, None, &as8).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "unknown_order"),
        "another user's"
    );
    let unknown = format!("/api/v1/activities/1/reservations/{}", "0".repeat(32));
    let (s, body, _) = at(&h, "GET", &unknown, None, &as7).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "unknown_order"));
    let (s, body, _) = at(&h, "GET", "/api/v1/activities/1/reservations/xyz", None, &as7).await;
    assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, "invalid_input"));
    let (s, _, _) = at(&h, "GET", &path, None, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn status_payment_callback_and_cancel_belong_to_their_owner() {
    let h = harness();
    h.open(1, 10).await;
    let (seven, eight) = (h.jwt(7), h.jwt(8));
    let as7 = [("authorization", seven.as_str())];
    let as8 = [("authorization", eight.as_str())];
    let (_, none, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as7).await;
    assert_eq!(none["state"], "none");
    let (_, q, _) = h.buy(1, 7).await;
    let rid = q["reservation_id"].as_str().unwrap().to_string();
    let (_, queued, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as7).await;
    assert_eq!(queued["state"], "queued");
    h.drain().await;
    let (_, created, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as7).await;
    assert_eq!(
        (created["state"].as_str(), created["reservation_id"].as_str()),
        (Some("created"), Some(rid.as_str()))
    );
    // Another user sees nothing of user 7's order and cannot cancel it; the answers are those
    // of an order that does not exist.
    let (s, body, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as8).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "unknown_order"));
    let (s, body, _) = at(&h, "POST", &format!("/api/v1/orders/{rid}/cancel"), None, &as8).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "unknown_order"));
    let (s, _, headers) = at(&h, "POST", &format!("/api/v1/orders/{rid}/cancel"), None, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
    let (s, _, _) = at(&h, "POST", &format!("/api/v1/orders/{rid}/pay"), None, &as7).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "the buyer cannot mark their own order paid"
    );

    // Paid only by the provider's signed callback; the same payment again is the same answer.
    let now_s = h.now_ms / 1_000;
    // The amount is signed with the rest: any other than the order's price pays nothing.
    for wrong in [0, PRICE - 1, PRICE + 1, 2 * PRICE] {
        let short = json!({ "payment_id": "pay-0", "reservation_id": rid, "amount_minor": wrong });
        let (s, body, _) = callback(&h, &short.to_string(), PAYMENT_SECRET, now_s).await;
        assert_eq!(
            (s, code(&body), body["error"]["field"].as_str()),
            (StatusCode::CONFLICT, "wrong_amount", Some("amount_minor")),
            "{wrong}"
        );
    }
    let (_, still, _) = at(&h, "GET", "/api/v1/activities/1/orders/7", None, &as7).await;
    assert_eq!(still["state"], "created", "a wrong amount paid nothing");
    let paid = json!({ "payment_id": "pay-1", "reservation_id": rid, "amount_minor": PRICE }).to_string();
    let (s, body, _) = callback(&h, &paid, "forged-secret-000000", now_s).await;
    assert_eq!((s, code(&body)), (StatusCode::UNAUTHORIZED, "bad_signature"));
    let (s, body, _) = callback(&h, &paid, PAYMENT_SECRET, now_s - 301).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::UNAUTHORIZED, "bad_signature"),
        "replayed after the window"
    );
    for _ in 0..2 {
        let (s, body, _) = callback(&h, &paid, PAYMENT_SECRET, now_s).await;
        assert_eq!(
            (s, body["status"].as_str()),
            (StatusCode::OK, Some("paid")),
            "{body}"
        );
    }
    let other = json!({ "payment_id": "pay-2", "reservation_id": rid, "amount_minor": PRICE }).to_string();
    let (s, body, _) = callback(&h, &other, PAYMENT_SECRET, now_s).await;
    assert_eq!((s, code(&body)), (StatusCode::CONFLICT, "already_paid"));
    let (s, body, _) = at(&h, "POST", &format!("/api/v1/orders/{rid}/cancel"), None, &as7).await;
    assert_eq!((s, code(&body)), (StatusCode::CONFLICT, "not_cancellable"));

    let (_, q, _) = h.buy(1, 8).await;
    let rid = q["reservation_id"].as_str().unwrap().to_string();
    h.drain().await;
    let plan = h.api.core.service.plan(ActivityId(1)).unwrap();
    let cache = ScriptedStockCache::new(h.redis.clone());
    let stock = |v: seckill_core::ports::CacheView| v.buckets.iter().filter_map(|b| b.stock).sum::<i64>();
    let before = stock(cache.snapshot(&plan).await.unwrap());
    let (s, body, _) = at(&h, "POST", &format!("/api/v1/orders/{rid}/cancel"), None, &as8).await;
    assert_eq!((s, body["status"].as_str()), (StatusCode::OK, Some("cancelled")));
    assert_eq!(
        stock(cache.snapshot(&plan).await.unwrap()),
        before + 1,
        "the unit is back in Redis"
    );
    let (s, _, _) = at(&h, "POST", &format!("/api/v1/orders/{rid}/cancel"), None, &as8).await;
    assert_eq!(s, StatusCode::OK, "cancel is idempotent");
    let late = json!({ "payment_id": "pay-3", "reservation_id": rid, "amount_minor": PRICE }).to_string();
    let (s, body, _) = callback(&h, &late, PAYMENT_SECRET, now_s).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "order_cancelled"),
        "a payment after the cancel is refunded"
    );
    let unknown =
        json!({ "payment_id": "pay-4", "reservation_id": "0".repeat(32), "amount_minor": PRICE }).to_string();
    let (s, body, _) = callback(&h, &unknown, PAYMENT_SECRET, now_s).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "unknown_order"));

    // The operator sees and cancels any order, on the admin listener only.
    let (s, body, _) = at(&h, "GET", "/api/v1/admin/activities/1/orders/8", None, &[AUTH]).await;
    assert_eq!(
        (s, body["state"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{body}"
    );
    let (s, body, _) = at(&h, "GET", "/api/v1/admin/activities/1/audit", None, &[AUTH]).await;
    assert_eq!(
        (s, body["verdict"].as_str()),
        (StatusCode::OK, Some("ok")),
        "{body}"
    );
    let (_, view, _) = at(&h, "GET", "/api/v1/activities/1", None, &[]).await;
    assert_eq!(
        (view["state"].as_str(), view["total_stock"].as_u64()),
        (Some("open"), Some(10))
    );
}

#[tokio::test]
async fn the_listeners_serve_their_own_routes_only() {
    let h = harness();
    for (method, path) in ADMIN_ROUTES.iter().filter(|r| r.1 != "/healthz") {
        let uri = path
            .replace("{id}", "1")
            .replace("{user}", "1")
            .replace("{reservation}", &"0".repeat(32));
        let (s, body, _) = call(&h.app, &method.to_uppercase(), &uri, None, &[AUTH]).await;
        assert_eq!(
            (s, code(&body)),
            (StatusCode::NOT_FOUND, "no_route"),
            "{method} {path} on the public listener"
        );
    }
    for (method, path) in ROUTES.iter().filter(|r| r.1 != "/healthz") {
        let uri = path
            .replace("{id}", "1")
            .replace("{user}", "1")
            .replace("{reservation}", &"0".repeat(32));
        let (s, body, _) = call(&h.admin, &method.to_uppercase(), &uri, None, &[]).await;
        assert_eq!(
            (s, code(&body)),
            (StatusCode::NOT_FOUND, "no_route"),
            "{method} {path} on the admin listener"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn expired_and_replayed_tokens_are_refused() {
    let h = harness_with(|c| c.token_ttl_ms = 1_000);
    h.open(1, 10).await;
    let token = h.token(1, 3).await;
    tokio::time::advance(std::time::Duration::from_millis(1_500)).await;
    let (s, body, _) = h.buy_with(1, 3, &json!({ "token": token }).to_string()).await;
    assert_eq!((s, code(&body)), (StatusCode::FORBIDDEN, "token_expired"));

    let token = h.token(1, 4).await;
    let body = json!({ "token": token }).to_string();
    assert_eq!(h.buy_with(1, 4, &body).await.0, StatusCode::ACCEPTED);
    let (s, resp, _) = h.buy_with(1, 4, &body).await;
    assert_eq!((s, code(&resp)), (StatusCode::CONFLICT, "token_used"));
}

#[tokio::test(start_paused = true)]
async fn identities_that_are_missing_expired_forged_or_someone_else_are_refused() {
    let h = harness();
    h.open(1, 10).await;
    let before = h.stock_state(1).await;
    let token = h.token(1, 5).await;
    let exp = h.now_ms / 1_000 + 60;
    let forged = format!(
        "Bearer {}",
        seckill_api::identity::mint(b"not-the-login-service-secret-000", UserId(5), exp, None, None)
    );
    let expired = format!(
        "Bearer {}",
        seckill_api::identity::mint(
            JWT_SECRET.as_bytes(),
            UserId(5),
            h.now_ms / 1_000 - 120,
            None,
            None
        )
    );
    let buy = json!({ "token": token }).to_string();
    let mint_for_8 = json!({ "user_id": 8 }).to_string();
    // (what, path, body, headers, status, code)
    type Case<'a> = (
        &'a str,
        &'a str,
        String,
        Vec<(&'a str, String)>,
        StatusCode,
        &'a str,
    );
    let cases: [Case; 6] = [
        (
            "no identity",
            "/api/v1/activities/1/purchase",
            buy.clone(),
            vec![],
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        ),
        (
            "forged JWT",
            "/api/v1/activities/1/purchase",
            buy.clone(),
            vec![("authorization", forged)],
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        ),
        (
            "expired JWT",
            "/api/v1/activities/1/purchase",
            buy.clone(),
            vec![("authorization", expired)],
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        ),
        (
            "not a bearer",
            "/api/v1/activities/1/purchase",
            buy.clone(),
            vec![("authorization", "Basic dTpw".into())],
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        ),
        (
            "user 5's token as user 6",
            "/api/v1/activities/1/purchase",
            buy.clone(),
            vec![("authorization", h.jwt(6))],
            StatusCode::FORBIDDEN,
            "token_invalid",
        ),
        (
            "a token for user 8 minted by user 5",
            "/api/v1/activities/1/token",
            mint_for_8,
            vec![("authorization", h.jwt(5))],
            StatusCode::FORBIDDEN,
            "identity_mismatch",
        ),
    ];
    for (name, uri, body, headers, status, want) in cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (s, resp, hs) = at(&h, "POST", uri, Some(&body), &headers).await;
        assert_eq!((s, code(&resp)), (status, want), "{name}: {resp}");
        if status == StatusCode::UNAUTHORIZED {
            assert!(
                hs.get("www-authenticate")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("Bearer"),
                "{name}"
            );
        }
    }
    assert_eq!(
        h.stock_state(1).await,
        before,
        "no refused identity moved any stock"
    );
    assert_eq!(
        h.buy_with(1, 5, &buy).await.0,
        StatusCode::ACCEPTED,
        "the owner's token still works"
    );
}

#[tokio::test]
async fn bad_inputs_get_their_status_and_code_and_move_no_stock() {
    let h = harness_with(|c| c.body_limit_bytes = 256);
    h.open(1, 10).await;
    h.open(2, 10).await;
    let good = h.token(1, 5).await;
    let for_other_user = h.token(1, 6).await;
    let for_other_activity = h.token(2, 5).await;
    // One signature character changed (not the last: its low bits may be padding).
    let mut tampered = good.clone();
    let i = tampered.len() - 10;
    let c = if &tampered[i..i + 1] == "A" { "B" } else { "A" };
    tampered.replace_range(i..i + 1, c);
    let huge = format!(r#"{{"user_id": 5, "token": "{}"}}"#, "x".repeat(400));
    let before = h.stock_state(1).await;
    let five = h.jwt(5);
    let as5 = ("authorization", five.as_str());

    let purchase = |b: &str| {
        (
            "POST",
            "/api/v1/activities/1/purchase".to_string(),
            b.to_string(),
            vec![as5],
        )
    };
    let with_token = |t: &str| json!({ "user_id": 5, "token": t }).to_string();
    let cases: Vec<(&str, Req, StatusCode, &str, &str)> = vec![
        ("malformed JSON", purchase("{"), StatusCode::BAD_REQUEST, "invalid_input", "body"),
        ("not an object", purchase("[]"), StatusCode::BAD_REQUEST, "invalid_input", "body"),
        ("user_id of another user", purchase(&format!(r#"{{"user_id": 6, "token": "{good}"}}"#)), StatusCode::FORBIDDEN, "identity_mismatch", "user_id"),
        ("missing token", purchase(r#"{"user_id": 5}"#), StatusCode::BAD_REQUEST, "invalid_input", "token"),
        ("extra field", purchase(&format!(r#"{{"user_id": 5, "token": "{good}", "price": 0}}"#)), StatusCode::BAD_REQUEST, "invalid_input", "price"),
        ("user_id a string", purchase(r#"{"user_id": "5", "token": "t"}"#), StatusCode::BAD_REQUEST, "invalid_input", "user_id"),
        ("user_id negative", purchase(r#"{"user_id": -5, "token": "t"}"#), StatusCode::BAD_REQUEST, "invalid_input", "user_id"),
        ("user_id huge", purchase(r#"{"user_id": 1e300, "token": "t"}"#), StatusCode::BAD_REQUEST, "invalid_input", "user_id"),
        ("qty zero", purchase(&format!(r#"{{"user_id": 5, "token": "{good}", "qty": 0}}"#)), StatusCode::BAD_REQUEST, "invalid_input", "qty"),
        ("qty over the limit", purchase(&format!(r#"{{"user_id": 5, "token": "{good}", "qty": 2}}"#)), StatusCode::BAD_REQUEST, "invalid_input", "qty"),
        ("token a number", purchase(r#"{"user_id": 5, "token": 7}"#), StatusCode::BAD_REQUEST, "invalid_input", "token"),
        ("token garbage", purchase(&with_token("garbage")), StatusCode::BAD_REQUEST, "token_malformed", "token"),
        ("token of another user", purchase(&with_token(&for_other_user)), StatusCode::FORBIDDEN, "token_invalid", "token"),
        ("token of another activity", purchase(&with_token(&for_other_activity)), StatusCode::FORBIDDEN, "token_invalid", "token"),
        ("tampered signature", purchase(&with_token(&tampered)), StatusCode::FORBIDDEN, "token_invalid", "token"),
        ("oversized body", purchase(&huge), StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "body"),
        ("unknown activity", ("POST", "/api/v1/activities/99/purchase".into(), with_token(&good), vec![as5]), StatusCode::NOT_FOUND, "unknown_activity", "id"),
        ("activity id not a number", ("POST", "/api/v1/activities/abc/purchase".into(), with_token(&good), vec![as5]), StatusCode::BAD_REQUEST, "invalid_input", "id"),
        ("activity id zero", ("POST", "/api/v1/activities/0/token".into(), r#"{"user_id": 5}"#.into(), vec![as5]), StatusCode::BAD_REQUEST, "invalid_input", "id"),
        ("user path not a number", ("GET", "/api/v1/activities/1/orders/-3".into(), String::new(), vec![as5]), StatusCode::BAD_REQUEST, "invalid_input", "user"),
        ("reservation not hex", ("POST", "/api/v1/orders/xyz/cancel".into(), String::new(), vec![as5]), StatusCode::BAD_REQUEST, "invalid_input", "reservation"),
        ("callback unsigned", ("POST", "/api/v1/payments/callback".into(), r#"{"payment_id":"p","reservation_id":"0a"}"#.into(), vec![]), StatusCode::UNAUTHORIZED, "bad_signature", "x-seckill-signature"),
        ("admin without token", ("POST", "/api/v1/admin/activities/1/close".into(), String::new(), vec![]), StatusCode::UNAUTHORIZED, "unauthorized", "authorization"),
        ("admin with a wrong token", ("POST", "/api/v1/admin/activities/1/close".into(), String::new(), vec![("authorization", "Bearer nope")]), StatusCode::FORBIDDEN, "forbidden", "authorization"),
        ("admin: invalid activity", ("POST", "/api/v1/admin/activities".into(), r#"{"id": 1, "total_stock": 10, "buckets": 0, "fallback_pct": 0, "start_ms": 0, "end_ms": 1, "pay_timeout_ms": 1}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "buckets"),
        ("admin: a plan change", ("POST", "/api/v1/admin/activities".into(), r#"{"id": 1, "total_stock": 11, "buckets": 2, "fallback_pct": 0, "start_ms": 0, "end_ms": 1, "pay_timeout_ms": 1}"#.into(), vec![AUTH]), StatusCode::CONFLICT, "activity_exists", "id"),
        ("admin: unknown field", ("POST", "/api/v1/admin/activities".into(), r#"{"id": 1, "stock": 10}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "stock"),
        ("dead letters: limit zero", ("GET", "/api/v1/admin/dead-letters?limit=0".into(), String::new(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "limit"),
        ("dead letters: unknown parameter", ("GET", "/api/v1/admin/dead-letters?page=2".into(), String::new(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "query"),
        ("dead letter: offset not a number", ("GET", "/api/v1/admin/dead-letters/0/x".into(), String::new(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "offset"),
        ("dead letter: none there", ("GET", "/api/v1/admin/dead-letters/0/7".into(), String::new(), vec![AUTH]), StatusCode::NOT_FOUND, "unknown_dead_letter", "offset"),
        ("replay: neither all nor a letter", ("POST", "/api/v1/admin/dead-letters/replay".into(), "{}".into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "partition"),
        ("replay: all and a letter", ("POST", "/api/v1/admin/dead-letters/replay".into(), r#"{"all": true, "partition": 0, "offset": 1}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "all"),
        ("replay: offset missing", ("POST", "/api/v1/admin/dead-letters/replay".into(), r#"{"partition": 0}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "offset"),
        ("purge: no position", ("POST", "/api/v1/admin/dead-letters/purge".into(), r#"{"before": []}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "before"),
        ("purge: offset past Kafka's", ("POST", "/api/v1/admin/dead-letters/purge".into(), r#"{"before": [{"partition": 0, "offset": 1}, {"partition": 1, "offset": 9223372036854775808}]}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "before[1].offset"),
        ("purge: offset negative", ("POST", "/api/v1/admin/dead-letters/purge".into(), r#"{"before": [{"partition": 0, "offset": -1}]}"#.into(), vec![AUTH]), StatusCode::BAD_REQUEST, "invalid_input", "before[0].offset"),
    ];
    for (name, (method, uri, body, headers), status, want_code, field) in cases {
        let body = (!body.is_empty()).then_some(body.as_str());
        let (s, resp, _) = at(&h, method, &uri, body, &headers).await;
        assert_eq!((s, code(&resp)), (status, want_code), "{name}: {resp}");
        assert_eq!(resp["error"]["field"].as_str(), Some(field), "{name}: {resp}");
        assert!(
            !resp["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{name}: {resp}"
        );
    }
    let (s, resp, _) = at(&h, "DELETE", "/api/v1/activities/1/purchase", None, &[]).await;
    assert_eq!(
        (s, code(&resp)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    let (s, resp, _) = at(&h, "GET", "/nope", None, &[]).await;
    assert_eq!((s, code(&resp)), (StatusCode::NOT_FOUND, "no_route"));
    assert_eq!(h.stock_state(1).await, before, "no bad input moved any stock");
    // ... and the good token still works afterwards (none of the above used its nonce).
    assert_eq!(h.buy_with(1, 5, &with_token(&good)).await.0, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn the_openapi_document_describes_exactly_the_routes() {
    let h = harness();
    let (s, doc, _) = at(&h, "GET", "/api/v1/openapi.json", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path}"
            );
            documented.insert((method.clone(), path.clone()));
        }
    }
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .chain(ADMIN_ROUTES)
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed);
}

#[tokio::test]
async fn health_and_metrics() {
    let h = harness();
    h.open(1, 10).await;
    h.buy(1, 1).await;
    let (s, _, headers) = at(&h, "GET", "/healthz", None, &[("x-request-id", "abc-1")]).await;
    assert_eq!(
        (s, headers.get("x-request-id").unwrap().to_str().unwrap()),
        (StatusCode::OK, "abc-1")
    );
    let (_, _, headers) = at(&h, "GET", "/healthz", None, &[]).await;
    assert!(
        headers
            .get("x-request-id")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with('r'),
        "an id is made up"
    );
    let (s, _, _) = at(&h, "GET", "/readyz", None, &[]).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready before the first probe"
    );
    seckill_api::probe_readiness(&h.api).await;
    let (s, body, _) = at(&h, "GET", "/readyz", None, &[]).await;
    assert_eq!(
        (s, body["redis"].as_str()),
        (StatusCode::OK, Some("ok")),
        "{body}"
    );
    // Readiness answers from the last probe: a flood of probes costs Redis nothing.
    let calls = h.redis.calls.load(Ordering::SeqCst);
    for _ in 0..20 {
        at(&h, "GET", "/readyz", None, &[]).await;
    }
    assert_eq!(h.redis.calls.load(Ordering::SeqCst), calls);
    h.redis.knob.set(Mode::FailDeterminate);
    seckill_api::probe_readiness(&h.api).await;
    let (s, body, _) = at(&h, "GET", "/readyz", None, &[]).await;
    h.redis.knob.set(Mode::Pass);
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (s, text, _) = at(&h, "GET", "/metrics", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(text.contains("seckill_purchases_total"), "{text}");
    assert!(text.contains("seckill_http_requests_total"), "{text}");
    assert!(
        text.contains("seckill_reserve_seconds_bucket{le=")
            && text.contains("seckill_publish_seconds_bucket{le="),
        "latencies are histograms (they add up across processes): {text}"
    );
    assert!(text.contains("seckill_store_up{store=\"redis\"}"), "{text}");
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_threads",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(process))
            .unwrap_or_else(|| panic!("{process}: {text}"));
        let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        // (Whole CPU seconds: a test may not have spent one yet.)
        assert!(v > 0.0 || process == "process_cpu_seconds_total", "{line}");
    }
}

#[tokio::test]
async fn the_ledger_plan_is_what_redis_was_warmed_with() {
    let h = harness();
    h.open(1, 10).await;
    let plan = h.api.core.service.plan(ActivityId(1)).unwrap();
    assert_eq!(
        plan,
        StockPlan::new(&h.ledger.activity(ActivityId(1)).await.unwrap().unwrap())
    );
}

/// Who a matrix request claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    ExpiredJwt,
    ForgedJwt,
    /// A valid JWT of a user other than the route's subject.
    Another,
    /// A valid JWT of the route's subject (the order's owner, the token's user).
    Owner,
    /// The admin token as the bearer.
    Admin,
    SignedCallback,
    ForgedCallback,
    /// A callback signed with the provider's secret, replayed after its 300-second window.
    ReplayedCallback,
}

const EVERYONE: [Who; 9] = [
    Who::Nobody,
    Who::ExpiredJwt,
    Who::ForgedJwt,
    Who::Another,
    Who::Owner,
    Who::Admin,
    Who::SignedCallback,
    Who::ForgedCallback,
    Who::ReplayedCallback,
];

/// What a route answers whoever asks: the same for everyone, or per identity.
enum Expect {
    /// Open by design (the activity view, docs, health, metrics, readiness): identity changes nothing.
    SameForAll,
    /// A user route: 401 without a valid JWT, `another` for someone else, `owner` for its user.
    User { another: u16, owner: u16 },
    /// An admin route: 401 without a bearer, 403 with another one than the admin token, `ok`
    /// with it.
    AdminOnly { ok: u16 },
    /// The payment callback: only a valid signature within its window counts.
    Callback,
}

impl Expect {
    fn status(&self, who: Who) -> Option<u16> {
        match (self, who) {
            (Expect::SameForAll, _) => None,
            (Expect::User { another, .. }, Who::Another) => Some(*another),
            (Expect::User { owner, .. }, Who::Owner) => Some(*owner),
            (Expect::AdminOnly { ok }, Who::Admin) => Some(*ok),
            (Expect::AdminOnly { .. }, Who::ExpiredJwt | Who::ForgedJwt | Who::Another | Who::Owner) => {
                Some(403)
            }
            (Expect::Callback, Who::SignedCallback) => Some(200),
            _ => Some(401),
        }
    }
}

/// The authorization matrix (DESIGN §12): every route of both listeners × every identity, each
/// request against a fresh engine holding one created order (user 7's), with the status it must
/// answer — and where it refuses, no stock moved in Redis, the ledger or the bus.
#[tokio::test]
async fn authorization_matrix_every_route_times_every_identity() {
    const OWNER: u64 = 7;
    const BUYER: u64 = 9;
    let routes: Vec<(&str, &str, Expect)> = vec![
        (
            "POST",
            "/api/v1/activities/1/token",
            Expect::User {
                another: 200,
                owner: 200,
            },
        ),
        // The subject is user 9, whose token the body carries; another user may not spend it.
        (
            "POST",
            "/api/v1/activities/1/purchase",
            Expect::User {
                another: 403,
                owner: 202,
            },
        ),
        ("GET", "/api/v1/activities/1", Expect::SameForAll),
        (
            "GET",
            "/api/v1/activities/1/orders/7",
            Expect::User {
                another: 404,
                owner: 200,
            },
        ),
        (
            "GET",
            "/api/v1/activities/1/reservations/{rid}",
            Expect::User {
                another: 404,
                owner: 200,
            },
        ),
        (
            "POST",
            "/api/v1/orders/{rid}/cancel",
            Expect::User {
                another: 404,
                owner: 200,
            },
        ),
        ("POST", "/api/v1/payments/callback", Expect::Callback),
        ("GET", "/api/v1/openapi.json", Expect::SameForAll),
        ("GET", "/healthz", Expect::SameForAll),
        ("POST", "/api/v1/admin/activities", Expect::AdminOnly { ok: 201 }),
        ("GET", "/api/v1/admin/activities", Expect::AdminOnly { ok: 200 }),
        ("GET", "/api/v1/admin/activities/1", Expect::AdminOnly { ok: 200 }),
        (
            "POST",
            "/api/v1/admin/activities/1/warmup",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/activities/1/pause",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/activities/1/resume",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/activities/1/close",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/activities/1/reconcile",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "GET",
            "/api/v1/admin/activities/1/audit",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "GET",
            "/api/v1/admin/activities/1/orders/7",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/orders/{rid}/cancel",
            Expect::AdminOnly { ok: 200 },
        ),
        ("GET", "/api/v1/admin/dead-letters", Expect::AdminOnly { ok: 200 }),
        // None there (the sale above dead-letters nothing): the admin learns so, no one else.
        (
            "GET",
            "/api/v1/admin/dead-letters/0/0",
            Expect::AdminOnly { ok: 404 },
        ),
        (
            "POST",
            "/api/v1/admin/dead-letters/replay",
            Expect::AdminOnly { ok: 200 },
        ),
        (
            "POST",
            "/api/v1/admin/dead-letters/purge",
            Expect::AdminOnly { ok: 200 },
        ),
        ("GET", "/metrics", Expect::SameForAll),
        ("GET", "/readyz", Expect::SameForAll),
    ];
    let listed: BTreeSet<String> = ROUTES
        .iter()
        .chain(ADMIN_ROUTES)
        .map(|(m, p)| format!("{} {p}", m.to_uppercase()))
        .collect();
    let tried: BTreeSet<String> = routes
        .iter()
        .map(|(m, p, _)| {
            let template = p
                .replace("activities/1", "activities/{id}")
                .replace("orders/7", "orders/{user}")
                .replace("{rid}", "{reservation}")
                .replace("dead-letters/0/0", "dead-letters/{partition}/{offset}");
            format!("{m} {template}")
        })
        .collect();
    assert_eq!(tried, listed, "the matrix covers every route of both listeners");

    let mut cells = 0;
    for (method, path, expect) in &routes {
        let mut same: Option<(Who, u16)> = None;
        for who in EVERYONE {
            let h = harness();
            h.open(1, 10).await;
            let (_, q, _) = h.buy(1, OWNER).await;
            let rid = q["reservation_id"].as_str().unwrap().to_string();
            h.drain().await;
            let token = h.token(1, BUYER).await;
            let uri = path.replace("{rid}", &rid);
            let subject = if path.ends_with("/purchase") { BUYER } else { OWNER };
            let body = if path.ends_with("/purchase") {
                json!({ "token": token }).to_string()
            } else if path.ends_with("/callback") {
                json!({ "payment_id": "pay-1", "reservation_id": rid, "amount_minor": PRICE }).to_string()
            } else if path.ends_with("/replay") {
                json!({ "all": true }).to_string()
            } else if path.ends_with("/purge") {
                json!({ "before": [{ "partition": 0, "offset": 0 }] }).to_string()
            } else if path.ends_with("/admin/activities") {
                json!({
                    "id": 2, "total_stock": 5, "buckets": 1, "fallback_pct": 0,
                    "start_ms": h.now_ms, "end_ms": h.now_ms + 60_000, "pay_timeout_ms": 60_000,
                })
                .to_string()
            } else {
                String::new()
            };
            let now_s = h.now_ms / 1_000;
            let jwt = |secret: &[u8], user: u64, exp: u64| {
                let t = seckill_api::identity::mint(secret, UserId(user), exp, None, None);
                format!("Bearer {t}")
            };
            let sign = |secret: &str, t: u64| {
                seckill_api::payment::CallbackVerifier::new(secret.as_bytes()).sign(t, body.as_bytes())
            };
            let header: Option<(&str, String)> = match who {
                Who::Nobody => None,
                Who::ExpiredJwt => Some(("authorization", jwt(JWT_SECRET.as_bytes(), subject, now_s - 120))),
                Who::ForgedJwt => Some((
                    "authorization",
                    jwt(b"not-the-login-service-0000000000", subject, now_s + 600),
                )),
                Who::Another => Some(("authorization", h.jwt(8))),
                Who::Owner => Some(("authorization", h.jwt(subject))),
                Who::Admin => Some(AUTH).map(|(k, v)| (k, v.to_string())),
                Who::SignedCallback => Some(("x-seckill-signature", sign(PAYMENT_SECRET, now_s))),
                Who::ForgedCallback => Some(("x-seckill-signature", sign("forged-provider-secret", now_s))),
                Who::ReplayedCallback => Some(("x-seckill-signature", sign(PAYMENT_SECRET, now_s - 301))),
            };
            let headers: Vec<(&str, &str)> = header.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let before = h.stock_state(1).await;
            let body = (!body.is_empty()).then_some(body.as_str());
            let (status, answer, hs) = at(&h, method, &uri, body, &headers).await;
            let status = status.as_u16();
            match expect.status(who) {
                Some(want) => assert_eq!(status, want, "{method} {path} as {who:?}: {answer}"),
                None => match same {
                    None => same = Some((who, status)),
                    Some((first, s)) => assert_eq!(
                        status, s,
                        "{method} {path}: {who:?} got another answer than {first:?}: {answer}"
                    ),
                },
            }
            if status == 401 {
                assert!(
                    answer["error"]["code"].is_string(),
                    "{method} {path} as {who:?}: {answer}"
                );
                if matches!(expect, Expect::User { .. }) {
                    assert!(hs.contains_key("www-authenticate"), "{method} {path} as {who:?}");
                }
            }
            if status >= 400 {
                assert_eq!(
                    h.stock_state(1).await,
                    before,
                    "{method} {path} as {who:?} was refused ({status}) and moved stock"
                );
            }
            cells += 1;
        }
    }
    assert_eq!(cells, routes.len() * EVERYONE.len());
}
