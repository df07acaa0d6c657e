//! The stock plan (how an activity's units are split over buckets) and THE routing function.
//!
//! Both are pure and deterministic: every process — engine, consumer, reconciler, simulation —
//! computes the same plan and the same bucket for a user, in this version and every later one.

use super::activity::Activity;
use super::ids::{ActivityId, BucketNo, UserId};
use serde::Serialize;

/// Maps a user to one of `n` business buckets.
///
/// We mix the id before reducing it instead of taking `user % n` (the seeds' choice): real user
/// ids are rarely uniform in their low bits (ids handed out in steps, per-shard sequences, test
/// accounts in blocks), and plain modulo turns such structure into hot buckets. The mixer is the
/// SplitMix64 finalizer — fixed constants, no per-process seed (unlike std's `DefaultHasher`, which
/// is neither stable across Rust versions nor across processes) — and the reduction is Lemire's
/// multiply-shift, which is unbiased enough for n ≤ 1024 and has no division. Changing either
/// would move every buyer mark to another bucket: `routing_is_frozen` pins the outputs.
pub struct BucketRouter;

impl BucketRouter {
    pub fn route(user: UserId, buckets: u32) -> BucketNo {
        assert!(buckets >= 1, "route: at least one bucket");
        let mut z = user.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        BucketNo(((z as u128 * buckets as u128) >> 64) as u32)
    }
}

/// How an activity's total stock is split: `buckets` business buckets of (almost) equal size,
/// then one fallback bucket (index `buckets`) holding `fallback_pct` percent, rounded down.
/// The parts always sum exactly to the total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StockPlan {
    pub activity: ActivityId,
    pub total_stock: u64,
    /// Units per bucket; the last entry is the fallback bucket.
    pub units: Vec<u64>,
    /// A digest of everything above, stored in `sk:{A}:meta` so a second warmup with a different
    /// plan is refused instead of silently mixing two plans.
    pub version: String,
}

impl StockPlan {
    pub fn new(activity: &Activity) -> StockPlan {
        let spec = activity.spec();
        let fallback = spec.total_stock * spec.fallback_pct as u64 / 100;
        let business = spec.total_stock - fallback;
        let n = spec.buckets as u64;
        let mut units: Vec<u64> = (0..n)
            .map(|i| business / n + u64::from(i < business % n))
            .collect();
        units.push(fallback);
        let version = plan_digest(spec.id, &units);
        StockPlan {
            activity: spec.id,
            total_stock: spec.total_stock,
            units,
            version,
        }
    }

    /// Number of business buckets (the fallback bucket is not counted).
    pub fn buckets(&self) -> u32 {
        (self.units.len() - 1) as u32
    }

    pub fn fallback_bucket(&self) -> BucketNo {
        BucketNo(self.buckets())
    }

    /// The fallback is only tried when the plan gave it any stock.
    pub fn has_fallback(&self) -> bool {
        self.units.last().copied().unwrap_or(0) > 0
    }

    pub fn route(&self, user: UserId) -> BucketNo {
        BucketRouter::route(user, self.buckets())
    }

    /// Every bucket including the fallback.
    pub fn all_buckets(&self) -> impl Iterator<Item = BucketNo> {
        (0..self.units.len() as u32).map(BucketNo)
    }

    pub fn initial(&self, b: BucketNo) -> u64 {
        self.units.get(b.0 as usize).copied().unwrap_or(0)
    }
}

/// FNV-1a over the plan's numbers: stable, dependency-free, and only used to detect mismatch.
fn plan_digest(activity: ActivityId, units: &[u64]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for byte in x.to_le_bytes() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(activity.0);
    eat(units.len() as u64);
    units.iter().for_each(|&u| eat(u));
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ActivitySpec;

    fn activity(total: u64, buckets: u32, pct: u8) -> Activity {
        Activity::new(ActivitySpec {
            id: ActivityId(7),
            total_stock: total,
            buckets,
            fallback_pct: pct,
            per_user_limit: 1,
            start_ms: 0,
            end_ms: 1,
            pay_timeout_ms: 1,
            unit_price_minor: 0,
        })
        .unwrap()
    }

    #[test]
    fn plan_sums_exactly_and_is_balanced() {
        for (total, buckets, pct) in [
            (1000, 32, 10),
            (1, 1, 0),
            (7, 32, 50),
            (1_000_003, 1024, 3),
            (5, 3, 0),
        ] {
            let plan = StockPlan::new(&activity(total, buckets, pct));
            assert_eq!(plan.units.iter().sum::<u64>(), total);
            assert_eq!(plan.units.len(), buckets as usize + 1);
            let business = &plan.units[..buckets as usize];
            let (min, max) = (business.iter().min().unwrap(), business.iter().max().unwrap());
            assert!(max - min <= 1, "{total}/{buckets}: {min}..{max}");
            assert_eq!(plan.units[buckets as usize], total * pct as u64 / 100);
        }
        let plan = StockPlan::new(&activity(1000, 32, 10));
        assert_eq!(plan.units[0], 29);
        assert_eq!(plan.units[31], 28);
        assert_eq!(plan.units[32], 100);
        assert_eq!(plan, StockPlan::new(&activity(1000, 32, 10)));
        assert_ne!(plan.version, StockPlan::new(&activity(1000, 32, 11)).version);
    }

    #[test]
    fn routing_is_frozen() {
        // Golden values: a change here re-routes every live buyer mark. Do not update lightly.
        let got: Vec<u32> = [0u64, 1, 2, 3, 42, 1_000_000, u64::MAX]
            .iter()
            .map(|&u| BucketRouter::route(UserId(u), 32).0)
            .collect();
        assert_eq!(got, GOLDEN_32);
        assert_eq!(BucketRouter::route(UserId(12345), 1), BucketNo(0));
    }

    const GOLDEN_32: [u32; 7] = [28, 18, 18, 3, 23, 13, 28];

    #[test]
    fn routing_spreads_sequential_and_strided_ids() {
        for stride in [1u64, 2, 32, 1024] {
            let mut counts = [0u32; 32];
            for i in 0..32_000u64 {
                counts[BucketRouter::route(UserId(i * stride), 32).0 as usize] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(*min > 850 && *max < 1150, "stride {stride}: {min}..{max}");
        }
    }
}
