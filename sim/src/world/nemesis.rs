//! The nemesis: draws faults from the scenario's catalogue (or replays a schedule), injects
//! them, aims buyers and restarts at the engine's long fault points, and heals at the end.

use super::fault::{delay, delivered_late, lose_after_ack, prob, redis_resend, visible_late};
use super::workload::Wave;
use super::{Fault, Scenario, Scheduled, Target, World, ACTIVITY, CHECK_EVERY, RECOVERY_LONG_SITES};
use crate::faults::Fired;
use crate::stores::Persistence;
use madsim::net::NetSim;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::NodeHandle;
use rand::SeedableRng;
use seckill_core::domain::BucketNo;
use seckill_core::planted::{self, Site};
use std::sync::Arc;
use std::time::Duration;

impl World {
    /// A rebalancer stalled long between its take and its ledger step (the long fault point at
    /// `Site::RebalanceTake`), or between its look at the gates and its take
    /// (`Site::RebalanceLook`): where the scenario restarts Redis, Redis restarts under it, so
    /// that a recovery rebuilds the buckets — the take undone, if Redis lost it or not — before it
    /// wakes up and goes on with a transfer of the old generation. A recovery runner stalled long (any other
    /// site): once another runner has recovered and reopened the sale while it sleeps, a wave of new
    /// buyers sells there, so that what the sleeper writes when it wakes (a bump, a rebuild from its
    /// old snapshot, a reopen, a finish) meets buckets that sold since — the sales the fences exist
    /// for. Without it the sale was over before any successor reopened.
    pub(super) fn aim_at_long_stalls(self: &Arc<Self>) {
        let (wave_tx, mut wave_rx) = tokio::sync::mpsc::unbounded_channel();
        let w = self.clone();
        tokio::spawn(async move {
            // One wave per run: a second runner asleep (the successor of the first) gets none.
            let mut waved = false;
            while wave_rx.recv().await.is_some() {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while !waved && planted::stalled() > 0 && tokio::time::Instant::now() < deadline {
                    if w.healthy() {
                        w.faults
                            .event("aimed: buyers while a recovery runner sleeps past its lease".into());
                        let mut clients = w.spawn_clients(&Wave::stall(&w.cfg));
                        w.wait_for(&mut clients).await;
                        *w.stall_wave.lock().expect("stall wave") = clients;
                        waved = true;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                w.stall_wave_pending
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
        });

        let restarts: Vec<Fault> = (self.cfg.scenario.faults().iter().copied())
            .filter(|f| {
                matches!(
                    f,
                    Fault::RedisRestartVolatile | Fault::RedisRestartAof | Fault::RedisFailover
                )
            })
            .collect();
        // The stall fires inside the jobs node (whose crash would take a task spawned there
        // with it): the world's own task injects.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let f = self.faults.clone();
        let pending = self.clone();
        planted::on_long_stall(move |site| {
            f.fired(Fired::LongStall(site));
            if matches!(site, Site::RebalanceTake | Site::RebalanceLook) {
                let _ = tx.send(site);
            } else if !pending
                .stall_wave_pending
                .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let _ = wave_tx.send(());
            }
        });
        if restarts.is_empty() {
            return;
        }
        let w = self.clone();
        tokio::spawn(async move {
            while let Some(site) = rx.recv().await {
                tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..500))).await;
                w.faults
                    .event("aimed: Redis restarts under a stalled rebalancer".into());
                let fault = restarts[thread_rng().gen_range(0..restarts.len())];
                let rebuilt = w.redis.rebuilds.load(std::sync::atomic::Ordering::SeqCst);
                w.inject(fault, Duration::ZERO).await;
                if site == Site::RebalanceLook {
                    w.wake_after_a_rebuild(rebuilt).await;
                }
            }
        });
    }

    /// Wake the rebalancer asleep before its take (`Site::RebalanceLook`) a moment after the
    /// recovery the aimed restart started has rebuilt a bucket (Redis had rebuilt `before`
    /// buckets then): its take of the old generation lands on rebuilt buckets whose gates are
    /// still recovering, or on gates of the new generation once the recovery reopened them. If
    /// no recovery rebuilds within 15 s, its own sleep ends it.
    async fn wake_after_a_rebuild(&self, before: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while tokio::time::Instant::now() < deadline {
            if self.redis.rebuilds.load(std::sync::atomic::Ordering::SeqCst) > before {
                tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..300))).await;
                self.faults
                    .event("aimed: the stalled rebalancer wakes up during a recovery".into());
                planted::wake(Site::RebalanceLook);
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A random schedule over the scenario's faults: one at a time, each for a short while.
    pub(super) async fn nemesis(self: Arc<Self>) {
        let all = self.cfg.scenario.faults();
        if all.is_empty() {
            return;
        }
        // Swarm testing: chaos uses, per seed, a subset of its fault types (each kept at even
        // odds, at least one), so that a seed's faults hit a few parts hard rather than every
        // part a little. Drawn from a stream of its own: the subset is the seed's alone.
        let kinds: Vec<Fault> = if self.cfg.scenario == Scenario::Chaos {
            let mut rng = rand::rngs::StdRng::seed_from_u64(self.cfg.seed ^ 0x5a_a4_4a);
            let mut kept: Vec<Fault> = all.iter().copied().filter(|_| rng.gen_bool(0.5)).collect();
            if kept.is_empty() {
                kept.push(all[rng.gen_range(0..all.len())]);
            }
            let names: std::collections::BTreeSet<String> = kept.iter().map(|f| format!("{f:?}")).collect();
            let names: Vec<String> = names.into_iter().collect();
            self.faults.event(format!("swarm: {}", names.join(" ")));
            kept
        } else {
            all.to_vec()
        };
        // Aimed faults of the operator scenario, before the random ones: a pause at once, while
        // the sale is at its busiest (what a stale API process sells after it is the point), and
        // a Redis loss with a long pause right behind it, so that the recovery's reopen falls
        // inside the pause (it must leave the gates paused).
        // Competing recoveries get one of two aimed pairs per seed, the windows a recovery must
        // get right: records lost after their ack while the sale is busy, then a Redis restart
        // that keeps their reservations (past the AOF window: the recovery must rescue them
        // from the outbox, and the reconciler, which would republish them, stands aside while
        // it runs); or an API node paused mid-sale and Redis lost under it (it wakes up a zombie,
        // maybe after the recovery bumped the generation, and publishes orders of the old one). Then a quiet while, so that the recovery gets that far before the
        // random faults (another Redis restart starts it over) resume.
        let ms = |r: std::ops::Range<u64>| thread_rng().gen_range(r);
        let mut aimed: Vec<(u64, Fault, u64)> = match self.cfg.scenario {
            Scenario::Operator => vec![
                (0, Fault::OperatorPause, ms(30..300)),
                (0, Fault::RedisRestartVolatile, 0),
                (0, Fault::PauseInRecovery, ms(500..1_000)),
            ],
            // The restart comes past the AOF window, so it keeps the reservations whose records
            // were lost, and before the reconciler's republish age, so it still finds them (a
            // seed whose timings leave no room between the two gets the other pair).
            Scenario::CompetingRecoveries
                if thread_rng().gen_bool(0.5)
                    && self.timings.republish_after_ms > self.timings.aof_window_ms + 300 =>
            {
                // Past the window's end by more than the AOF window: the restart keeps every
                // reservation whose record the window lost.
                let lossy = ms(100..200);
                vec![
                    (ms(0..100), Fault::MqLoseAfterAck, lossy),
                    // And records held back past the recovery's drain in the same window: the
                    // rescue must make orders of their reservations that no late record undoes.
                    (0, Fault::MqVisibleLate, lossy),
                    (
                        self.timings.aof_window_ms + lossy + ms(20..80),
                        Fault::RedisRestartAof,
                        0,
                    ),
                    (0, Fault::MqLoseInRecovery, 0),
                    (0, Fault::MqLateInRecovery, 0),
                    (0, Fault::RedisResendInRecovery, 0),
                    (0, Fault::DeliveredLateInRecovery, 0),
                    (0, Fault::LedgerStalledInRecovery, 0),
                    (0, Fault::DeadlockInRecovery, 0),
                ]
            }
            // The pause ends after the recovery bumped the generation, however long the faults
            // in it make the recovery (a pause of a fixed length mostly ended before the bump).
            Scenario::CompetingRecoveries => {
                vec![
                    (ms(50..300), Fault::EnginePauseAcrossBump, 20_000),
                    (ms(0..50), Fault::RedisRestartVolatile, 0),
                    (0, Fault::DeliveredLateInRecovery, 0),
                    (0, Fault::LedgerStalledInRecovery, 0),
                    (0, Fault::DeadlockInRecovery, 0),
                ]
            }
            // On every other seed, once, while the sale is busy (just past the publish timeout,
            // so that the sale goes on around it): purchases whose publish timed out meet a
            // restart that lost their reservation.
            Scenario::RedisLoss if thread_rng().gen_bool(0.5) => {
                vec![(ms(200..600), Fault::BrokerDownAcrossRestart, ms(350..600))]
            }
            // Early in the sale, while the burst's orders are still being applied.
            Scenario::JobsAway => {
                let fault = Fault::RedisRestartJobsAway;
                vec![(ms(50..400), fault, thread_rng().gen_range(fault.hold_range()))]
            }
            _ => Vec::new(),
        };
        let mut quiet = match self.cfg.scenario {
            // Long enough for the recovery the pair starts to wait out its publish window and
            // reach its rescue before a random fault (another restart, a paused runner) cuts it.
            Scenario::CompetingRecoveries => {
                let first = match aimed[0].1 {
                    Fault::EnginePauseAcrossBump => 0,
                    _ => aimed[0].2,
                };
                first + self.timings.recovery().quiesce.as_millis() as u64 + ms(300..800)
            }
            _ => 0,
        };
        aimed.reverse();
        let mut given = self.cfg.schedule.clone().map(|s| s.into_iter());
        loop {
            let (pace, fault, hold) = match aimed.pop() {
                Some(aim) => aim,
                None => {
                    let pace = thread_rng().gen_range(self.cfg.scenario.pace()) + std::mem::take(&mut quiet);
                    let fault = kinds[thread_rng().gen_range(0..kinds.len())];
                    (pace, fault, thread_rng().gen_range(fault.hold_range()))
                }
            };
            // A given schedule replaces what was drawn (drawn all the same, so that the rest of
            // the world draws what it drew in the run the schedule came from).
            // Past its end, the nemesis idles as drawn (the world stopped the run the schedule
            // came from while its nemesis waited for the next fault).
            let next = match given.as_mut().map(Iterator::next) {
                None => Some(Scheduled {
                    after_ms: pace,
                    fault,
                    hold_ms: hold,
                }),
                Some(next) => next,
            };
            let after = next.map_or(pace, |n| n.after_ms);
            if after > 0 {
                tokio::time::sleep(Duration::from_millis(after)).await;
            }
            // L2 is about selling everything once healed: the skewed run heals halfway through
            // the sale, while buyers are still there.
            if self.cfg.scenario == Scenario::Skewed
                && self.faults.elapsed().as_millis() as u64 > self.cfg.sale_ms / 2
            {
                self.faults
                    .event("nemesis done: healed while the sale goes on".into());
                return;
            }
            let Some(next) = next else { continue };
            self.schedule.lock().expect("schedule").push(next);
            self.inject(next.fault, Duration::from_millis(next.hold_ms)).await;
        }
    }

    pub(super) async fn inject(self: &Arc<Self>, fault: Fault, hold: Duration) {
        let f = &self.faults;
        let pick = |nodes: &[NodeHandle]| nodes[thread_rng().gen_range(0..nodes.len())].id();
        match fault {
            Fault::ConsumerCrash => {
                self.down_for(pick(&self.consumers), Fault::ConsumerCrash, hold)
                    .await
            }
            Fault::EngineCrash => self.down_for(pick(&self.engines), Fault::EngineCrash, hold).await,
            Fault::JobsCrash => {
                self.down_for(pick(&self.jobs_nodes), Fault::JobsCrash, hold)
                    .await
            }
            Fault::BrokerDown => self.down_for(self.kafka_node.id(), Fault::BrokerDown, hold).await,
            Fault::BrokerDownAcrossRestart => {
                let (w, at) = (self.clone(), hold.mul_f64(thread_rng().gen_range(0.3..0.9)));
                self.in_background(async move {
                    tokio::time::sleep(at).await;
                    w.restart_redis(Fault::RedisRestartAof).await
                });
                self.down_for(self.kafka_node.id(), Fault::BrokerDown, hold).await
            }
            Fault::MysqlUnavailable => {
                self.down_for(self.mysql_node.id(), Fault::MysqlUnavailable, hold)
                    .await
            }
            Fault::ClockSkew => {
                let i = thread_rng().gen_range(0..self.engines.len());
                let skew = thread_rng().gen_range(-500..=500);
                f.fired(Fault::ClockSkew);
                f.event(format!("engine-{i} clock skewed {skew:+} ms"));
                self.skews.lock().expect("skews")[i] = skew;
                self.reboot(self.engines[i].id());
            }
            Fault::RedisRestartVolatile | Fault::RedisRestartAof => self.restart_redis(fault).await,
            Fault::RedisRestartJobsAway => {
                f.fired(Fault::RedisRestartJobsAway);
                for n in &self.jobs_nodes {
                    self.handle.kill(n.id());
                }
                self.restart_redis(Fault::RedisRestartAof).await;
                // Back after the hold (unless the heal came first); the faults go on meanwhile.
                let w = self.clone();
                self.in_background(async move {
                    tokio::time::sleep(hold).await;
                    for n in &w.jobs_nodes {
                        if w.handle.is_exit(n.id()) {
                            w.handle.restart(n.id());
                        }
                    }
                });
            }
            Fault::RedisFailover => {
                f.fired(Fault::RedisFailover);
                // The replica holds what the primary held `lag` ago; the primary goes on taking
                // writes until it dies.
                let lag = thread_rng().gen_range(0..=self.timings.replica_lag_ms);
                if lag > self.timings.recovery().quiesce.as_millis() as u64 {
                    f.cover(Target::FailoverPastQuiesce);
                }
                let (image, taken_at) = (self.redis.model.dump(), f.elapsed());
                tokio::time::sleep(Duration::from_millis(lag)).await;
                f.event(format!("redis fails over to a replica {lag} ms behind"));
                self.redis.promote_at_restart(image, taken_at);
                self.reboot(self.redis_node.id());
            }
            Fault::RedisPartition => {
                f.fired(Fault::RedisPartition);
                NetSim::current().clog_node(self.redis_node.id());
                tokio::time::sleep(hold).await;
                NetSim::current().unclog_node(self.redis_node.id());
            }
            Fault::LinkPartition => {
                let (client, store) = match thread_rng().gen_range(0..6) {
                    0 => ((pick(&self.engines), "engine"), (self.kafka_node.id(), "kafka")),
                    1 => ((pick(&self.engines), "engine"), (self.redis_node.id(), "redis")),
                    2 => ((pick(&self.consumers), "worker"), (self.mysql_node.id(), "mysql")),
                    3 => ((pick(&self.consumers), "worker"), (self.kafka_node.id(), "kafka")),
                    4 => ((pick(&self.jobs_nodes), "jobs"), (self.redis_node.id(), "redis")),
                    _ => ((pick(&self.jobs_nodes), "jobs"), (self.mysql_node.id(), "mysql")),
                };
                // 0: both ways; 1: replies lost (the request is carried out); 2: requests lost.
                let way = thread_rng().gen_range(0..3);
                let links: Vec<_> = match way {
                    0 => vec![(client.0, store.0), (store.0, client.0)],
                    1 => vec![(store.0, client.0)],
                    _ => vec![(client.0, store.0)],
                };
                f.fired(Fault::LinkPartition);
                f.event(format!(
                    "link {} node {} <-> {} cut {} for {} ms",
                    client.1,
                    client.0,
                    store.1,
                    ["both ways", "for replies", "for requests"][way],
                    hold.as_millis()
                ));
                let net = NetSim::current();
                links.iter().for_each(|&(a, b)| net.clog_link(a, b));
                tokio::time::sleep(hold).await;
                links.iter().for_each(|&(a, b)| net.unclog_link(a, b));
            }
            Fault::OperatorPause => self.operator_pause(hold).await,
            // Aimed at the recovery's last step: once a claim holds and every bucket has its
            // stock again (rebuilt, or never lost), the reopen is near — it reads the registry,
            // then writes the gates — and the operator acts about then. A recovery outlasts the
            // sale as often as not, and so does the operator's watch: it goes on past the heal
            // (the settle resumes a pause left standing).
            Fault::PauseInRecovery => {
                let w = self.clone();
                self.in_background(async move {
                    for _ in 0..400 {
                        if w.raw_claim().is_some() && w.stock_keys_present() {
                            break;
                        }
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..1_000))).await;
                    w.operator_pause(hold).await
                });
            }
            // In the background: the warmup's recovery outlasts the sale (and the nemesis), and
            // its answer must still be checked.
            Fault::FullLossRestart => {
                self.operator_pending
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let w = self.clone();
                self.in_background(async move {
                    w.full_loss_restart().await;
                    w.operator_pending
                        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            Fault::MqLoseInRecovery => self.window_in_recovery("mq_lose_after_ack", lose_after_ack),
            Fault::MqLateInRecovery => self.window_in_recovery("mq_visible_late", visible_late),
            Fault::LedgerStalledInRecovery => {
                self.window_in_recovery("ledger_stalled_txn", |k, on| k.ledger_stalled_txn = prob(0.2, on))
            }
            // The ledger's writes (a runner's bump among the few a recovery sends), 2 s late at
            // least (past many a claim's lease: after a successor's bump, as often as not), for
            // two leases at most: each one held back fails the recovery's attempt.
            Fault::DeliveredLateInRecovery => self.window_in_recovery_for(
                "ledger_delivered_late",
                |k, on| {
                    k.ledger_delivered_late = prob(0.3, on);
                    k.delivered_late_floor = delay(2_000, on);
                },
                Some(2 * self.timings.recovery().lease),
            ),
            Fault::DeadlockInRecovery => self.window_in_recovery_for(
                "ledger_deadlock",
                |k, on| k.ledger_deadlock = prob(0.3, on),
                Some(2 * self.timings.recovery().lease),
            ),
            // Every other script: a recovery that fails at each re-sent step its first run already
            // took (a reopen, a finish) never finishes.
            Fault::RedisResendInRecovery => {
                self.window_in_recovery("redis_resend", |k, on| k.redis_resend = prob(0.5, on))
            }
            // Aimed at a healthy activity under load (a key lost while a recovery rebuilds is
            // the recovery's anyway): it waits for one — in the late wave, if the first never
            // was (a recovery outlasts it as often as not).
            Fault::RedisKeyLost => {
                use seckill_core::adapters::script::{gate_key, stock_key};
                let all: Vec<BucketNo> = self.god.plan.all_buckets().collect();
                let b = all[thread_rng().gen_range(0..all.len())];
                // Aimed at the writers that check before they write: half the time the stock key
                // goes as the writer's write of it arrives, after its check found it — where the
                // operator warms up, a warmup's (one is started then), else the rebalancer's next
                // give (into whichever bucket it moves units to) or the next cancel's release.
                let warmup = self.cfg.scenario.faults().contains(&Fault::OperatorWarmup);
                let racing = thread_rng().gen_bool(0.5);
                let key = match racing || thread_rng().gen_bool(0.5) {
                    true => stock_key(ACTIVITY, b),
                    false => gate_key(ACTIVITY, b),
                };
                let w = self.clone();
                self.in_background(async move {
                    while !(w.faults.under_load() && w.healthy()) {
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    if racing {
                        use crate::stores::LoseAtWrite;
                        let at = if warmup {
                            LoseAtWrite::Warmup(key)
                        } else if thread_rng().gen_bool(0.5) {
                            LoseAtWrite::NextGive
                        } else {
                            LoseAtWrite::NextCancel
                        };
                        *w.redis.lose_at_write.lock().expect("lose at write") = Some(at);
                        if warmup {
                            w.faults.fired(Fault::OperatorWarmup);
                            w.operator_warmup().await;
                        }
                        return;
                    }
                    w.faults.fired(Fault::RedisKeyLost);
                    w.faults.event(format!("redis: {key} lost"));
                    w.redis.lose_key(&key, w.faults.elapsed());
                    // The recovery recreates the gate: its versions start again.
                    w.gate_versions.lock().expect("gate versions").1.remove(&b.0);
                });
            }
            // Aimed at a healthy activity under load, as a deploy job re-running its steps
            // mid-sale meets it (one that meets a recovery is told to try again, and does).
            Fault::OperatorWarmup => {
                let w = self.clone();
                self.in_background(async move {
                    while !(w.faults.under_load() && w.healthy()) {
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                    w.faults.fired(Fault::OperatorWarmup);
                    w.operator_warmup().await
                });
            }
            // Pauses overlap the faults that follow: the nemesis goes on while the node sleeps.
            Fault::EnginePause => {
                let (w, id) = (self.clone(), pick(&self.engines));
                self.in_background(async move { w.pause_for(id, Fault::EnginePause, hold).await });
            }
            Fault::EnginePauseAcrossBump => {
                let (w, id) = (self.clone(), pick(&self.engines));
                *self.zombie.lock().expect("zombie") = Some(id);
                self.in_background(async move {
                    let bumps = || w.ledger_log.bumps.lock().expect("ledger log").len();
                    let before = bumps();
                    w.faults.fired(Fault::EnginePauseAcrossBump);
                    w.faults.event(
                        "engine_pause_across_bump: node paused until a recovery bumps the generation".into(),
                    );
                    w.handle.pause(id);
                    let deadline = tokio::time::Instant::now() + hold;
                    while bumps() == before && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(thread_rng().gen_range(0..300))).await;
                    w.handle.resume(id);
                    *w.zombie.lock().expect("zombie") = None;
                });
            }
            Fault::JobsPause => {
                let (w, id) = (self.clone(), pick(&self.jobs_nodes));
                self.in_background(async move { w.pause_for(id, Fault::JobsPause, hold).await });
            }
            Fault::ConsumerPause => {
                let (w, id) = (self.clone(), pick(&self.consumers));
                self.in_background(async move { w.pause_for(id, Fault::ConsumerPause, hold).await });
            }
            Fault::PacketLoss => {
                f.fired(Fault::PacketLoss);
                NetSim::current().update_config(|c| c.packet_loss_rate = 0.05);
                tokio::time::sleep(hold).await;
                NetSim::current().update_config(|c| c.packet_loss_rate = 0.0);
            }
            // Knob windows overlap the faults that follow (and each other).
            knob => {
                type Turn = fn(&mut crate::faults::Knobs, bool);
                let (name, turn): (&'static str, Turn) = match knob {
                    Fault::LedgerLockWait => ("ledger_lock_wait", |k, on| k.ledger_lock_wait = prob(0.3, on)),
                    Fault::LedgerDeadlock => ("ledger_deadlock", |k, on| k.ledger_deadlock = prob(0.3, on)),
                    Fault::LedgerCommitUnknown => ("ledger_commit_unknown", |k, on| {
                        k.ledger_commit_unknown = prob(0.3, on)
                    }),
                    Fault::LedgerConnLoss => ("ledger_conn_loss", |k, on| k.ledger_conn_loss = prob(0.2, on)),
                    Fault::LedgerStalledTxn => {
                        ("ledger_stalled_txn", |k, on| k.ledger_stalled_txn = prob(0.1, on))
                    }
                    Fault::MqDuplicate => ("mq_duplicate", |k, on| k.mq_duplicate = prob(0.3, on)),
                    Fault::MqDelay => ("mq_delay", |k, on| k.mq_delay = delay(80, on)),
                    Fault::MqRefuse => ("mq_refuse", |k, on| k.mq_refuse = prob(0.5, on)),
                    Fault::MqAckLost => ("mq_ack_lost", |k, on| k.mq_ack_lost = prob(0.3, on)),
                    Fault::MqVisibleLate => ("mq_visible_late", visible_late),
                    Fault::RedisResend => ("redis_resend", redis_resend),
                    Fault::DeliveredLate => ("delivered_late", delivered_late),
                    Fault::MqLoseAfterAck => ("mq_lose_after_ack", lose_after_ack),
                    Fault::RedisLatency => ("redis_latency", |k, on| k.redis_latency = delay(60, on)),
                    Fault::MqRewindFail => ("mq_rewind_fail", |k, on| k.mq_rewind_fail = prob(0.7, on)),
                    Fault::RedisSlowScript => {
                        ("redis_slow_script", |k, on| k.redis_slow_script = prob(0.05, on))
                    }
                    // A fault with neither an arm above nor a knob here would otherwise pass for
                    // another one: a crashed world says so at once.
                    other => panic!("fault {other:?} has no arm in World::inject"),
                };
                f.event(format!("window {name} for {} ms", hold.as_millis()));
                // Windows whose effect is a delay count when opened; the others count per hit.
                if matches!(knob, Fault::MqDelay | Fault::RedisLatency) {
                    f.fired(knob);
                }
                f.open_window(name, turn);
                let f = f.clone();
                self.in_background(async move {
                    tokio::time::sleep(hold).await;
                    f.close_window(name, turn);
                });
            }
        }
    }

    /// A knob window open for as long as the next recovery runs (from its claim until it finished),
    /// outlasting the heal (which turns every knob off), as the recovery does.
    pub(super) fn window_in_recovery(
        self: &Arc<Self>,
        name: &'static str,
        turn: fn(&mut crate::faults::Knobs, bool),
    ) {
        self.window_in_recovery_for(name, turn, None)
    }

    /// `window_in_recovery`, closed after `limit` at the latest: for a fault that fails the
    /// recovery's steps, which it would otherwise hold open for good.
    pub(super) fn window_in_recovery_for(
        self: &Arc<Self>,
        name: &'static str,
        turn: fn(&mut crate::faults::Knobs, bool),
        limit: Option<Duration>,
    ) {
        let w = self.clone();
        self.in_background(async move {
            while w.raw_claim().is_none() {
                tokio::time::sleep(CHECK_EVERY).await;
            }
            w.faults.event(format!("window {name} while a recovery runs"));
            w.faults.open_window(name, turn);
            let until = limit.map(|l| w.faults.elapsed() + l);
            while w.raw_claim().is_some() && until.is_none_or(|u| w.faults.elapsed() < u) {
                if !w.faults.window_open(name) {
                    w.faults.open_window(name, turn);
                }
                tokio::time::sleep(CHECK_EVERY).await;
            }
            w.faults.close_window(name, turn);
        });
    }

    /// Redis restarts with what its persistence kept (`RedisRestartVolatile` or `RedisRestartAof`).
    pub(super) async fn restart_redis(&self, fault: Fault) {
        let f = &self.faults;
        let volatile = fault == Fault::RedisRestartVolatile;
        f.fired(fault);
        self.redis.set_restart_mode(if volatile {
            Persistence::Volatile
        } else {
            Persistence::Aof
        });
        // In chaos, half the restarts are not instant: Redis is down a while (loading its
        // AOF, a supervisor's restart delay) and requests meanwhile get no answer. The
        // scenarios about recoveries restart it at once, so that records still in flight
        // meet the recovery. Either way it comes back with what its persistence kept.
        self.handle.kill(self.redis_node.id());
        if self.cfg.scenario == Scenario::Chaos && thread_rng().gen_bool(0.5) {
            let down = thread_rng().gen_range(50..1_500);
            f.fired(Fired::RedisDownAWhile);
            f.event(format!("redis down for {down} ms"));
            tokio::time::sleep(Duration::from_millis(down)).await;
        }
        // Killed again: an aimed restart may have brought it back meanwhile.
        self.reboot(self.redis_node.id());
    }

    /// A node stops (every task where it is), for `hold`, and goes on: a zombie.
    pub(super) async fn pause_for(&self, id: madsim::task::NodeId, fault: Fault, hold: Duration) {
        self.faults.fired(fault);
        self.faults.event(format!(
            "{}: node paused for {} ms",
            fault.name(),
            hold.as_millis()
        ));
        self.handle.pause(id);
        tokio::time::sleep(hold).await;
        self.handle.resume(id);
    }

    /// A node crashes (at whatever await point it is), stays down for `hold`, and restarts.
    pub(super) async fn down_for(&self, id: madsim::task::NodeId, fault: Fault, hold: Duration) {
        self.faults.fired(fault);
        self.handle.kill(id);
        tokio::time::sleep(hold).await;
        self.handle.restart(id);
    }

    /// A crash and an immediate restart. (madsim's `restart` alone keeps the node's sockets
    /// bound, so the new incarnation could not bind its address.)
    pub(super) fn reboot(&self, id: madsim::task::NodeId) {
        self.handle.kill(id);
        self.handle.restart(id);
    }

    /// Undo every fault: knobs off, links healed, every node running.
    pub(super) async fn heal(&self) {
        self.faults.knobs_off();
        // The recovery's long fault points stay armed through the heal (the recovery the faults
        // started runs after it); the rebalancer's does not (the world aims a Redis restart at
        // it: a fault after the heal).
        planted::stop_stalls(RECOVERY_LONG_SITES);
        let net = NetSim::current();
        net.update_config(|c| c.packet_loss_rate = 0.0);
        let nodes: Vec<&NodeHandle> = self.nodes().collect();
        for a in &nodes {
            for b in &nodes {
                net.unclog_link(a.id(), b.id());
            }
        }
        let zombie = *self.zombie.lock().expect("zombie");
        for n in nodes {
            net.unclog_node(n.id());
            if Some(n.id()) != zombie {
                self.handle.resume(n.id());
            }
            if self.handle.is_exit(n.id()) {
                self.handle.restart(n.id());
            }
        }
        if !self.pauses.lock().expect("pauses").is_empty() {
            self.resume().await;
        }
        self.faults.event("healed".into());
    }
}
