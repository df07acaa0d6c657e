//! What one script costs on the embedded Redis model, in process, on one thread: `reserve.lua`
//! (own bucket, stock available) and `settle.lua`, through `ScriptedStockCache` exactly as the
//! engine calls them. The embedded backend runs the HTTP purchase path on this model, so these
//! figures bound it (BENCHMARKS.md, HTTP).
//!
//! `cargo run --release --example embedded_scripts [-- N]` (N purchases, default 200000).

use seckill_core::adapters::embedded::EmbeddedBackend;
use seckill_core::domain::{ReservationId, StockPlan, UserId};
use seckill_core::ports::{ReserveOutcome, StockCache};
use seckill_testkit::activity;
use tokio::time::Instant;

fn main() -> Result<(), String> {
    let n: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("N: not a count: {a:?}"))?,
        None => 200_000,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let backend = EmbeddedBackend::new();
        let plan = StockPlan::new(&activity(1, n * 10, 64, 10));
        backend
            .cache
            .warmup(
                &plan,
                &seckill_core::ports::Intent::FIRST,
                seckill_core::ports::WarmFrom::Plan,
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut reserved = Vec::with_capacity(n as usize);
        let started = Instant::now();
        for u in 1..=n {
            match backend
                .cache
                .reserve(&plan, UserId(u), 1, ReservationId(u.into()), 1)
                .await
            {
                Ok(ReserveOutcome::Reserved(r)) => reserved.push(r),
                other => return Err(format!("user {u}: {other:?}")),
            }
        }
        let per_reserve = started.elapsed().as_secs_f64() * 1e6 / n as f64;
        let started = Instant::now();
        for r in &reserved {
            backend.cache.settle(r).await.map_err(|e| e.to_string())?;
        }
        let per_settle = started.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!(
            "embedded model, {n} purchases: reserve.lua {per_reserve:.2} µs, settle.lua {per_settle:.2} µs"
        );
        Ok(())
    })
}
