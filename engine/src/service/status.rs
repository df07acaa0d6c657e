//! Order status for one user of one activity: the ledger's word when it has the order, else
//! "queued" while the user holds a buyer mark in Redis (reserved, on its way to the ledger).

use crate::domain::{StockPlan, UserId};
use crate::ports::{Ledger, OrderStatus, PortResult, StockCache};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    Queued,
    Created,
    Paid,
    Cancelled,
    Failed,
    None,
}

pub async fn order_status<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    user: UserId,
) -> PortResult<OrderState> {
    if let Some(order) = ledger.order_of(plan.activity, user).await? {
        return Ok(match order.status {
            OrderStatus::Created => OrderState::Created,
            OrderStatus::Paid => OrderState::Paid,
            OrderStatus::Cancelled => OrderState::Cancelled,
            OrderStatus::Failed => OrderState::Failed,
        });
    }
    Ok(if cache.holds(plan, user).await? {
        OrderState::Queued
    } else {
        OrderState::None
    })
}
