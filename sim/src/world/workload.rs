//! The workload: who buys, in which waves, and the clients that click, poll, pay and cancel,
//! recording what they were told (the history the oracles check).

use super::{SimConfig, Target, Verdict, World, ACTIVITY};
use crate::rpc::{self, engine_addr};
use madsim::net::Endpoint;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::NodeHandle;
use rand::SeedableRng;
use seckill_core::domain::{BucketRouter, UserId};
use seckill_core::ports::{Ledger, OrderStatus, PayOutcome};
use seckill_core::service::{OrderState, PurchaseOutcome};
use seckill_invariants as inv;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The users and their clicks, shuffled. A `skew` fraction of users have ids that route to a
/// bucket drawn from a Zipf distribution over the buckets (rank k with weight 1/k: a few very hot
/// buckets, a long tail); the rest are sequential ids. Each user clicks 1..=clicks_per_user times.
pub(super) fn workload(cfg: &SimConfig) -> Vec<UserId> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread_rng().gen());
    let n = cfg.buckets;
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / k as f64).collect();
    let zipf = rand::distributions::WeightedIndex::new(&weights).expect("positive weights");
    let mut next_id = 1u64;
    let mut clicks = Vec::new();
    for _ in 0..cfg.users {
        let user = if rng.gen_bool(cfg.skew) {
            // A far id range per hot user, so the sequential ids below are never reused.
            let target = rng.sample(&zipf) as u32;
            let mut id = 1_000_000_000 + rng.gen_range(0..1_000_000_000u64);
            while BucketRouter::route(UserId(id), n).0 != target {
                id += 1;
            }
            UserId(id)
        } else {
            next_id += 1;
            UserId(next_id)
        };
        for _ in 0..rng.gen_range(1..=cfg.clicks_per_user) {
            clicks.push(user);
        }
    }
    rand::seq::SliceRandom::shuffle(clicks.as_mut_slice(), &mut rng);
    clicks
}

/// A wave of buyers: who clicks, over how long, from which client nodes.
pub(super) struct Wave {
    pub(super) name: &'static str,
    /// The clients' addresses are `{net}.1`, `{net}.2`, …
    pub(super) net: &'static str,
    pub(super) window_ms: u64,
    pub(super) clicks: Vec<UserId>,
}

impl Wave {
    /// The sale: the seed's workload over the sale's length.
    pub(super) fn first(cfg: &SimConfig) -> Self {
        Wave {
            name: "client",
            net: "10.0.3",
            window_ms: cfg.sale_ms,
            clicks: workload(cfg),
        }
    }

    /// Buyers while a recovery runner sleeps at a long fault point after another reopened the
    /// sale: a tenth as many new users (ids neither other wave draws), one click each, over half
    /// the sale's length.
    pub(super) fn stall(cfg: &SimConfig) -> Self {
        Wave {
            name: "stall-client",
            net: "10.0.7",
            window_ms: cfg.sale_ms / 2,
            clicks: (0..cfg.users / 10).map(|i| UserId(3_500_000_000 + i)).collect(),
        }
    }

    /// Buyers after a recovery: a fifth as many new users (ids the workload never draws), one
    /// click each, over half the sale's length — and every user whose order failed, trying again
    /// (a stale order the ledger refused after the rebuild left its user unmarked in Redis: the
    /// reserve succeeds, the ledger refuses the second order, and its units must go back).
    pub(super) fn late(cfg: &SimConfig, failed: impl IntoIterator<Item = UserId>) -> Self {
        let mut clicks: Vec<UserId> = (0..cfg.users / 5).map(|i| UserId(3_000_000_000 + i)).collect();
        clicks.extend(failed);
        Wave {
            name: "late-client",
            net: "10.0.6",
            window_ms: cfg.sale_ms / 2,
            clicks,
        }
    }
}

impl World {
    pub(super) fn spawn_clients(
        self: &Arc<Self>,
        wave: &Wave,
    ) -> Vec<(NodeHandle, madsim::task::JoinHandle<()>)> {
        let n = self.cfg.clients;
        self.faults.clients_start(n);
        (0..n)
            .map(|c| {
                let mine: Vec<UserId> = wave.clicks.iter().skip(c).step_by(n).copied().collect();
                let addr: SocketAddr = format!("{}.{}:7000", wave.net, c + 1)
                    .parse()
                    .expect("client address");
                let node = self
                    .handle
                    .create_node()
                    .name(format!("{}-{c}", wave.name))
                    .ip(addr.ip())
                    .build();
                let (w, window_ms, name) = (self.clone(), wave.window_ms, format!("{}-{c}", wave.name));
                let task = node.spawn(async move { w.client(name, addr, window_ms, mine).await });
                (node, task)
            })
            .collect()
    }

