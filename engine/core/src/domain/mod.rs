//! The pure core: ids, the activity and its validation, the stock plan, THE routing function,
//! reservations and their wire form. No tokio, no I/O — everything here is a plain function of
//! its inputs, so Redis, the ledger, the simulation and the tests all agree on it.

mod activity;
mod ids;
mod plan;
mod reservation;

pub use activity::{Activity, ActivitySpec, ActivityState, InvalidField};
pub use ids::{ActivityId, BucketNo, ReservationId, UserId};
pub use plan::{BucketRouter, StockPlan};
pub use reservation::{DecodeError, Reservation, ORDER_EVENT_VERSION};
