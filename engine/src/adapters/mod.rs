//! Implementations of the ports. `script` is the `StockCache` shared by every Redis-speaking
//! backend; `embedded/` is the in-memory backend (always compiled: the default for `demo`, for
//! `serve` without store URLs, for tests and for the simulated nodes). The real Redis, Kafka
//! and MySQL adapters join here under `cfg(not(madsim))`.

pub mod embedded;
#[cfg(not(madsim))]
pub mod kafka;
#[cfg(not(madsim))]
pub mod mysql;
#[cfg(not(madsim))]
pub mod redis;
pub mod script;
