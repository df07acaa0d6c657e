//! Wall-clock time for the engine, derived from `tokio::time` so the simulation controls it.
//!
//! The process reads the real wall clock once (in the binary) and hands it to `Clock` with the
//! `tokio::time::Instant` it read it at; from then on time advances with that instant, which
//! madsim virtualizes. Engine code never reads a clock itself, so a seed replays the same
//! timestamps and tests can set the time they need.

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_origin_ms: u64,
    origin: Instant,
}

impl Clock {
    /// A clock that read `wall_ms` at `origin`.
    pub fn new(wall_ms: u64, origin: Instant) -> Clock {
        Clock {
            wall_at_origin_ms: wall_ms,
            origin,
        }
    }

    /// Milliseconds since the Unix epoch, as this process sees them.
    pub fn now_ms(&self) -> u64 {
        self.wall_at_origin_ms + self.origin.elapsed().as_millis() as u64
    }
}
