//! Wall-clock time for the engine, derived from `tokio::time` so the simulation controls it.
//!
//! The process reads the real wall clock once (in the binary) and hands it to `Clock`; from then
//! on time advances with `tokio::time::Instant`, which madsim virtualizes. A seed therefore
//! replays the same timestamps, and tests can pause and advance time.

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_origin_ms: u64,
    origin: Instant,
}

impl Clock {
    /// A clock that reads `wall_ms` now. Must be called inside a runtime (madsim requires it).
    pub fn starting_at(wall_ms: u64) -> Clock {
        Clock {
            wall_at_origin_ms: wall_ms,
            origin: Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch, as this process sees them.
    pub fn now_ms(&self) -> u64 {
        self.wall_at_origin_ms + self.origin.elapsed().as_millis() as u64
    }
}
