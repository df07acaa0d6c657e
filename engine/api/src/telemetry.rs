//! Traces: one trace from a buyer's click through the reserve, the publish, the worker's batch
//! (the record's span continues the purchase's trace through the Kafka record's `traceparent`
//! header), the ledger's commit and the settle in Redis; and each job pass. Exported with
//! OpenTelemetry over OTLP/HTTP, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, with OpenTelemetry's own settings:
//! `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default here: parent-based, 1% of new
//! traces — a request that arrives with a sampled `traceparent` is traced whatever the ratio),
//! `OTEL_SERVICE_NAME` (default `seckill`), `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! The engine's spans are at debug level (nearly free while nothing subscribes to them); the
//! request's span is at info level when tracing is on, so that the JSON log lines of a request
//! carry its `request_id` and `trace_id`.

use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported by this process.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The exporter, to flush at exit.
pub struct Telemetry(SdkTracerProvider);

impl Telemetry {
    /// Export what is buffered and stop.
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "traces: the last spans were not exported");
        }
    }
}

/// The OpenTelemetry layer for the process's subscriber, when an OTLP endpoint is configured
/// (`env` reads the settings); `roles` names the process in its resource. Call before any
/// runtime starts (the HTTP exporter runs its own client thread).
#[allow(clippy::type_complexity)]
pub fn layer<S>(
    env: impl Fn(&str) -> Option<String>,
    roles: &str,
) -> Result<
    Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        Telemetry,
    )>,
    String,
>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let endpoints = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ];
    if endpoints.iter().all(|k| set(k).is_none()) {
        return Ok(None);
    }
    // Checked here: the exporter takes any text and fails only at its first export.
    for k in endpoints {
        if let Some(v) = set(k) {
            let url = url::Url::parse(&v).map_err(|e| format!("{k}: {v:?} is not a URL: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(format!(
                    "{k}: {v:?} must be http(s)://HOST[:PORT] (OTLP over HTTP)"
                ));
            }
        }
    }
    check_sampler(set("OTEL_TRACES_SAMPLER"), set("OTEL_TRACES_SAMPLER_ARG"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder()
        .with_attribute(opentelemetry::KeyValue::new("seckill.roles", roles.to_string()));
    if set("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("seckill");
    }
    let mut provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build());
    if set("OTEL_TRACES_SAMPLER").is_none() {
        provider = provider.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(0.01))));
    }
    let provider = provider.build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    seckill_core::trace::install(seckill_core::trace::Hooks { current, adopt });
    ON.store(true, Ordering::Relaxed);
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("seckill"));
    Ok(Some((layer, Telemetry(provider))))
}

/// OpenTelemetry's sampler settings, refused by name when the SDK would fall back silently.
fn check_sampler(sampler: Option<String>, arg: Option<String>) -> Result<(), String> {
    const SAMPLERS: [&str; 6] = [
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ];
    let Some(sampler) = sampler else {
        return Ok(());
    };
    if !SAMPLERS.contains(&sampler.as_str()) {
        return Err(format!(
            "OTEL_TRACES_SAMPLER: {sampler:?} is not one of {}",
            SAMPLERS.join(", ")
        ));
    }
    if sampler.ends_with("traceidratio") {
        let ratio = arg.as_deref().and_then(|a| a.trim().parse::<f64>().ok());
        if !ratio.is_some_and(|r| (0.0..=1.0).contains(&r)) {
            return Err(format!(
                "OTEL_TRACES_SAMPLER_ARG: {sampler} needs a ratio in 0..=1, got {:?}",
                arg.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// The current span's context as a `traceparent` (none unless it is sampled).
fn current() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_sampled() {
        return None;
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove("traceparent")
}

/// `span` continues the remote span `traceparent` names (a malformed one is ignored: the span
/// starts a trace of its own).
fn adopt(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The span of one request: a child of the caller's `traceparent` if it sent one, its trace id
/// recorded for the log lines. `Span::none()` while tracing is off.
pub fn request_span(headers: &axum::http::HeaderMap, request_id: &str, route: &str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!("request", request_id = %request_id, route = %route,
        trace_id = tracing::field::Empty);
    if let Some(parent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        adopt(&span, parent);
    }
    let trace = span.context().span().span_context().trace_id();
    span.record("trace_id", tracing::field::display(trace));
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layer`'s answer to these settings: `Ok(true)` a layer, `Ok(false)` none, or the refusal.
    fn configured(pairs: &[(&str, &str)]) -> Result<bool, String> {
        let pairs: Vec<(String, String)> = (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        layer::<tracing_subscriber::Registry>(env, "api").map(|l| l.is_some())
    }

    #[test]
    fn off_unless_configured_and_bad_settings_refused_by_name() {
        assert_eq!(configured(&[]), Ok(false));
        let refused = |pairs: &[(&str, &str)], name: &str| {
            let e = configured(pairs).unwrap_err();
            assert!(e.starts_with(&format!("{name}:")), "{e}");
        };
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        refused(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
        refused(
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://collector:4317")],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        );
        refused(
            &[endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
            "OTEL_TRACES_SAMPLER",
        );
        refused(
            &[
                endpoint,
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        );
    }
}
