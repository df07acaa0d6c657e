//! An in-process order bus with Kafka's delivery semantics, for the embedded backend and tests:
//! keyed partitions (one key always lands on one partition, in order), one consumer group whose
//! members split the partitions, at-least-once delivery (a record polled but not committed is
//! delivered again after a rewind or when its consumer goes away), and a dead-letter topic of one
//! partition.
//!
//! Bounded: at most `capacity` records may wait uncommitted across all partitions; beyond that
//! `publish` fails determinately (like a full producer queue), so a stalled consumer turns into
//! fast errors at the edge instead of unbounded memory.
//!
//! State sits behind one `std::sync::Mutex` (nothing awaits while it is held); a `Notify` wakes
//! consumers waiting in `poll`.

use crate::domain::Reservation;
use crate::ports::{DeadLetter, DeadLetterPage, Delivery, OrderBus, OrderSource, PortError, PortResult};
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// How long a poll waits for records before returning an empty batch (by default): short, so a
/// consumer asked to stop notices soon; long enough not to spin.
const POLL_WAIT: Duration = Duration::from_millis(50);

#[derive(Clone)]
pub struct EmbeddedBus {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<BusState>,
    notify: Notify,
    capacity: usize,
    poll_wait: Duration,
    fetch: Fetch,
}

/// Kafka's `fetch.min.bytes` / `fetch.max.wait.ms`, counted in records: a poll that finds some
/// records but fewer than `min_records` sleeps `max_wait` once (it is not woken per record) and
/// returns what is there then. Without it a busy consumer is woken for every record and applies
/// batches of one.
#[derive(Debug, Clone, Copy)]
pub struct Fetch {
    pub min_records: usize,
    pub max_wait: Duration,
}

impl Fetch {
    /// Return whatever is there at once (Kafka's default `fetch.min.bytes=1`).
    pub const IMMEDIATE: Fetch = Fetch {
        min_records: 1,
        max_wait: Duration::ZERO,
    };
}

struct BusState {
    partitions: Vec<PartitionLog>,
    /// The one group's committed offsets, one per partition (next offset to read).
    committed: Vec<u64>,
    /// Live members, in join order; partition p belongs to `members[p % members.len()]`.
    members: BTreeSet<u64>,
    /// Bumped on every join and leave, so members notice their assignment changed.
    generation: u64,
    next_member: u64,
    group: Option<String>,
    dead_letters: DeadLetterLog,
}

struct PartitionLog {
    /// Offset of `records[0]`; records below the committed offset are trimmed.
    base: u64,
    records: VecDeque<(String, Vec<u8>)>,
}

impl PartitionLog {
    fn end(&self) -> u64 {
        self.base + self.records.len() as u64
    }
}

/// A dead-letter topic of one partition, in memory (the embedded bus's and the simulated
/// broker's): offsets count on across purges, as Kafka's do.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterLog {
    letters: VecDeque<DeadLetter>,
    end: u64,
}

impl DeadLetterLog {
    /// Dead-letter `d` (its origin written as `orders/partition@offset`).
    pub fn push(&mut self, d: &Delivery, reason: &str) {
        self.letters.push_back(DeadLetter {
            partition: 0,
            offset: self.end,
            origin: format!("orders/{}@{}", d.partition, d.offset),
            key: d.key.clone(),
            payload: d.payload.clone(),
            reason: reason.to_string(),
        });
        self.end += 1;
    }

    pub fn letters(&self) -> impl Iterator<Item = &DeadLetter> {
        self.letters.iter()
    }

    /// `OrderBus::dead_letters` over this one partition.
    pub fn page(&self, from: (u32, u64), limit: usize) -> DeadLetterPage {
        let mut rest = (self.letters.iter()).filter(|d| from.0 == 0 && d.offset >= from.1);
        let letters: Vec<DeadLetter> = rest.by_ref().take(limit).cloned().collect();
        let next = rest.next().map(|d| (0, d.offset));
        DeadLetterPage {
            letters,
            total: self.letters.len() as u64,
            next,
            ends: vec![(0, self.end)],
        }
    }

    /// `OrderBus::purge_dead_letters` over this one partition.
    pub fn purge(&mut self, before: &[(u32, u64)]) -> u64 {
        let below = (before.iter())
            .filter(|(p, _)| *p == 0)
            .map(|&(_, o)| o)
            .max()
            .unwrap_or(0);
        let n = self.letters.iter().take_while(|d| d.offset < below).count();
        self.letters.drain(..n);
        n as u64
    }
}

