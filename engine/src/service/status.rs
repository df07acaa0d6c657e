//! Order status for one user of one activity: the ledger's word when it has the order, else
//! "queued" while the user holds a buyer mark in Redis (reserved, on its way to the ledger). A
//! user's live order is shown before a failed one, and "queued" before a failed one too.

use crate::domain::{ReservationId, StockPlan, UserId};
use crate::ports::{Ledger, OrderStatus, PortResult, StockCache};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(not(madsim), derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    Queued,
    Created,
    Paid,
    Cancelled,
    Failed,
    None,
}

/// A user's order status, with the reservation it is about once the ledger has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusView {
    pub state: OrderState,
    pub reservation: Option<ReservationId>,
}

pub async fn order_status<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    user: UserId,
) -> PortResult<StatusView> {
    let order = ledger.order_of(plan.activity, user).await?;
    // A failed order frees its user (DESIGN §6): while the user is marked a buyer again, a
    // newer reservation is on its way to the ledger.
    let order = match order {
        Some(o) if o.status == OrderStatus::Failed && cache.holds(plan, user).await? => None,
        other => other,
    };
    if let Some(order) = order {
        let state = match order.status {
            OrderStatus::Created => OrderState::Created,
            OrderStatus::Paid => OrderState::Paid,
            OrderStatus::Cancelled => OrderState::Cancelled,
            OrderStatus::Failed => OrderState::Failed,
        };
        return Ok(StatusView {
            state,
            reservation: Some(order.reservation.id),
        });
    }
    let state = if cache.holds(plan, user).await? {
        OrderState::Queued
    } else {
        OrderState::None
    };
    Ok(StatusView {
        state,
        reservation: None,
    })
}
