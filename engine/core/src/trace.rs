//! Trace context across the order bus: a W3C `traceparent` carried by each record from the
//! publishing span to the consumer's span of that record. The engine emits `tracing` spans only
//! (debug level: disabled, and nearly free, unless a subscriber wants them); how a span's context
//! reads as a `traceparent` and how a span adopts one belongs to the tracing backend the binary
//! installs (`seckill_api::telemetry`, OpenTelemetry). Without one both are no-ops, so the core
//! and the simulation link no tracing backend.

use std::sync::OnceLock;

/// The backend's two conversions.
pub struct Hooks {
    /// The current span's context as a `traceparent` (`None`: nothing is being traced).
    pub current: fn() -> Option<String>,
    /// Make `span` a child of the remote span a `traceparent` names.
    pub adopt: fn(&tracing::Span, &str),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Install the backend's hooks (once per process; later calls are ignored).
pub fn install(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

/// The `traceparent` a record published now should carry.
pub fn current() -> Option<String> {
    HOOKS.get().and_then(|h| (h.current)())
}

/// Continue, in `span`, the trace a record's `traceparent` started.
pub fn adopt(span: &tracing::Span, traceparent: &str) {
    if let Some(h) = HOOKS.get() {
        (h.adopt)(span, traceparent)
    }
}