/// FNV-1a of the key: stable across processes, so a key's partition never moves.
pub fn partition_of(key: &str, partitions: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % partitions as u64) as usize
}

impl EmbeddedBus {
    pub fn new(partitions: u32, capacity: usize) -> EmbeddedBus {
        Self::with_poll_wait(partitions, capacity, POLL_WAIT)
    }

    /// The same bus, its consumers fetching by `fetch`.
    pub fn with_fetch(self, fetch: Fetch) -> EmbeddedBus {
        let shared = Arc::into_inner(self.shared).expect("configured before it is shared");
        EmbeddedBus {
            shared: Arc::new(Shared { fetch, ..shared }),
        }
    }

    /// The same bus with another poll wait (tests use zero: an empty poll returns at once).
    pub fn with_poll_wait(partitions: u32, capacity: usize, poll_wait: Duration) -> EmbeddedBus {
        assert!(
            partitions >= 1 && capacity >= 1,
            "bus: at least one partition and one slot"
        );
        let n = partitions as usize;
        EmbeddedBus {
            shared: Arc::new(Shared {
                state: Mutex::new(BusState {
                    partitions: (0..n)
                        .map(|_| PartitionLog {
                            base: 0,
                            records: VecDeque::new(),
                        })
                        .collect(),
                    committed: vec![0; n],
                    members: BTreeSet::new(),
                    generation: 0,
                    next_member: 0,
                    group: None,
                    dead_letters: DeadLetterLog::default(),
                }),
                notify: Notify::new(),
                capacity,
                poll_wait,
                fetch: Fetch::IMMEDIATE,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BusState> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records published but not yet committed by the group (the consumer lag).
    pub fn backlog(&self) -> u64 {
        let st = self.lock();
        st.partitions
            .iter()
            .zip(&st.committed)
            .map(|(p, c)| p.end() - c)
            .sum()
    }

    /// The dead-letter topic as it stands.
    pub fn all_dead_letters(&self) -> Vec<DeadLetter> {
        self.lock().dead_letters.letters().cloned().collect()
    }

    fn append(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        let mut st = self.lock();
        let lag: u64 = st
            .partitions
            .iter()
            .zip(&st.committed)
            .map(|(p, c)| p.end() - c)
            .sum();
        if lag >= self.shared.capacity as u64 {
            return Err(PortError::determinate(
                "publish",
                format!("bus full ({lag} records uncommitted)"),
            ));
        }
        let p = partition_of(key, st.partitions.len());
        st.partitions[p]
            .records
            .push_back((key.to_string(), payload.to_vec()));
        drop(st);
        self.shared.notify.notify_waiters();
        Ok(())
    }
}

impl OrderBus for EmbeddedBus {
    type Source = EmbeddedConsumer;

    async fn publish(&self, r: &Reservation) -> PortResult<()> {
        self.append(&r.bus_key(), &r.encode())
    }

    async fn publish_raw(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        self.append(key, payload)
    }

    async fn lag(&self, _group: &str) -> PortResult<u64> {
        Ok(self.backlog())
    }

    async fn dead_letters(&self, from: (u32, u64), limit: usize) -> PortResult<DeadLetterPage> {
        Ok(self.lock().dead_letters.page(from, limit))
    }

    async fn purge_dead_letters(&self, before: &[(u32, u64)]) -> PortResult<u64> {
        Ok(self.lock().dead_letters.purge(before))
    }

    async fn subscribe(&self, group: &str) -> PortResult<EmbeddedConsumer> {
        let mut st = self.lock();
        match &st.group {
            Some(g) if g != group => {
                return Err(PortError::determinate(
                    "subscribe",
                    format!("the embedded bus has one consumer group ({g}), not {group}"),
                ))
            }
            _ => st.group = Some(group.to_string()),
        }
        let member = st.next_member;
        st.next_member += 1;
        st.members.insert(member);
        st.generation += 1;
        let n = st.partitions.len();
        Ok(EmbeddedConsumer {
            bus: self.clone(),
            member,
            generation: 0,
            positions: vec![None; n],
            next_start: 0,
        })
    }
}

/// One member of the consumer group. Dropping it leaves the group; its uncommitted records go to
/// whichever member owns their partition next, from the committed offset.
pub struct EmbeddedConsumer {
    bus: EmbeddedBus,
    member: u64,
    /// The group generation our `positions` belong to.
    generation: u64,
    /// Next offset to read per partition; `None` for partitions we do not own.
    positions: Vec<Option<u64>>,
    /// Partition to start the next poll at, so one busy partition cannot starve the others.
    next_start: usize,
}

impl EmbeddedConsumer {
    fn sync_assignment(&mut self, st: &BusState) {
        if self.generation == st.generation {
            return;
        }
        self.generation = st.generation;
        let rank = st.members.iter().position(|m| *m == self.member);
        let k = st.members.len();
        for (p, pos) in self.positions.iter_mut().enumerate() {
            *pos = match rank {
                Some(r) if p % k == r => Some(st.committed[p]),
                _ => None,
            };
        }
    }

    /// Records waiting on our partitions.
    fn available(&mut self) -> usize {
        let bus = self.bus.clone();
        let st = bus.lock();
        self.sync_assignment(&st);
        self.positions
            .iter()
            .zip(&st.partitions)
            .filter_map(|(pos, log)| pos.map(|pos| (log.end() - pos.max(log.base)) as usize))
            .sum()
    }

    fn take(&mut self, max: usize) -> Vec<Delivery> {
        let bus = self.bus.clone();
        let st = bus.lock();
        self.sync_assignment(&st);
        let n = self.positions.len();
        let mut out = Vec::new();
        for i in 0..n {
            let p = (self.next_start + i) % n;
            let Some(pos) = self.positions[p] else { continue };
            let log = &st.partitions[p];
            let mut next = pos.max(log.base);
            while next < log.end() && out.len() < max {
                let (key, payload) = &log.records[(next - log.base) as usize];
                out.push(Delivery {
                    trace: None,
                    partition: p as u32,
                    offset: next,
                    key: key.clone(),
                    payload: payload.clone(),
                });
                next += 1;
            }
            self.positions[p] = Some(next);
            if out.len() >= max {
                break;
            }
        }
        self.next_start = (self.next_start + 1) % n;
        drop(st);
        out
    }
}

impl OrderSource for EmbeddedConsumer {
    async fn poll(&mut self, max: usize) -> PortResult<Vec<Delivery>> {
        let max = max.max(1);
        let shared = self.bus.shared.clone();
        let deadline = tokio::time::sleep(shared.poll_wait);
        tokio::pin!(deadline);
        loop {
            // Register interest before looking, so a publish in between is not missed.
            let notified = shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiting = self.available();
            if waiting >= shared.fetch.min_records.min(max)
                || (waiting > 0 && shared.fetch.max_wait.is_zero())
            {
                return Ok(self.take(max));
            }
            if waiting > 0 {
                // Not woken per record while the batch fills: one wait, then whatever is there.
                tokio::time::sleep(shared.fetch.max_wait).await;
                return Ok(self.take(max));
            }
            tokio::select! {
                _ = &mut deadline => return Ok(Vec::new()),
                _ = notified => {}
            }
        }
    }

    async fn commit(&mut self, batch: &[Delivery]) -> PortResult<()> {
        let mut st = self.bus.lock();
        if self.generation != st.generation {
            return Err(PortError::determinate(
                "commit",
                "the group rebalanced since this batch was polled",
            ));
        }
        for d in batch {
            let p = d.partition as usize;
            if self.positions.get(p).copied().flatten().is_none() {
                return Err(PortError::determinate(
                    "commit",
                    format!("partition {p} is not assigned here"),
                ));
            }
            st.committed[p] = st.committed[p].max(d.offset + 1);
        }
        // Trim what the group no longer needs.
        for p in 0..st.partitions.len() {
            let committed = st.committed[p];
            let log = &mut st.partitions[p];
            while log.base < committed && !log.records.is_empty() {
                log.records.pop_front();
                log.base += 1;
            }
        }
        Ok(())
    }

    async fn dead_letter(&mut self, d: &Delivery, reason: &str) -> PortResult<()> {
        let mut st = self.bus.lock();
        if st.dead_letters.letters.len() >= self.bus.shared.capacity {
            return Err(PortError::determinate("dead letter", "dead-letter list full"));
        }
        st.dead_letters.push(d, reason);
        Ok(())
    }

    async fn rewind(&mut self) -> PortResult<()> {
        let bus = self.bus.clone();
        let st = bus.lock();
        self.generation = st.generation.wrapping_sub(1); // force a resync from committed offsets
        self.sync_assignment(&st);
        Ok(())
    }
}

impl Drop for EmbeddedConsumer {
    fn drop(&mut self) {
        let mut st = self.bus.lock();
        st.members.remove(&self.member);
        st.generation += 1;
    }
}
