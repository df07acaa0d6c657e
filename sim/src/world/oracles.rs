//! The oracles: the god view of the stores, the continuous checker during the sale and
//! settle, and the final checks (safety, reconciliation, liveness) against the clients' history.

use super::{Target, Verdict, Violated, World, ACTIVITY, CHECK_EVERY};
use seckill_core::adapters::embedded::{EmbeddedLedger, EmbeddedRedis, RedisModel};
use seckill_core::adapters::script::ScriptedStockCache;
use seckill_core::domain::{ActivityState, BucketNo, Reservation, StockPlan, UserId};
use seckill_core::ports::{CacheView, Ledger, OrderStatus, StockCache};
use seckill_core::service::audit;
use seckill_invariants as inv;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The god view: reads the stores' state directly (not over the network), as the checker must.
pub(super) struct GodView {
    pub(super) cache: ScriptedStockCache<EmbeddedRedis>,
    pub(super) redis: Arc<RedisModel>,
    pub(super) ledger: EmbeddedLedger,
    pub(super) plan: StockPlan,
}

impl GodView {
    /// The ledger and Redis (read raw) at one instant, as the invariants see them.
    pub(super) async fn snapshot(&self) -> inv::Snapshot {
        let db = self.ledger.snapshot(ACTIVITY).await.expect("in-process");
        audit::snapshot_of(&self.raw_redis(), &db, &self.plan)
    }

