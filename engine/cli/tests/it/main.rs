//! Integration tests of the engine's crates and the `seckill` binary, one test binary (STYLE §13).

mod admin;
mod api;
mod conformance;
mod consumer;
mod demo;
mod http_sale;
mod jobs;
mod pipeline;
mod purchase;
mod real;
mod support;
// The measuring commands' tests need them built (the default).
#[cfg(feature = "tools")]
mod tools;
mod topology;
