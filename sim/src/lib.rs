//! seckill-sim: the deterministic simulation of the seckill engine on madsim.
//!
//! Everything here is built with `--cfg madsim` for the whole dependency graph (`cargo sim`), so
//! tokio's time, tasks and randomness are the simulator's and a seed replays a run exactly. The
//! engine runs unchanged: the same services and the same `lua/` scripts as in production, over
//! ports whose faults come from the simulated world.
//!
//! Today this crate holds the smoke scenario (the purchase pipeline on the embedded ports inside
//! a madsim runtime); the simulated nodes, nemesis and runner grow here (DESIGN §9).

use seckill_engine::clock::Clock;
use seckill_engine::demo::{self, DemoConfig, DemoReport};

/// Wall-clock origin of simulated runs: fixed, so reports do not depend on when a run happened.
pub const SIM_EPOCH_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

/// Run the demo sale (the whole purchase → bus → ledger pipeline on embedded ports) on the
/// current simulated node.
pub async fn sale_on_embedded_ports(cfg: &DemoConfig) -> DemoReport {
    let clock = Clock::new(SIM_EPOCH_MS, tokio::time::Instant::now());
    demo::run(cfg, clock, || {})
        .await
        .expect("a valid demo configuration")
}
