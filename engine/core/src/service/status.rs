//! Order status for one user of one activity: the ledger's word when it has the order, else
//! "queued" while the user holds a buyer mark in Redis (reserved, on its way to the ledger). A
//! user's live order is shown before a failed one, and "queued" before a failed one too. And one
//! reservation's status by its id, from Redis alone while it is in flight.

use crate::domain::{ReservationId, StockPlan, UserId};
use crate::ports::{Ledger, OrderStatus, PortResult, StockCache};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// One reservation of `user` by its id (the one a 202 "queued" answered): "queued" from Redis
/// while its outbox entry is open — in the user's own bucket or the fallback — so that a client
/// polling through the burst never reaches the ledger; the ledger's word once it is not (settled
/// into an order, or released). `None`: no such reservation of this user in this activity
/// (another user's is `None` too: its existence is not revealed).
pub async fn reservation_status<C: StockCache, L: Ledger>(
    cache: &C,
    ledger: &L,
    plan: &StockPlan,
    user: UserId,
    id: ReservationId,
) -> PortResult<Option<StatusView>> {
    let own = plan.route(user);
    let fallback = plan.has_fallback().then(|| plan.fallback_bucket());
    for b in std::iter::once(own).chain(fallback) {
        if let Some(r) = cache.open_reservation(plan, b, id).await? {
            return Ok((r.user == user).then_some(StatusView {
                state: OrderState::Queued,
                reservation: Some(id),
            }));
        }
    }
    let order = ledger.order(id).await?;
    Ok(order
        .filter(|o| o.reservation.user == user && o.reservation.activity == plan.activity)
        .map(|o| StatusView {
            state: state_of(o.status),
            reservation: Some(id),
        }))
}

fn state_of(status: OrderStatus) -> OrderState {
    match status {
        OrderStatus::Created => OrderState::Created,
        OrderStatus::Paid => OrderState::Paid,
        OrderStatus::Cancelled => OrderState::Cancelled,
        OrderStatus::Failed => OrderState::Failed,
    }
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
        return Ok(StatusView {
            state: state_of(order.status),
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
