//! The engine's use cases, generic over the ports so the same code runs on the embedded, real
//! and simulated backends: the purchase funnel, the order consumer, order status, and the
//! invariants snapshot used by audits.

pub mod admin;
pub mod audit;
pub mod consumer;
pub mod purchase;
pub mod status;

pub use consumer::{BatchReport, OrderConsumer};
pub use purchase::{PurchaseConfig, PurchaseError, PurchaseOutcome, PurchaseService, Unserved};
pub use status::{order_status, reservation_status, OrderState, StatusView};
