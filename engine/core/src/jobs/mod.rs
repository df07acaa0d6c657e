//! The self-healing jobs (DESIGN §7), generic over the ports so they run on every backend:
//! the reconciler (settle what the ledger holds, republish what it lacks, resolve stale pending
//! marks, give back cancelled units, report differences it cannot explain), the payment
//! timeout, the rebalancer, and recovery after Redis lost data.

pub mod pay_timeout;
pub mod rebalance;
pub mod reconcile;
pub mod recover;

pub use pay_timeout::{cancel_unpaid, PayTimeoutReport};
pub use rebalance::{rebalance, RebalanceConfig};
pub use reconcile::{reconcile, Difference, ReconcileConfig, ReconcileReport};
pub use recover::{
    needs_recovery, new_fence, recover, recover_if_needed, Busy, Recovery, RecoveryConfig, RecoveryReport,
};