    /// S6 over the gates read raw, against the registry's generation at the same instant (both
    /// in-process: nothing runs between the two reads).
    pub(super) async fn generation_fenced(&self) -> Vec<inv::Violation> {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::{gate_key, parse_gate};
        let Some(registered) = self.ledger.registry(ACTIVITY).await.expect("in-process") else {
            return Vec::new();
        };
        // A Redis back with an image older than the last recovery (a failover to a replica
        // further behind than that recovery took) holds the gates as they were before it closed
        // them, open at the generation it bumped away from. Until the detection sees the loss
        // (the meta's epoch is not the server's run id) and closes them, the API nodes refuse
        // their reservations by generation, and the ledger any that got through; S6 holds
        // again from the recovery that follows.
        let epoch = self.cache.epoch().await.expect("in-process");
        if self
            .cache
            .meta(ACTIVITY)
            .await
            .expect("in-process")
            .and_then(|m| m.epoch)
            != Some(epoch)
        {
            return Vec::new();
        }
        let gates: Vec<inv::GateState> = self.redis.read(|ks| {
            self.plan
                .all_buckets()
                .filter_map(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(s)) => {
                        let text = std::str::from_utf8(s).expect("the scripts write text");
                        let g = parse_gate(text)
                            .unwrap_or_else(|| panic!("bucket {b}: unreadable gate {text:?}"));
                        Some(inv::GateState {
                            bucket: b.0,
                            open: g.state == ActivityState::Open,
                            generation: g.generation,
                        })
                    }
                    _ => None,
                })
                .collect()
        });
        inv::s6_open_gates_current(&gates, registered.intent.generation)
    }

    /// Every bucket read raw from the Redis model's keyspace — keys and values as DESIGN §4
    /// writes them, not through the engine's `inspect.lua` (a checker that trusts the engine's
    /// own reader cannot catch that reader's bugs; and at the standard size the script's sorted
    /// copies of ten thousand buyers, forty times a simulated second, were most of a run's time).
    pub(super) fn raw_redis(&self) -> CacheView {
        self.raw_redis_of(None)
    }

    /// The ledger's order of `user` and Redis read raw for `user` alone: the buyer marks, pending
    /// marks and open reservations that name them, in every bucket — what S7 asks of one
    /// "duplicate" answer. A full look per answer made the checker quadratic: at the standard
    /// size, three quarters of a skewed run's time went to decoding every bucket for each
    /// duplicate answer.
    pub(super) async fn user_snapshot(&self, user: UserId) -> inv::Snapshot {
        let order = self.ledger.order_of(ACTIVITY, user).await.expect("in-process");
        let db = seckill_core::ports::LedgerView {
            orders: order.into_iter().collect(),
            ..Default::default()
        };
        audit::snapshot_of(&self.raw_redis_of(Some(user)), &db, &self.plan)
    }

    /// [`Self::raw_redis`], or with `only` the entries that name that user (no transfers).
    fn raw_redis_of(&self, only: Option<UserId>) -> CacheView {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::{
            buyers_key, decode_bucket, gate_key, resv_key, stock_key, xfer_key,
        };
        let only = only.map(|u| u.0.to_string());
        use std::ops::Bound::{Excluded, Unbounded};
        type Hash = BTreeMap<Vec<u8>, Vec<u8>>;
        static EMPTY: Hash = BTreeMap::new();
        fn text(b: &[u8]) -> &str {
            std::str::from_utf8(b).expect("the scripts write text")
        }
        fn pairs(h: &Hash) -> impl Iterator<Item = (&str, &str)> {
            h.iter().map(|(k, v)| (text(k), text(v)))
        }
        let buckets = self.redis.read(|ks| {
            self.plan
                .all_buckets()
                .map(|b| {
                    let get = |key: String| ks.get(key.as_bytes());
                    let stock = match get(stock_key(ACTIVITY, b)) {
                        Some(Value::Str(s)) => Some(text(s).parse().expect("stock is an integer")),
                        None => None,
                        Some(other) => panic!("bucket {b}: stock holds {other:?}"),
                    };
                    let buyers = match get(buyers_key(ACTIVITY, b)) {
                        Some(Value::Set(members)) => match &only {
                            Some(u) => members.get(u.as_bytes()).map(|m| text(m)).into_iter().collect(),
                            None => members.iter().map(|m| text(m)).collect(),
                        },
                        None => Vec::new(),
                        Some(other) => panic!("bucket {b}: buyers holds {other:?}"),
                    };
                    let hash = |key: String| match get(key) {
                        Some(Value::Hash(h)) => h,
                        None => &EMPTY,
                        Some(other) => panic!("bucket {b}: a hash holds {other:?}"),
                    };
                    let (resv, xfer): (Vec<_>, Vec<_>) = match &only {
                        None => (
                            pairs(hash(resv_key(ACTIVITY, b))).collect(),
                            pairs(hash(xfer_key(ACTIVITY, b))).collect(),
                        ),
                        // The user's pending mark by its field; their outbox entries by value
                        // (`<user>|…`) among the fields before `pending:` — reservation ids in
                        // hex, which sort before it.
                        Some(u) => {
                            let h = hash(resv_key(ACTIVITY, b));
                            let own =
                                |v: &[u8]| v.strip_prefix(u.as_bytes()).is_some_and(|r| r.starts_with(b"|"));
                            let outbox = (h.range::<[u8], _>((Unbounded, Excluded(b"pending:".as_slice()))))
                                .filter(|(_, v)| own(v));
                            let pending = h.get_key_value(format!("pending:{u}").as_bytes());
                            let resv = pending.into_iter().chain(outbox);
                            (resv.map(|(k, v)| (text(k), text(v))).collect(), Vec::new())
                        }
                    };
                    let gate = match get(gate_key(ACTIVITY, b)) {
                        Some(Value::Str(s)) => Some(text(s)),
                        None => None,
                        Some(other) => panic!("bucket {b}: gate holds {other:?}"),
                    };
                    decode_bucket(&self.plan, b, stock, buyers, resv, xfer, gate)
                        .unwrap_or_else(|e| panic!("the god view cannot read Redis: {e}"))
                })
                .collect()
        });
        CacheView { meta: None, buckets }
    }
}

impl World {
    pub(super) fn violated(&self) -> bool {
        self.violated.lock().expect("violated").is_some()
    }

    pub(super) fn record(&self, violations: Vec<inv::Violation>, verdict: Verdict) {
        if violations.is_empty() {
            return;
        }
        let mut v = self.violated.lock().expect("violated");
        if v.is_none() {
            for x in &violations {
                self.faults.event(format!("VIOLATION {x}"));
            }
            *v = Some(Violated {
                at: self.faults.elapsed(),
                violations: violations.iter().map(|x| x.to_string()).collect(),
                verdict,
            });
        }
    }

