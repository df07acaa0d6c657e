//! seckill-core: the flash-sale funnel and its ports.
//!
//! `domain` is pure; `ports` holds the traits the stores plug into; `adapters` implements them
//! in memory (`embedded`) and over any Redis-speaking connection (`script`); `service` is the
//! funnel, the consumer and status, generic over the ports; `jobs` the reconciler, the payment
//! timeout, the rebalancer and the fenced recovery; `roles` composes them into the three
//! processes, for the binary and the simulation alike. The real stores' adapters live in
//! `seckill-stores`, the HTTP API in `seckill-api`, one conformance suite per port in
//! `seckill-testkit`.

pub mod adapters;
pub mod clock;
pub mod demo;
pub mod domain;
pub mod jobs;
pub mod planted;
pub mod ports;
pub mod roles;
pub mod service;
pub mod trace;
