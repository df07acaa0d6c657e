//! seckill-sim: the deterministic simulation of the seckill engine on madsim (DESIGN §9).
//!
//! Everything here is built with `--cfg madsim` for the whole dependency graph (`cargo sim`,
//! `cargo sim-run`), so tokio's time, tasks, network and randomness are the simulator's and a
//! seed replays a run exactly. The engine runs unchanged — the same services and the same `lua/`
//! scripts as in production — over ports whose stores are simulated nodes:
//!
//! - `stores`: the Redis node (the embedded Redis model, volatile or AOF-window persistence), the
//!   MySQL node (the embedded ledger, durable) and our own Kafka node (partitioned durable log,
//!   key hashing, group offsets that survive restarts, a dead-letter topic), each with its faults;
//! - `nodes`: engine and consumer nodes running `PurchaseService` and `OrderConsumer`;
//! - `world`: one run's phases, with the scenarios, workload, nemesis, oracles, coverage and
//!   shrinking as its modules;
//! - `faults`: knobs, counters, trace;
//! - `args`: a run's command line, which a failure's replay command round-trips through.
//!
//! In a plain build this crate is empty but for the constants below.

/// Wall-clock origin of simulated runs: fixed, so reports do not depend on when a run happened.
pub const SIM_EPOCH_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

#[cfg(madsim)]
pub mod args;
#[cfg(madsim)]
pub mod faults;
#[cfg(madsim)]
pub mod nodes;
#[cfg(madsim)]
pub mod rpc;
#[cfg(madsim)]
pub mod stores;
#[cfg(madsim)]
pub mod world;

/// Run the demo sale (the whole purchase → bus → ledger pipeline on embedded ports) on the
/// current simulated node.
#[cfg(madsim)]
pub async fn sale_on_embedded_ports(cfg: &seckill_core::demo::DemoConfig) -> seckill_core::demo::DemoReport {
    let clock = seckill_core::clock::Clock::new(SIM_EPOCH_MS, tokio::time::Instant::now());
    seckill_core::demo::run(cfg, clock, || {})
        .await
        .expect("a valid demo configuration")
}
