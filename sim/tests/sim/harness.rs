//! The harness's own promises: a scenario's workload is its own at every size, and the replay
//! command printed on a failure parses back into exactly the configuration that failed.

use seckill_core::planted::Bug;
use seckill_sim::args::parse_replay;
use seckill_sim::world::{Scenario, SimConfig, Size};

const ALL: [Scenario; 8] = [
    Scenario::Calm,
    Scenario::ConsumerFaults,
    Scenario::ProducerFaults,
    Scenario::RedisLoss,
    Scenario::Chaos,
    Scenario::LostRecords,
    Scenario::Rebalancing,
    Scenario::Skewed,
];

#[test]
fn a_scenarios_workload_is_the_same_at_every_size() {
    for scenario in ALL {
        let (small, standard) = (SimConfig::small(1, scenario), SimConfig::standard(1, scenario));
        let workload = |c: &SimConfig| {
            (
                c.skew.to_bits(),
                c.pay_ratio.to_bits(),
                c.retries_when_sold_out,
                c.clicks_per_user,
                c.fallback_pct,
                c.pay_timeout_ms,
            )
        };
        assert_eq!(workload(&small), workload(&standard), "{scenario:?}");
        assert_eq!(
            (standard.users, standard.stock, standard.buckets),
            (10_000, 1_000, 16)
        );
    }
    let skewed = SimConfig::standard(1, Scenario::Skewed);
    assert_eq!(
        (skewed.skew, skewed.pay_ratio, skewed.retries_when_sold_out),
        (0.9, 1.0, 16)
    );
}

#[test]
fn the_replay_command_reproduces_the_configuration() {
    let mut cases = Vec::new();
    for scenario in ALL {
        for size in [Size::Small, Size::Standard] {
            cases.push(SimConfig::new(70_063, scenario, size));
        }
    }
    cases.push(SimConfig {
        planted: Some(Bug::NonIdempotentGive),
        jobs: false,
        ..SimConfig::standard(3, Scenario::Rebalancing)
    });
    cases.push(SimConfig {
        users: 600,
        stock: 240,
        buckets: 6,
        sale_ms: 800,
        ..SimConfig::standard(50_446, Scenario::Chaos)
    });
    for cfg in cases {
        let cmd = cfg.replay_command();
        assert_eq!(parse_replay(&cmd).as_ref(), Ok(&cfg), "{cmd}");
    }
}