    pub(super) fn safety(&self, snap: &inv::Snapshot) -> Vec<inv::Violation> {
        let mut v = inv::check_safety(snap);
        let confirmed = self.history.lock().expect("history").confirmed.clone();
        v.extend(inv::s4_confirmed_kept(snap, &confirmed));
        if self.cfg.scenario.checks(self.cfg.jobs).s2_redis {
            v.extend(inv::s2_redis_one_reservation_per_user(snap));
            v.extend(inv::s2_redis_fallback_winners_marked(snap));
            v.extend(inv::r1_no_failed_orders(snap));
        }
        v
    }

    pub(super) async fn check_continuously(self: Arc<Self>) {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let snap = self.god.snapshot().await;
            self.record(self.safety(&snap), Verdict::Safety);
            if self.cfg.scenario.checks(self.cfg.jobs).s2_redis || self.recovered_since_loss() {
                self.record(inv::r1_units_conserved(&snap), Verdict::Safety);
            }
            self.record(self.god.generation_fenced().await, Verdict::Safety);
            self.record(self.transfers_acked(), Verdict::Safety);
            self.record(self.gates_move_forward(), Verdict::Safety);
            self.record(self.stale_orders_refused(), Verdict::Safety);
            self.record(self.commits_after_apply(), Verdict::Safety);
            self.watch_claims();
        }
    }

    /// A transfer a rebalancer reported complete is acked in its source bucket (read raw), unless
    /// Redis restarted since its pass began (the restart may have lost the ack; the recovery
    /// rebuilds the marks from the ledger's journal). The reconciler finishes a transfer left
    /// unacked, so only a look at once tells a rebalancer that skips its ack.
    pub(super) fn transfers_acked(&self) -> Vec<inv::Violation> {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::xfer_key;
        let done = self.faults.take_transfers_done();
        let restarted = *self.redis.restarted_at.lock().expect("restarted");
        done.into_iter()
            .filter(|t| restarted.is_none_or(|r| r < t.since))
            .filter(|t| {
                let key = xfer_key(ACTIVITY, BucketNo(t.from));
                let field = format!("ack:{}", t.id);
                !self.redis.model.read(|ks| match ks.get(key.as_bytes()) {
                    Some(Value::Hash(h)) => h.contains_key(field.as_bytes()),
                    _ => false,
                })
            })
            .map(|t| inv::Violation {
                invariant: inv::Invariant::R1Reconciled,
                bucket: Some(t.from),
                detail: format!(
                    "transfer {} reported complete by its rebalancer but not acked in Redis",
                    t.id
                ),
            })
            .collect()
    }

    /// S5's ground ([`inv::s5_intents_move_forward`]) over the gates' intent versions read raw,
    /// against those of the last look since Redis last restarted.
    pub(super) fn gates_move_forward(&self) -> Vec<inv::Violation> {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::gate_key;
        let restarted = *self.redis.restarted_at.lock().expect("restarted");
        let now: BTreeMap<u32, u64> = self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .filter_map(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(v)) => String::from_utf8_lossy(v)
                        .split('|')
                        .nth(2)
                        .and_then(|v| v.parse().ok())
                        .map(|v| (b.0, v)),
                    _ => None,
                })
                .collect()
        });
        let mut seen = self.gate_versions.lock().expect("gate versions");
        if seen.0 != restarted {
            *seen = (restarted, BTreeMap::new());
        }
        let out = inv::s5_intents_move_forward(&seen.1, &now);
        seen.1.extend(now);
        out
    }

    /// A recovery runs for a cause: a claim Redis granted while it held the whole activity (and
    /// took over no other claim) finds nothing to do when it looks again under its claim, and
    /// finishes without bumping the generation (or closing a gate) — unless Redis lost something
    /// after it claimed. Two runners that waited on each other's claims would otherwise recover
    /// in turn, each closing the sale again for nothing, and report a cause that no longer held.
    pub(super) fn recoveries_have_a_cause(&self) -> Vec<inv::Violation> {
        let claims = self.redis.claims.lock().expect("claims").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        let lost_after = |at: Duration| self.redis.last_loss().is_some_and(|loss| loss >= at);
        bumps
            .iter()
            .filter_map(|bump| {
                let holder = claims.iter().rev().find(|c| c.at <= *bump)?;
                (holder.on_whole && !lost_after(holder.at)).then(|| inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "claim {} was granted at {:?} on a Redis holding the whole activity (no \
                         other claim, the epoch this run's, every key there), and the generation \
                         was bumped at {bump:?} under it: a recovery with nothing to recover",
                        holder.fence, holder.at
                    ),
                })
            })
            .collect()
    }

    /// A recovery's finish is answered true: "finished" only to the runner whose own finish
    /// ended its claim (this one, or its first run when a re-sent finish meets it again), and
    /// "lost" only where it did not, or where another claim or a loss of Redis came since. A
    /// runner told "finished" reports a recovery done — to the operator who asked for it, too
    /// — while a successor holds the claim; one told "lost" reports a recovery that finished
    /// as taken over.
    pub(super) fn finishes_answer_true(&self) -> Vec<inv::Violation> {
        let finishes = self.redis.finishes.lock().expect("finishes").clone();
        let claims = self.redis.claims.lock().expect("claims").clone();
        let last_loss = self.redis.last_loss();
        let mut out = Vec::new();
        for (i, e) in finishes.iter().enumerate() {
            let own =
                |f: &crate::stores::FinishSeen| f.fence == e.fence && f.held.as_deref() == Some(&*f.fence);
            let ended = finishes[..=i].iter().rev().find(|f| own(f)).map(|f| f.at);
            if !e.finished && e.held.is_some() {
                self.faults.cover(Target::FinishAfterTakeoverLost);
            }
            let lie = match (e.finished, ended) {
                (true, None) => Some("finished, though no finish of its own ended its claim"),
                (false, Some(at)) => {
                    let moved_on = claims.iter().any(|c| c.at >= at && c.at <= e.at)
                        || last_loss.is_some_and(|l| l >= at);
                    (!moved_on)
                        .then_some("lost, though its own finish had ended its claim and nothing came since")
                }
                _ => None,
            };
            if let Some(lie) = lie {
                out.push(inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "Redis answered claim {}'s finish at {:?} (holding {:?}): {lie}",
                        e.fence, e.at, e.held
                    ),
                });
            }
        }
        out
    }

    /// S6 at the close: a recovery closes a gate only at its own generation or a newer one — a
    /// runner whose claim read the registry before another recovery bumped it and reopened the
    /// gate (it slept between its claim and its close) must not halt the sale again, and would
    /// fence the gate with a claim a successor has already taken over.
    pub(super) fn closes_not_stale(&self) -> Vec<inv::Violation> {
        (self.redis.stale_closes.lock().expect("stale closes").iter())
            .map(|(at, fence, gate)| inv::Violation {
                invariant: inv::Invariant::S6GenerationFenced,
                bucket: None,
                detail: format!("at {at:?} claim {fence} closed gate {gate}, reopened at a newer generation than the claim's"),
            })
            .collect()
    }

    /// DESIGN §5 on the bus: the worker group commits an offset only after a ledger transaction
    /// that carried its record committed (or after the record went to the dead letters). A
    /// record committed unapplied is skipped for good: no worker reads it again, and only the
    /// reconciler's republish of a reservation left open would resolve its buyer's "queued" —
    /// the look at each commit sees what that slower path hides.
    pub(super) fn commits_after_apply(&self) -> Vec<inv::Violation> {
        let commits = std::mem::take(&mut *self.kafka.commits.lock().expect("kafka"));
        let applied = self.ledger_log.applied.lock().expect("ledger log");
        let mut out = Vec::new();
        for (at, partition, offsets) in commits {
            for offset in offsets {
                let unapplied = match self.kafka.record(partition, offset) {
                    Some((_, true)) => None,
                    Some((payload, false)) => match Reservation::decode(&payload) {
                        Ok(r) => applied
                            .get(&r.id)
                            .is_none_or(|when| *when > at)
                            .then(|| format!("reservation {}", r.id)),
                        Err(e) => Some(format!("a record that does not decode ({e}), not dead-lettered")),
                    },
                    None => Some("a record past the partition's end".to_string()),
                };
                if let Some(what) = unapplied {
                    out.push(inv::Violation {
                        invariant: inv::Invariant::L1QueuedResolved,
                        bucket: None,
                        detail: format!(
                            "the workers committed partition {partition} offset {offset} ({what}) at {at:?}, \
                             before any ledger transaction carried it"
                        ),
                    });
                }
            }
        }
        out
    }

    /// S6 at the ledger: no order is created from a reservation of an older generation than the
    /// registry's (the ledger's front compares each batch with the registry as it arrives). A
    /// recovery's later snapshot takes such an order in, so the stores may agree again after;
    /// only the look at the apply sees it.
    pub(super) fn stale_orders_refused(&self) -> Vec<inv::Violation> {
        let taken = std::mem::take(&mut *self.ledger_log.accepted_stale.lock().expect("ledger log"));
        taken
            .into_iter()
            .map(|(id, generation, current)| inv::Violation {
                invariant: inv::Invariant::S6GenerationFenced,
                bucket: None,
                detail: format!(
                    "the ledger created order {id}, reserved under generation {generation}, while the registry was at {current}"
                ),
            })
            .collect()
    }

    /// The recovery claim the meta holds now (read raw).
    pub(super) fn raw_claim(&self) -> Option<String> {
        crate::stores::meta_claim(
            &self.redis.model,
            &seckill_core::adapters::script::meta_key(ACTIVITY),
        )
    }

    /// Every bucket has a stock key (read raw).
    /// Redis holds the whole activity and no recovery is under way (read raw): the meta with
    /// its epoch and no claim, every stock key, every gate and none of them recovering.
    pub(super) fn healthy(&self) -> bool {
        use seckill_core::adapters::embedded::Value;
        use seckill_core::adapters::script::{gate_key, meta_key};
        let meta_ok = self
            .redis
            .model
            .read(|ks| match ks.get(meta_key(ACTIVITY).as_bytes()) {
                Some(Value::Hash(h)) => {
                    h.contains_key(b"epoch".as_slice()) && !h.contains_key(b"claim".as_slice())
                }
                _ => false,
            });
        let gates_ok = self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .all(|b| match ks.get(gate_key(ACTIVITY, b).as_bytes()) {
                    Some(Value::Str(g)) => !g.starts_with(b"recovering"),
                    _ => false,
                })
        });
        meta_ok && gates_ok && self.stock_keys_present()
    }

    pub(super) fn stock_keys_present(&self) -> bool {
        use seckill_core::adapters::script::stock_key;
        self.redis.model.read(|ks| {
            self.god
                .plan
                .all_buckets()
                .all(|b| ks.get(stock_key(ACTIVITY, b).as_bytes()).is_some())
        })
    }

    /// Redis holds the ledger's image again since its last loss (a restart or a deleted key):
    /// a recovery claimed after the loss (the checker saw its claim appear) and finished, and
    /// the activity is healthy (read raw). From then on until the next loss every step keeps
    /// the units, as where Redis loses nothing. A claim the checker did not see, or one that
    /// outlived a loss, waits for the next one: the look is skipped, never misjudged.
    pub(super) fn recovered_since_loss(&self) -> bool {
        let Some(loss) = self.redis.last_loss() else {
            return true;
        };
        let claimed_after = self
            .claims
            .lock()
            .expect("claims")
            .last()
            .is_some_and(|(at, _)| *at > loss);
        claimed_after && self.healthy()
    }

    /// Note a recovery claim the first time the meta shows it.
    pub(super) fn watch_claims(&self) {
        let Some(claim) = self.raw_claim() else { return };
        let mut claims = self.claims.lock().expect("claims");
        if claims.last().is_none_or(|(_, c)| *c != claim) {
            claims.push((self.faults.elapsed(), claim));
        }
    }

    /// L1 for orders the ledger refused for an older generation: only a zombie's — a publish
    /// acknowledged after the recovery that bumped the generation claimed the activity (before
    /// the claim, the recovery waits the publish out and drains it). A client told "queued"
    /// before that claim whose order was refused lost its unit to a recovery that did not wait.
    /// And a request sent after the last bump before the refusal was reserved under the current
    /// generation (the gates stay closed from the claim until a reopen writes it: S6), so its
    /// refusal means it was stamped with another generation than its gate's.
    ///
    /// Excused: a record a slow follower held back past the recovery's drain whose reservation
    /// Redis lost before the rescue could see it — a data loss of both stores, as a record lost
    /// after its ack with its reservation is. One Redis still held is rescued into the ledger, and
    /// its late record is a redelivery.
    pub(super) fn l1_no_early_stale_orders(&self) -> Vec<inv::Violation> {
        let stale = self.ledger_log.stale.lock().expect("ledger log").clone();
        let bumps = self.ledger_log.bumps.lock().expect("ledger log").clone();
        let claims = self.claims.lock().expect("claims").clone();
        let visible_late = self.kafka.visible_late.lock().expect("kafka").clone();
        let lost = self.redis.lost_outbox.lock().expect("lost outbox").clone();
        let lost_on_bus = self.kafka.lost_after_ack.lock().expect("kafka").clone();
        let history = self.history.lock().expect("history");
        let mut out = Vec::new();
        for (refused_at, rid) in stale {
            let Some(queued_at) = history.queued_at.get(&rid.to_string()).copied() else {
                continue; // nobody was told "queued" for it
            };
            // Redis lost its outbox entry, and its record reached the ledger only after the
            // drain (visible late) or not at all (lost after its ack, leaving a rescue's apply
            // the network held back as its one copy): nothing was left for the recovery to
            // wait for.
            let id = rid.to_string();
            if lost.contains_key(&id) && (visible_late.contains_key(&id) || lost_on_bus.contains(&id)) {
                continue;
            }
            let Some(bump) = bumps.iter().rev().find(|b| **b <= refused_at) else {
                continue;
            };
            if let Some(sent) = history.queued_sent_at.get(&rid.to_string()).filter(|s| *s > bump) {
                out.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "reservation {rid} was requested at {} ms, after the generation bump at {} ms, \
                         yet refused for its generation at {} ms: it was stamped with an older one",
                        sent.as_millis(),
                        bump.as_millis(),
                        refused_at.as_millis()
                    ),
                });
                continue;
            }
            let Some((claimed, fence)) = claims.iter().rev().find(|(c, _)| c <= bump) else {
                continue;
            };
            if queued_at + CHECK_EVERY < *claimed {
                out.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "reservation {rid} was queued at {} ms, before claim {fence} (seen at {} ms), \
                         yet refused for its generation at {} ms: the recovery did not wait for it",
                        queued_at.as_millis(),
                        claimed.as_millis(),
                        refused_at.as_millis()
                    ),
                });
            }
        }
        out
    }

    /// L1 from ground truth: every reservation a client was told is "queued" is an order in the
    /// ledger (any status), unless its user holds another order (a duplicate buyer's unit went
    /// back) or a Redis restart lost it from the outbox after the client was told, or a restart
    /// lost it and the broker lost its record after the ack (counted as they happen: the exact
    /// account, nothing else is excused). A reservation that silently
    /// vanished — deleted by a rebuild, released without the user told — is a violation.
    pub(super) async fn l1_exact_account(&self, queued: &[String]) -> Vec<inv::Violation> {
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        let in_ledger: std::collections::BTreeSet<String> =
            db.orders.iter().map(|o| o.reservation.id.to_string()).collect();
        let buyers: std::collections::BTreeSet<UserId> =
            db.orders.iter().map(|o| o.reservation.user).collect();
        let lost = self.redis.lost_outbox.lock().expect("lost outbox").clone();
        let (users, queued_at) = {
            let h = self.history.lock().expect("history");
            (h.queued_users.clone(), h.queued_at.clone())
        };
        let dropped = self.kafka.lost_after_ack.lock().expect("kafka").clone();
        let adopted = self.redis.adopted_at.lock().expect("adopted").clone();
        // Lost by a Redis restart after the client heard "queued" (or after Redis confirmed it
        // held the reservation, the answer then on its way), or lost by Redis and by the broker
        // after its ack: data loss. Gone from Redis before the answer with no such confirmation
        // and no record lost: the answer promised what no longer existed.
        let excused = |rid: &String| {
            lost.get(rid).is_some_and(|lost_at| {
                dropped.contains(rid)
                    || queued_at.get(rid).is_some_and(|q| q <= lost_at)
                    || adopted.get(rid).is_some_and(|a| a <= lost_at)
            })
        };
        queued
            .iter()
            .filter(|rid| !in_ledger.contains(*rid) && !excused(rid))
            .filter(|rid| users.get(*rid).is_none_or(|u| !buyers.contains(u)))
            .map(|rid| {
                let told = queued_at
                    .get(rid)
                    .map_or("?".to_string(), |t| format!("{:.3} s", t.as_secs_f64()));
                let lost = match lost.get(rid) {
                    Some(at) => format!(
                        "a Redis restart lost it at {:.3} s, before the answer",
                        at.as_secs_f64()
                    ),
                    None => "no Redis restart lost it".to_string(),
                };
                inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!(
                        "queued reservation {rid} (told at {told}) never became an order, and {lost}"
                    ),
                }
            })
            .collect()
    }

    /// While Redis loses nothing, its buyer marks and stock are the truth the ledger only
    /// confirms: a consumer batch in which the ledger refused a reservation because its user
    /// already held an order, or because the bucket had no unit left, means Redis let a user
    /// reserve twice (S2) or sold a unit it did not have (S1) — even if the refusal's follow-up
    /// put everything right again.
    pub(super) fn refusals_without_loss(&self) -> Vec<inv::Violation> {
        let seen = self.faults.coverage();
        [
            (
                "duplicate_buyer_refused",
                inv::Invariant::S2OneOrderPerUser,
                "user already held an order",
            ),
            (
                "out_of_stock_refused",
                inv::Invariant::S1NoOversell,
                "bucket had no unit left",
            ),
        ]
        .into_iter()
        .filter_map(|(what, invariant, why)| {
            seen.get(what).map(|batches| inv::Violation {
                invariant,
                bucket: None,
                detail: format!(
                    "in {batches} consumer batches the ledger refused a reservation because its {why}, \
                     although Redis lost nothing"
                ),
            })
        })
        .collect()
    }

    /// S7 for the purchase answers: every order the ledger holds was announced to its user — told
    /// "queued", or hidden behind an answer that did not know (no answer, "unavailable"). An order
    /// of a user whose every answer was definite ("duplicate", "sold out") came from a reserve
    /// the user was told had not happened: a re-sent script that answered its own first run
    /// "duplicate", say.
    pub(super) fn orders_announced(&self, db: &seckill_core::ports::LedgerView) -> Vec<inv::Violation> {
        let h = self.history.lock().expect("history");
        let queued: BTreeSet<&String> = h.queued.iter().collect();
        db.orders
            .iter()
            .filter(|o| !queued.contains(&o.reservation.id.to_string()) && !h.unsure.contains(&o.reservation.user))
            .map(|o| inv::Violation {
                invariant: inv::Invariant::S7AnswersTrue,
                bucket: Some(o.reservation.bucket.0),
                detail: format!(
                    "user {} holds order {} ({:?}), yet no answer it got said \"queued\" for it or left its outcome open",
                    o.reservation.user, o.reservation.id, o.status
                ),
            })
            .collect()
    }

    /// Whether the ledger holds an order of `user` that did not fail.
    pub(super) async fn holds_live_order(&self, user: UserId) -> bool {
        (self.god.ledger.order_of(ACTIVITY, user).await)
            .expect("in-process")
            .is_some_and(|o| o.status != OrderStatus::Failed)
    }

    /// S7 for a "duplicate" answer ([`inv::s7_duplicate_true`]), at the instant the answer
    /// arrives. Every way a mark goes or stays moves it with the entry in one script (a reserve
    /// writes both; a settle leaves a live order; a release takes both, or keeps the mark of a
    /// user holding another order; a rebuild marks live buyers only) — until Redis loses data: a
    /// lost key takes the entries and keeps the marks, and a restart keeps what it kept of
    /// operations made of more than one script (a release on the bucket the unit came from, then
    /// on the user's own). Redis-loss seeds 131067414 and 131067458 showed a user marked with no
    /// order and nothing open 35 ms after a restart (not traced further). So the check holds
    /// where no loss is left unrepaired (`RedisStore::loss_unrepaired`): with no loss, or after a
    /// recovery finished since.
    pub(super) async fn duplicate_true(&self, user: UserId) {
        // Most users told "duplicate" hold a live order: one ledger lookup settles it, before a
        // look at everything.
        if self.redis.loss_unrepaired(self.faults.elapsed()) || self.holds_live_order(user).await {
            return;
        }
        let snap = self.god.user_snapshot(user).await;
        self.record(inv::s7_duplicate_true(&snap, user.0), Verdict::Safety);
    }

    /// R1, bounded failures ([`inv::r1_failed_orders_bounded`]): the orders that failed for want
    /// of a unit (counted as the ledger refused them) against what Redis's restarts gave each
    /// bucket (counted as they happened) and the released reservations they revived that the
    /// ledger never took (a settled one revived is a redelivery: it cannot fail).
    pub(super) fn failed_orders_bounded(&self, db: &seckill_core::ports::LedgerView) -> Vec<inv::Violation> {
        use seckill_core::adapters::script::{resv_key, stock_key};
        let failed = self.ledger_log.out_of_stock.lock().expect("ledger log").clone();
        let overstated = self.redis.overstated.lock().expect("overstated").clone();
        let lost = self.redis.lost_reserves.lock().expect("lost reserves").clone();
        let revived_rids = self.redis.revived.lock().expect("revived").clone();
        let bucket_of: BTreeMap<String, u32> = (self.god.plan.all_buckets())
            .flat_map(|b| [(stock_key(ACTIVITY, b), b.0), (resv_key(ACTIVITY, b), b.0)])
            .collect();
        let per_bucket = |key: &String| bucket_of.get(key).copied();
        let restored: BTreeMap<u32, u64> = (overstated.iter())
            .filter_map(|(key, units)| Some((per_bucket(key)?, *units)))
            .collect();
        let mut sold_twice: BTreeMap<u32, u64> = BTreeMap::new();
        for o in db.orders.iter().filter(|o| o.status != OrderStatus::Failed) {
            if let Some(b) = lost.get(&o.reservation.id.to_string()).and_then(per_bucket) {
                *sold_twice.entry(b).or_default() += u64::from(o.reservation.qty);
            }
        }
        let taken: BTreeSet<String> = (db.orders.iter())
            .filter(|o| o.status != OrderStatus::Failed)
            .map(|o| o.reservation.id.to_string())
            .collect();
        let mut revived: BTreeMap<u32, u64> = BTreeMap::new();
        for (_, key) in revived_rids.iter().filter(|(rid, _)| !taken.contains(*rid)) {
            if let Some(b) = per_bucket(key) {
                *revived.entry(b).or_default() += 1;
            }
        }
        inv::r1_failed_orders_bounded(&failed, &restored, &sold_twice, &revived)
    }

    pub(super) async fn final_checks(&self, drained: bool) {
        let snap = self.god.snapshot().await;
        let db = self.god.ledger.snapshot(ACTIVITY).await.expect("in-process");
        self.record(self.safety(&snap), Verdict::Safety);
        self.record(self.failed_orders_bounded(&db), Verdict::Safety);
        self.record(self.orders_announced(&db), Verdict::Safety);
        self.record(self.god.generation_fenced().await, Verdict::Safety);
        self.record(self.stale_orders_refused(), Verdict::Safety);
        self.record(self.commits_after_apply(), Verdict::Safety);
        self.record(self.recoveries_have_a_cause(), Verdict::Safety);
        self.record(self.finishes_answer_true(), Verdict::Safety);
        self.record(self.closes_not_stale(), Verdict::Safety);
        self.cover_late_records(&db);
        let checks = self.cfg.scenario.checks(self.cfg.jobs);
        let mut live = Vec::new();
        if checks.r1 {
            live.extend(inv::r1_reconciled(&snap));
        }
        if checks.s2_redis {
            self.record(self.refusals_without_loss(), Verdict::Safety);
        }
        if checks.l2 {
            live.extend(inv::l2_bounded_undersell(&snap));
        }
        if checks.l1 {
            let queued = self.history.lock().expect("history").queued.clone();
            live.extend(inv::l1_queued_resolved(&snap, &queued));
            live.extend(self.l1_exact_account(&queued).await);
            live.extend(self.l1_no_early_stale_orders());
            live.extend(inv::l1_nothing_open(&snap));
            if drained {
                live.extend(inv::l3_no_lockout(&snap));
                live.extend(inv::r2_buyers_marked(&snap));
            }
            if !drained {
                live.push(inv::Violation {
                    invariant: inv::Invariant::L1QueuedResolved,
                    bucket: None,
                    detail: format!("never quiescent: {}", self.unsettled().await),
                });
            }
        }
        self.record(live, Verdict::Liveness);
    }
}