    /// Wait for a wave's clients (not past a violation: the run stops there).
    pub(super) async fn wait_for(&self, clients: &mut [(NodeHandle, madsim::task::JoinHandle<()>)]) {
        for (_, c) in clients {
            let _ = c.await;
            if self.violated() {
                break;
            }
        }
    }

    /// One client node: each of its clicks is a user acting at a random moment of the wave's
    /// window, concurrently with the others, against a random engine; a queued order is checked
    /// on (and mostly paid) a little later.
    pub(super) async fn client(
        self: Arc<Self>,
        name: String,
        addr: SocketAddr,
        window_ms: u64,
        clicks: Vec<UserId>,
    ) {
        let ep = Arc::new(Endpoint::bind(addr).await.expect("bind client"));
        let start = tokio::time::Instant::now();
        let users: Vec<_> = clicks
            .into_iter()
            .map(|user| {
                // A third of the clicks come in the opening burst, the rest spread over the wave.
                let window = if thread_rng().gen_bool(0.3) {
                    window_ms / 10
                } else {
                    window_ms
                };
                let at = start + Duration::from_millis(thread_rng().gen_range(0..window.max(1)));
                let engine = engine_addr(thread_rng().gen_range(0..self.cfg.engines));
                let (w, ep) = (self.clone(), ep.clone());
                madsim::task::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    if !w.violated() {
                        w.click(&ep, engine, user).await;
                    }
                })
            })
            .collect();
        for u in users {
            let _ = u.await;
        }
        self.faults.client_done();
        self.faults.event(format!("{name} done"));
    }

    /// One purchase request, held to S5: queued although sent after a pause returned and
    /// answered before the registry held a newer resume is a violation.
    pub(super) async fn purchase(
        &self,
        ep: &Endpoint,
        engine: SocketAddr,
        user: UserId,
    ) -> std::io::Result<Result<PurchaseOutcome, String>> {
        let sent = self.faults.elapsed();
        let answer = ep
            .call_timeout(engine, rpc::Purchase { user }, Duration::from_secs(1))
            .await;
        if !matches!(
            answer,
            Ok(Ok(PurchaseOutcome::Queued(_)
                | PurchaseOutcome::Duplicate
                | PurchaseOutcome::SoldOut
                | PurchaseOutcome::NotStarted
                | PurchaseOutcome::Ended))
        ) {
            self.history.lock().expect("history").unsure.insert(user);
        }
        if let Ok(Ok(PurchaseOutcome::Queued(r))) = &answer {
            // A pause is lifted once the registry holds a newer open intent (a resume's
            // registry write precedes its gates'): ground truth, whatever order concurrent
            // operator calls returned in.
            let got = self.faults.elapsed();
            let opens = self.ledger_log.opens.lock().expect("ledger log").clone();
            let held = self
                .pauses
                .lock()
                .expect("pauses")
                .iter()
                .copied()
                .find(|(paused, version)| {
                    *paused <= sent && !opens.iter().any(|(at, open)| open > version && *at <= got)
                });
            if let Some((paused, version)) = held {
                self.record(
                    vec![inv::Violation {
                        invariant: inv::Invariant::S5PauseHolds,
                        bucket: Some(r.bucket.0),
                        detail: format!(
                            "user {user} was queued ({}) for a request sent at {} ms, after the pause \
                             (version {version}) that returned at {} ms and before any resume",
                            r.id,
                            sent.as_millis(),
                            paused.as_millis()
                        ),
                    }],
                    Verdict::Safety,
                );
            }
            let mut h = self.history.lock().expect("history");
            h.queued_sent_at.insert(r.id.to_string(), sent);
        }
        if let Ok(Ok(PurchaseOutcome::Duplicate)) = &answer {
            self.duplicate_true(user).await;
        }
        answer
    }

    /// Whether a buyer still tries: a second past the end of the clicks' window.
    fn sale_lasts(&self) -> bool {
        self.faults.elapsed().as_millis() as u64 <= self.cfg.sale_ms + 1_000
    }

    /// A user's clicks: one, and one more if the order page shows the first one's order failed
    /// while the sale lasts (DESIGN §6: a failed order frees its user to buy again).
    pub(super) async fn click(&self, ep: &Endpoint, engine: SocketAddr, user: UserId) {
        if self.click_once(ep, engine, user).await == Some(OrderState::Failed) && self.sale_lasts() {
            self.faults.cover(Target::ClickedAfterFailedPage);
            self.click_once(ep, engine, user).await;
        }
    }

    /// One purchase with its retries and follow-up -> the state the order page last showed for
    /// the reservation the user was told "queued" for.
    async fn click_once(&self, ep: &Endpoint, engine: SocketAddr, user: UserId) -> Option<OrderState> {
        let mut answer = self.purchase(ep, engine, user).await;
        // A persistent buyer tries again while the sale lasts (bounded: a few tries).
        for _ in 0..self.cfg.retries_when_sold_out {
            if !matches!(
                answer,
                Ok(Ok(PurchaseOutcome::SoldOut | PurchaseOutcome::Unavailable { .. })) | Err(_)
            ) || !self.sale_lasts()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(100..300))).await;
            answer = self.purchase(ep, engine, user).await;
        }
        let label = match &answer {
            Ok(Ok(o)) => o.label(),
            Ok(Err(_)) => "refused",
            Err(_) => "no_answer",
        };
        *self
            .history
            .lock()
            .expect("history")
            .outcomes
            .entry(label.into())
            .or_insert(0) += 1;
        if let Ok(Ok(PurchaseOutcome::Unavailable { reason, .. })) = &answer {
            self.faults.event(format!("user {user}: unavailable: {reason}"));
        }
        if let Ok(Ok(PurchaseOutcome::Queued(r))) = answer {
            {
                let mut h = self.history.lock().expect("history");
                h.queued.push(r.id.to_string());
                h.queued_users.insert(r.id.to_string(), r.user);
                h.queued_at.insert(r.id.to_string(), self.faults.elapsed());
            }
            self.follow_up(ep, engine, r.user, Some(r.id)).await
        } else if let Ok(Ok(PurchaseOutcome::Duplicate)) = answer {
            // "You already have one": the user looks at the order page (and pays).
            self.follow_up(ep, engine, user, None).await;
            None
        } else {
            None
        }
    }

    /// S7 for an order page just shown to `user`: the order it names is the user's in the
    /// ledger, in the state shown or one the ledger can have moved on to since (orders are never
    /// deleted and their states only move forward, so reading the ledger after the answer is
    /// sound); a page that names no order shows "queued" or "none".
    pub(super) async fn status_true(&self, user: UserId, v: &seckill_core::service::StatusView) {
        // A live order stays live (created, paid, cancelled), so a page showing one must name
        // the user's live order now. A failed order frees its user, who may hold a live one
        // since: a page showing "failed" must name a failed order of this user.
        let held = match (v.state, v.reservation) {
            (OrderState::Failed, Some(id)) => self
                .god
                .ledger
                .order(id)
                .await
                .expect("in-process")
                .filter(|o| o.reservation.user == user),
            _ => self
                .god
                .ledger
                .order_of(ACTIVITY, user)
                .await
                .expect("in-process"),
        };
        let shown = |s: OrderState| format!("{s:?}").to_lowercase();
        let wrong = match (v.state, v.reservation, &held) {
            (OrderState::Queued | OrderState::None, None, _) => None,
            (_, None, _) | (OrderState::Queued | OrderState::None, Some(_), _) => {
                Some(format!("{} with reservation {:?}", shown(v.state), v.reservation))
            }
            (_, Some(id), None) => Some(format!(
                "{} for reservation {id}, and the ledger holds no order of this user",
                shown(v.state)
            )),
            (said, Some(id), Some(o)) => {
                let now = o.status;
                let reachable = match said {
                    OrderState::Created => {
                        matches!(
                            now,
                            OrderStatus::Created | OrderStatus::Paid | OrderStatus::Cancelled
                        )
                    }
                    OrderState::Paid => now == OrderStatus::Paid,
                    OrderState::Cancelled => now == OrderStatus::Cancelled,
                    OrderState::Failed => now == OrderStatus::Failed,
                    OrderState::Queued | OrderState::None => unreachable!("matched above"),
                };
                (o.reservation.id != id || !reachable).then(|| {
                    format!(
                        "{} for reservation {id}; the ledger's order of this user is {} ({now:?})",
                        shown(said),
                        o.reservation.id
                    )
                })
            }
        };
        if let Some(what) = wrong {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!("user {user}'s order page showed {what}"),
                }],
                Verdict::Safety,
            );
        }
    }

    /// S7 for the page of a user told "queued" for `expect`: an older failed order is not the
    /// answer while `expect` is on its way (DESIGN §6: a failed order frees its user, and the
    /// newer reservation is shown before it — "your order failed" would send the buyer away
    /// from a unit that is theirs). Read raw when the page arrives: `expect` still open in the
    /// outbox, the user marked, no other open reservation of the user and no live order in the
    /// ledger. Then the mark was there when the page was made, unless Redis lost data since it
    /// was asked for, or before with no recovery finished since (`loss_unrepaired`): a mark
    /// comes only with a reserve (its entry open until a settle, whose order is live, or a
    /// release, which takes the mark too) or with a rebuild (which marks live buyers, and
    /// deletes an open entry the ledger lacks).
    pub(super) async fn queued_before_failed(
        &self,
        user: UserId,
        expect: seckill_core::domain::ReservationId,
        v: &seckill_core::service::StatusView,
        sent: Duration,
    ) {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::{buyers_key, resv_key};
        if v.state != OrderState::Failed || v.reservation == Some(expect) {
            return;
        }
        if self.redis.loss_unrepaired(sent) {
            return;
        }
        let lost = self.redis.last_loss();
        let (rid, own) = (expect.to_string(), self.god.plan.route(user));
        let mine = format!("{user}|");
        let (open, others, marked) = self.redis.model.read(|ks| {
            let (mut open, mut others) = (false, false);
            for b in [own, self.god.plan.fallback_bucket()] {
                if let Some(Value::Hash(h)) = ks.get(resv_key(ACTIVITY, b).as_bytes()) {
                    open |= h.contains_key(rid.as_bytes());
                    others |= h
                        .iter()
                        .any(|(k, v)| k.as_slice() != rid.as_bytes() && v.starts_with(mine.as_bytes()));
                }
            }
            let marked = matches!(ks.get(buyers_key(ACTIVITY, own).as_bytes()),
                Some(Value::Set(s)) if s.contains(user.to_string().as_bytes()));
            (open, others, marked)
        });
        if !(open && marked) || others {
            return;
        }
        if !self.holds_live_order(user).await {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "user {user}'s order page (asked at {sent:?}; Redis last lost data at \
                         {lost:?}) showed failed order {} while reservation {expect}, told \
                         queued, was open in Redis and its user marked",
                        v.reservation.map_or("?".to_string(), |r| r.to_string())
                    ),
                }],
                Verdict::Safety,
            );
        }
    }

    /// The user checks the order page until the order shows, then (mostly) pays. With `expect`,
    /// only that reservation counts as this user's order -> the state the page last showed for
    /// `expect`.
    pub(super) async fn follow_up(
        &self,
        ep: &Endpoint,
        engine: SocketAddr,
        user: UserId,
        expect: Option<seckill_core::domain::ReservationId>,
    ) -> Option<OrderState> {
        // The user checks the order page a few times until the order shows up.
        let mut view = None;
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(100..400))).await;
            let sent = self.faults.elapsed();
            let status = ep
                .call_timeout(engine, rpc::Status { user }, Duration::from_secs(1))
                .await;
            if let Ok(Ok(v)) = status {
                self.status_true(user, &v).await;
                if let Some(expect) = expect {
                    self.queued_before_failed(user, expect, &v, sent).await;
                }
                if v.state != OrderState::Queued {
                    view = Some(v);
                    break;
                }
            }
        }
        // Confirmed only if the ledger's order of this user IS this reservation (after a Redis
        // loss the user may hold an order from another one).
        let view = view?;
        let id = view.reservation?;
        if expect.is_some_and(|e| e != id) {
            return None;
        }
        if !matches!(view.state, OrderState::Created | OrderState::Paid) {
            return Some(view.state);
        }
        let rid = id.to_string();
        // Some users never pay (DESIGN §9 workload).
        let paid = thread_rng().gen_bool(self.cfg.pay_ratio)
            && matches!(
                ep.call_timeout(engine, rpc::PayOrder { id }, Duration::from_secs(1))
                    .await,
                Ok(Ok(PayOutcome::Paid))
            );
        self.faults.event(format!(
            "user {} told {}",
            user,
            if paid { "paid" } else { "created" }
        ));
        self.history.lock().expect("history").confirmed.push(rid);
        Some(view.state)
    }
}
