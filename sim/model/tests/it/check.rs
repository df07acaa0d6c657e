//! The checker at the CI bound: 2 runners × 2 buckets (and the empty fallback bucket), a Redis
//! loss, and either a lease that runs out or the operator's pause and resume. (Both at once is
//! the nightly's bound: `seckill-model check`, some minutes.) Every property must hold in every
//! reachable state.

use seckill_model::{Bound, Recovery};
use stateright::{Checker, Model};

fn holds(bound: Bound) {
    let model = Recovery::new(bound, None);
    let properties = seckill_model::checked_properties(&model);
    let checker = model.checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done());
    println!(
        "{} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    for name in properties {
        if let Some(path) = checker.discovery(name) {
            panic!("\"{name}\" is broken:\n{path}");
        }
    }
    // The bound reaches what it is for: a recovery that finishes, a late record refused.
    for name in ["a recovery finishes", "a late record is refused as stale"] {
        assert!(
            checker.discovery(name).is_some(),
            "no state of the bound shows \"{name}\""
        );
    }
}

#[test]
fn recovery_holds_with_a_redis_loss_and_a_lease_running_out() {
    holds(Bound {
        operator: false,
        ..Bound::ci()
    });
}

#[test]
fn recovery_holds_with_a_redis_loss_and_an_operator_pausing() {
    holds(Bound {
        expiries: 0,
        ..Bound::ci()
    });
}
