//! Integration tests of seckill-engine, one binary (STYLE §13).

#[cfg(not(madsim))]
mod api;
mod conformance;
mod consumer;
mod demo;
#[cfg(not(madsim))]
mod http_sale;
mod jobs;
mod pipeline;
mod purchase;
#[cfg(not(madsim))]
mod real;
mod support;
#[cfg(not(madsim))]
mod tools;
mod topology;
