//! Implementations of the ports in this crate. `script` is the `StockCache` shared by every
//! Redis-speaking backend; `embedded/` is the in-memory backend (the default for `demo`, for
//! `serve` without store URLs, for tests and for the simulated nodes). The real Redis, Kafka and
//! MySQL adapters are `seckill-stores`'.

pub mod embedded;
pub mod script;
