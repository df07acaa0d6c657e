//! The operator at work through the admin API: pause, resume, close, and the warmup after a
//! full loss (the sequence the runbook allows, docs/operations.md).

use super::{Fault, Verdict, World};
use crate::rpc::{self, engine_addr};
use crate::stores::Persistence;
use madsim::net::Endpoint;
use madsim::rand::{thread_rng, Rng};
use seckill_core::domain::ActivityState;
use seckill_invariants as inv;
use std::time::Duration;

impl World {
    /// An admin call through a random API node, from the operator's console.
    pub(super) async fn admin<R>(&self, req: R, timeout: Duration) -> (usize, Result<R::Response, String>)
    where
        R: madsim::net::rpc::Request + Send + 'static,
        R::Response: Send + 'static,
    {
        let i = thread_rng().gen_range(0..self.engines.len());
        let engine = engine_addr(i);
        let answer = self
            .operator
            .spawn(async move {
                let ep = Endpoint::bind("10.0.5.1:0").await.expect("bind the console");
                ep.call_timeout(engine, req, timeout)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| format!("{e:?}"))
            .and_then(|r| r);
        (i, answer)
    }

    /// Pause (or, one time in five, close) through one API node; after `hold`, resume through
    /// another. From the pause's return until the registry holds a newer resume, S5 holds.
    pub(super) async fn operator_pause(&self, hold: Duration) {
        let state = if thread_rng().gen_bool(0.2) {
            ActivityState::Closed
        } else {
            ActivityState::Paused
        };
        // The operator waits half a second for the pause; past that, it takes the pause back (a
        // resume through another node) while the first call may still be on its way to the
        // gates: only their versions keep the older intent from winning.
        let (i, answer) = self
            .admin(rpc::Operate { state }, Duration::from_millis(500))
            .await;
        match answer {
            Ok(Ok(intent)) => {
                let at = self.faults.elapsed();
                self.faults.fired(Fault::OperatorPause);
                self.faults.event(format!(
                    "operator: {state} through engine-{i} (version {})",
                    intent.version
                ));
                self.pauses.lock().expect("pauses").push((at, intent.version));
            }
            other => {
                self.faults
                    .event(format!("operator: {state} through engine-{i} failed: {other:?}"));
                self.resume().await;
                return;
            }
        }
        tokio::time::sleep(hold * 2).await;
        self.resume().await;
    }

    /// The operator resumes the sale (until an API node says it did).
    pub(super) async fn resume(&self) {
        for _ in 0..50 {
            let (i, answer) = self
                .admin(
                    rpc::Operate {
                        state: ActivityState::Open,
                    },
                    Duration::from_secs(5),
                )
                .await;
            if let Ok(Ok(_)) = answer {
                self.faults.event(format!("operator: resumed through engine-{i}"));
                return;
            }
            self.faults
                .event(format!("operator: resume through engine-{i} failed: {answer:?}"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Redis restarts with nothing, every API node restarts, and the operator calls warmup
    /// through one of them (retrying until it answers) — the runbook's sequence.
    pub(super) async fn full_loss_restart(&self) {
        self.faults.fired(Fault::FullLossRestart);
        self.redis.set_restart_mode(Persistence::Volatile);
        // Half the time the whole site went down: the job runners come back only after the
        // operator's warmup, which then meets the lost Redis alone (no runner's recovery got
        // there first to hide what the warmup does).
        let site_down = self.cfg.jobs && thread_rng().gen_bool(0.5);
        if site_down {
            self.faults
                .event("full_loss_restart: the job runners are down until the warmup".into());
            for j in &self.jobs_nodes {
                self.handle.kill(j.id());
            }
        }
        self.reboot(self.redis_node.id());
        for e in &self.engines {
            self.reboot(e.id());
        }
        self.operator_warmup().await;
        if site_down {
            // Unless the heal brought them back meanwhile.
            for j in self.jobs_nodes.iter().filter(|j| self.handle.is_exit(j.id())) {
                self.handle.restart(j.id());
            }
        }
    }

    /// The operator's warmup through an API node, retried until one answers.
    pub(super) async fn operator_warmup(&self) {
        for _ in 0..20 {
            let began = self.faults.elapsed();
            let (i, answer) = self.admin(rpc::Warmup, Duration::from_secs(30)).await;
            match answer {
                Ok(Ok(what)) => {
                    self.faults
                        .event(format!("operator: warmup through engine-{i}: {what}"));
                    self.warmup_recovered_only_a_loss(began, &what);
                    return;
                }
                other => self
                    .faults
                    .event(format!("operator: warmup through engine-{i} failed: {other:?}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A warmup that found the activity whole (no recovery needed) and then stock keys missing
    /// as it wrote recovers them — a recovery, with its closed gates and the in-flight orders it
    /// refuses, on account of keys Redis must really have lost after the warmup began. One that
    /// recovers a Redis that lost nothing (a warmup that took every bucket for lost) is an
    /// outage of the operator's making.
    pub(super) fn warmup_recovered_only_a_loss(&self, began: Duration, answer: &str) {
        if !answer.contains(seckill_core::service::admin::LOST_AFTER_CHECK) {
            return;
        }
        if self.redis.last_loss().is_none_or(|at| at < began) {
            self.record(
                vec![inv::Violation {
                    invariant: inv::Invariant::S7AnswersTrue,
                    bucket: None,
                    detail: format!(
                        "a warmup begun at {:.3} s recovered buckets it found without their stock key, \
                         and Redis lost no key and did not restart since: {answer}",
                        began.as_secs_f64()
                    ),
                }],
                Verdict::Safety,
            );
        }
    }
}
