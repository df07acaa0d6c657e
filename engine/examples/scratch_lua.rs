// scratch: not committed
use seckill_engine::adapters::embedded::EmbeddedBackend;
use seckill_engine::conformance::activity;
use seckill_engine::domain::{ReservationId, StockPlan, UserId};
use seckill_engine::ports::{ReserveOutcome, StockCache};
fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let b = EmbeddedBackend::new();
        let plan = StockPlan::new(&activity(1, 10_000_000, 64, 10));
        b.cache.warmup(&plan).await.unwrap();
        let n = 200_000u64;
        let mut rs = Vec::with_capacity(n as usize);
        let t = std::time::Instant::now();
        for u in 1..=n {
            match b
                .cache
                .reserve(&plan, UserId(u), 1, ReservationId(u as u128), 5)
                .await
                .unwrap()
            {
                ReserveOutcome::Reserved(r) => rs.push(r),
                o => panic!("{o:?}"),
            }
        }
        let e = t.elapsed();
        println!("reserve: {:.2} us/op", e.as_secs_f64() * 1e6 / n as f64);
        let t = std::time::Instant::now();
        for r in &rs {
            b.cache.settle(r).await.unwrap();
        }
        let e = t.elapsed();
        println!("settle:  {:.2} us/op", e.as_secs_f64() * 1e6 / n as f64);
    });
}
