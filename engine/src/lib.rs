//! seckill-engine: the flash-sale funnel and its ports.
//!
//! `domain` is pure; `ports` holds the traits the stores plug into; `adapters` implements them
//! (embedded always, real stores outside the simulator); `service` is the funnel, the consumer
//! and status, generic over the ports; `conformance` is the one suite per port every
//! implementation must pass.

pub mod adapters;
#[cfg(not(madsim))]
pub mod api;
#[cfg(not(madsim))]
pub mod backend;
pub mod capacity;
pub mod clock;
pub mod conformance;
pub mod demo;
pub mod domain;
pub mod jobs;
pub mod planted;
pub mod ports;
pub mod roles;
pub mod service;

#[cfg(not(madsim))]
pub mod cli;
