//! `lua/limit.lua` through `RedisRateLimiter` on one Redis and on a cluster: a burst is admitted
//! at once and no more, a refusal says when to come back and is right, a lease takes several
//! permits in one call, and bad arguments change nothing. (That three processes share the
//! limits: `processes::three_api_processes_share_the_user_and_global_rates`.)

use super::{redis_cluster, redis_single, unique_id};
use seckill_stores::redis::{Admission, RedisRateLimiter};
use std::time::Duration;

async fn burst_then_refused_then_back(limiter: RedisRateLimiter) {
    let key = format!("sk:rl:{{test{}}}", unique_id());
    // 4 a second, a burst of 4: four at once, the fifth refused for about a quarter second.
    for n in 0..4 {
        assert_eq!(
            limiter.acquire(&key, 4, 4, 1).await.unwrap(),
            Admission::Admitted,
            "{n}"
        );
    }
    let Admission::Refused { retry_after } = limiter.acquire(&key, 4, 4, 1).await.unwrap() else {
        panic!("the fifth of a burst of four is admitted");
    };
    assert!(
        retry_after > Duration::ZERO && retry_after <= Duration::from_millis(250),
        "{retry_after:?}"
    );
    tokio::time::sleep(retry_after + Duration::from_millis(20)).await;
    assert_eq!(
        limiter.acquire(&key, 4, 4, 1).await.unwrap(),
        Admission::Admitted,
        "came back"
    );

    // A lease of 3 on a fresh key at 4/s: admitted once, then refused until three intervals
    // passed — refused, it takes nothing.
    let key = format!("sk:rl:{{test{}}}", unique_id());
    assert_eq!(limiter.acquire(&key, 4, 4, 3).await.unwrap(), Admission::Admitted);
    let Admission::Refused { retry_after } = limiter.acquire(&key, 4, 4, 3).await.unwrap() else {
        panic!("a second lease of 3 out of a burst of 4 is admitted");
    };
    assert!(retry_after > Duration::from_millis(250), "{retry_after:?}");
    assert_eq!(
        limiter.acquire(&key, 4, 4, 1).await.unwrap(),
        Admission::Admitted,
        "the refused lease took nothing: the fourth permit is still there"
    );

    for (rate, burst, cost, says) in [(0, 4, 1, "rate"), (4, 0, 1, "burst"), (4, 4, 5, "cost")] {
        let e = limiter.acquire(&key, rate, burst, cost).await.unwrap_err();
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[tokio::test]
async fn the_shared_limit_on_one_redis() {
    let Some(cache) = redis_single().await else { return };
    burst_then_refused_then_back(RedisRateLimiter::new(cache.conn().clone())).await;
}

#[tokio::test]
async fn the_shared_limit_on_a_cluster() {
    let Some(cache) = redis_cluster().await else {
        return;
    };
    burst_then_refused_then_back(RedisRateLimiter::new(cache.conn().clone())).await;
}
