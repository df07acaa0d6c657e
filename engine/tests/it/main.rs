//! Integration tests of seckill-engine, one binary (STYLE §13).

mod conformance;
mod consumer;
mod demo;
mod jobs;
mod pipeline;
mod purchase;
#[cfg(not(madsim))]
mod real;
mod support;
