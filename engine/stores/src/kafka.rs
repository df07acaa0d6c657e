//! The order bus on Apache Kafka (rdkafka / librdkafka), DESIGN §5.
//!
//! Producer: idempotent (`enable.idempotence=true`, `acks=all`), key `A.b` so one bucket's orders
//! keep their order, bounded `message.timeout.ms`. A delivery failure after the record left our
//! queue is `Indeterminate` (the broker may hold it; the reconciler republishes and the ledger
//! dedupes); a full local queue is `Determinate`.
//!
//! Consumer: one group member per `subscribe`, `enable.auto.commit=false` and no automatic offset
//! store — offsets move only through `commit`, which the consumer service calls after the ledger
//! committed. `rewind` seeks every assigned partition back to the group's committed offset, so a
//! failed batch is delivered again. librdkafka's offset calls block, so they run on the blocking
//! pool, never on an async worker.

use crate::{Secret, TlsFiles};
use futures::FutureExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use seckill_core::domain::Reservation;
use seckill_core::ports::{
    DeadLetter, DeadLetterPage, Delivery, OrderBus, OrderSource, PortError, PortResult,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    pub brokers: String,
    pub topic: String,
    pub dlq_topic: String,
    /// Partitions a topic is created with (when we create it).
    pub partitions: i32,
    /// Replicas of each partition a topic is created with (when we create it).
    pub replication: i32,
    /// The topics' `min.insync.replicas` (when we create them): with the producer's `acks=all`,
    /// how many replicas hold a record before its ack. Kafka's default of 1 acknowledges a record
    /// only its leader holds, which a leader loss takes with it.
    pub min_insync_replicas: i32,
    /// How long a record may wait for the broker's ack before its outcome counts as unknown.
    pub message_timeout: Duration,
    /// How long `poll` waits for the first record before returning an empty batch.
    pub poll_wait: Duration,
    /// Bound on metadata / offset calls to the broker.
    pub request_timeout: Duration,
    /// How every client (producer, consumers, admin) reaches the brokers.
    pub security: KafkaSecurity,
}

/// librdkafka's `security.protocol` and what goes with it: TLS files for `ssl` / `sasl_ssl`,
/// a SASL mechanism and credentials for `sasl_plaintext` / `sasl_ssl`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    pub tls: Option<TlsFiles>,
    pub sasl: Option<Sasl>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (built into librdkafka; GSSAPI is not).
    pub mechanism: String,
    pub username: String,
    pub password: Secret,
}

impl KafkaSecurity {
    pub fn protocol(&self) -> &'static str {
        match (&self.tls, &self.sasl) {
            (None, None) => "plaintext",
            (Some(_), None) => "ssl",
            (None, Some(_)) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        }
    }
}

impl KafkaConfig {
    pub fn new(brokers: &str, topic: &str) -> Self {
        KafkaConfig {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            dlq_topic: format!("{topic}.dlq"),
            partitions: 6,
            replication: 1,
            min_insync_replicas: 1,
            message_timeout: Duration::from_secs(3),
            poll_wait: Duration::from_millis(500),
            request_timeout: Duration::from_secs(5),
            security: KafkaSecurity::default(),
        }
    }
}

#[derive(Clone)]
pub struct KafkaBus {
    cfg: Arc<KafkaConfig>,
    producer: FutureProducer<Health>,
    health: Health,
}

/// Whether the producer can reach a broker, as far as it knows: librdkafka's "all brokers down"
/// marks the bus down at once; a delivery or a probe that reached a broker marks it up again.
/// A merely slow broker never marks it down (its publishes time out as "outcome unknown").
#[derive(Clone, Default)]
pub struct Health {
    down: Arc<Mutex<Option<String>>>,
    /// The client's latest error of any kind (an SSL handshake or SASL failure, say): an admin
    /// or metadata call that times out names it, instead of a bare "timed out".
    last_error: Arc<Mutex<Option<String>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Health {
    /// `None`: a broker answered, and any earlier error is history.
    fn set(&self, down: Option<String>) {
        if down.is_none() {
            *locked(&self.last_error) = None;
        }
        *locked(&self.down) = down;
    }

    fn get(&self) -> Option<String> {
        locked(&self.down).clone()
    }

    /// `e`, with the client's latest error appended when there is one.
    fn explain(&self, op: &'static str, e: KafkaError) -> PortError {
        match locked(&self.last_error).clone() {
            Some(last) => {
                PortError::determinate(op, format!("{e} (latest client error: {last})")).caused_by(e)
            }
            None => kafka_err(op, e),
        }
    }
}

impl ClientContext for Health {
    /// librdkafka's own log lines (errors only: `log_level` 3). They come straight from its
    /// threads, unlike `error`, which an admin client's unpolled main queue never delivers: an SSL
    /// handshake or SASL failure is known here first.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if (level as i32) <= RDKafkaLogLevel::Error as i32 {
            *locked(&self.last_error) = Some(format!("{fac}: {message}"));
        }
        tracing::warn!(facility = fac, "librdkafka: {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let KafkaError::Global(RDKafkaErrorCode::AllBrokersDown) = error {
            self.set(Some(format!("no broker reachable ({reason})")));
        } else {
            *locked(&self.last_error) = Some(format!("{error}: {reason}"));
        }
        tracing::warn!(error = %error, reason, "kafka client error");
    }
}

fn client_config(cfg: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.brokers)
        // librdkafka logs to stderr by default; its errors reach us as results.
        .set("log_level", "3")
        .set("security.protocol", cfg.security.protocol());
    if let Some(tls) = &cfg.security.tls {
        // Unset: OpenSSL's default roots. The broker's name is checked against its certificate
        // (librdkafka's default `ssl.endpoint.identification.algorithm=https`).
        if let Some(ca) = &tls.ca {
            c.set("ssl.ca.location", ca.display().to_string());
        }
        if let Some((cert, key)) = &tls.client {
            c.set("ssl.certificate.location", cert.display().to_string())
                .set("ssl.key.location", key.display().to_string());
        }
    }
    if let Some(sasl) = &cfg.security.sasl {
        c.set("sasl.mechanisms", &sasl.mechanism)
            .set("sasl.username", &sasl.username)
            .set("sasl.password", &sasl.password.0);
    }
    c
}

fn kafka_err(op: &'static str, e: KafkaError) -> PortError {
    PortError::determinate_from(op, e)
}

/// Run a blocking librdkafka call on the blocking pool.
async fn blocking<T: Send + 'static>(
    op: &'static str,
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> PortResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| kafka_err(op, e)),
        Err(e) => Err(PortError::indeterminate_from(op, e)),
    }
}

impl KafkaBus {
    pub fn connect(cfg: KafkaConfig) -> PortResult<KafkaBus> {
        let health = Health::default();
        let producer: FutureProducer<Health> = client_config(&cfg)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", cfg.message_timeout.as_millis().to_string())
            // Bound the in-process queue: a full queue refuses (Determinate) instead of growing.
            .set("queue.buffering.max.messages", "100000")
            .set("linger.ms", "2")
            .create_with_context(health.clone())
            .map_err(|e| kafka_err("kafka producer", e))?;
        Ok(KafkaBus {
            cfg: Arc::new(cfg),
            producer,
            health,
        })
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.cfg
    }

    /// A blocking call on the producer's client; its failure names the client's latest error.
    async fn producer_call(
        &self,
        op: &'static str,
        f: impl FnOnce() -> Result<(), KafkaError> + Send + 'static,
    ) -> PortResult<()> {
        match tokio::task::spawn_blocking(f).await {
            Ok(r) => r.map_err(|e| self.health.explain(op, e)),
            Err(e) => Err(PortError::indeterminate_from(op, e)),
        }
    }

    /// An admin client, and its calls' options (the request timeout).
    fn admin(&self) -> PortResult<(AdminClient<DefaultClientContext>, AdminOptions)> {
        let admin = (client_config(&self.cfg).create()).map_err(|e| kafka_err("kafka admin", e))?;
        let opts = AdminOptions::new()
            .operation_timeout(Some(self.cfg.request_timeout))
            .request_timeout(Some(self.cfg.request_timeout));
        Ok((admin, opts))
    }

    /// Create the order topic and its DLQ with the configured partition count (existing topics
    /// are left as they are).
    pub async fn ensure_topics(&self) -> PortResult<()> {
        // Reach a broker first, through the producer: its errors (an SSL handshake, a SASL
        // login) are delivered to `Health`, while an admin client's are never polled and its
        // failure is a bare timeout. All topics' metadata: asking for ours could auto-create it
        // with the broker's defaults.
        let (producer, timeout) = (self.producer.clone(), self.cfg.request_timeout);
        self.producer_call("kafka metadata", move || {
            use rdkafka::producer::Producer;
            producer.client().fetch_metadata(None, timeout).map(drop)
        })
        .await?;
        let (admin, opts) = self.admin()?;
        let min_insync = self.cfg.min_insync_replicas.to_string();
        let topics = [&self.cfg.topic, &self.cfg.dlq_topic].map(|name| {
            NewTopic::new(
                name,
                self.cfg.partitions,
                TopicReplication::Fixed(self.cfg.replication),
            )
            .set("min.insync.replicas", &min_insync)
        });
        let results = admin
            .create_topics(&topics, &opts)
            .await
            .map_err(|e| kafka_err("create topics", e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(PortError::determinate(
                        "create topics",
                        format!("{topic}: {code}"),
                    ))
                }
            }
        }
        Ok(())
    }

    async fn send(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
        headers: Option<OwnedHeaders>,
    ) -> PortResult<()> {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if let Some(h) = headers {
            record = record.headers(h);
        }
        match self.producer.send(record, Duration::ZERO).await {
            Ok(_) => {
                self.health.set(None);
                Ok(())
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(PortError::determinate("publish", "producer queue full"))
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                Err(PortError::determinate("publish", "message too large"))
            }
            Err((e, _)) => Err(PortError::indeterminate_from("publish", e)),
        }
    }

    /// Wait until everything queued has been acknowledged (or failed): graceful shutdown.
    pub async fn flush(&self) -> PortResult<()> {
        use rdkafka::producer::Producer;
        let producer = self.producer.clone();
        let timeout = self.cfg.message_timeout;
        blocking("flush", move || producer.flush(timeout)).await
    }

    /// A consumer that commits nothing, for reading metadata, offsets and records by hand.
    fn reader(&self, op: &'static str, group: &str) -> PortResult<Arc<BaseConsumer>> {
        let consumer = client_config(&self.cfg)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .create()
            .map_err(|e| kafka_err(op, e))?;
        Ok(Arc::new(consumer))
    }

    /// Per-partition (low, high) watermarks of `topic`.
    async fn watermarks(&self, consumer: Arc<BaseConsumer>, topic: &str) -> PortResult<Vec<(i32, i64, i64)>> {
        let (topic, timeout) = (topic.to_string(), self.cfg.request_timeout);
        blocking("watermarks", move || {
            let md = consumer.fetch_metadata(Some(&topic), timeout)?;
            let partitions: Vec<i32> = md
                .topics()
                .iter()
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect();
            partitions
                .into_iter()
                .map(|p| {
                    consumer
                        .fetch_watermarks(&topic, p, timeout)
                        .map(|(lo, hi)| (p, lo, hi))
                })
                .collect()
        })
        .await
    }
}

impl OrderBus for KafkaBus {
    type Source = KafkaSource;

    async fn publish(&self, r: &Reservation) -> PortResult<()> {
        // The purchase's trace goes on with the record, when it is being traced.
        let headers = seckill_core::trace::current().map(|t| {
            OwnedHeaders::new().insert(Header {
                key: TRACEPARENT,
                value: Some(&t),
            })
        });
        self.send(&self.cfg.topic, &r.bus_key(), &r.encode(), headers)
            .await
    }

    async fn publish_raw(&self, key: &str, payload: &[u8]) -> PortResult<()> {
        self.send(&self.cfg.topic, key, payload, None).await
    }

    fn known_down(&self) -> Option<String> {
        self.health.get()
    }

    /// The topic's metadata through the producer's own client (no client is built per probe).
    async fn probe(&self) -> PortResult<()> {
        use rdkafka::producer::Producer;
        let (producer, topic, timeout) = (
            self.producer.clone(),
            self.cfg.topic.clone(),
            self.cfg.request_timeout,
        );
        let answer = self
            .producer_call("probe", move || {
                producer.client().fetch_metadata(Some(&topic), timeout).map(drop)
            })
            .await;
        self.health.set(answer.as_ref().err().map(|e| e.to_string()));
        answer
    }

    async fn lag(&self, group: &str) -> PortResult<u64> {
        let consumer = self.reader("lag", group)?;
        let marks = self.watermarks(consumer.clone(), &self.cfg.topic).await?;
        let mut tpl = TopicPartitionList::new();
        for &(p, _, _) in &marks {
            tpl.add_partition(&self.cfg.topic, p);
        }
        let timeout = self.cfg.request_timeout;
        let committed = blocking("lag", move || consumer.committed_offsets(tpl, timeout)).await?;
        let mut lag = 0u64;
        for (p, low, high) in marks {
            let at = match committed.find_partition(&self.cfg.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o.max(low),
                _ => low,
            };
            lag += (high - at).max(0) as u64;
        }
        Ok(lag)
    }

    /// Read by a consumer of no group (assigned one partition at a time, nothing committed).
    async fn dead_letters(&self, from: (u32, u64), limit: usize) -> PortResult<DeadLetterPage> {
        let consumer = self.reader("dead letters", DEAD_LETTER_READER)?;
        let marks = self.watermarks(consumer.clone(), &self.cfg.dlq_topic).await?;
        let total = marks.iter().map(|&(_, lo, hi)| (hi - lo).max(0) as u64).sum();
        let ends = marks
            .iter()
            .map(|&(p, _, hi)| (p as u32, hi.max(0) as u64))
            .collect();
        let (topic, timeout) = (self.cfg.dlq_topic.clone(), self.cfg.request_timeout);
        let (letters, next) = blocking("dead letters", move || {
            let mut letters = Vec::new();
            for (p, lo, hi) in marks {
                let start = match p as u32 {
                    q if q < from.0 => continue,
                    q if q == from.0 => (from.1 as i64).max(lo),
                    _ => lo,
                };
                if start >= hi {
                    continue;
                }
                if letters.len() == limit {
                    return Ok((letters, Some((p as u32, start as u64))));
                }
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, p, Offset::Offset(start))?;
                consumer.assign(&tpl)?;
                let mut at = start;
                while at < hi {
                    if letters.len() == limit {
                        return Ok((letters, Some((p as u32, at as u64))));
                    }
                    let m = match consumer.poll(timeout) {
                        Some(m) => m?,
                        None => {
                            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut))
                        }
                    };
                    at = m.offset() + 1;
                    letters.push(dead_letter_of(&m));
                }
            }
            Ok((letters, None))
        })
        .await?;
        Ok(DeadLetterPage {
            letters,
            total,
            next,
            ends,
        })
    }

    async fn purge_dead_letters(&self, before: &[(u32, u64)]) -> PortResult<u64> {
        let (admin, opts) = self.admin()?;
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in before {
            tpl.add_partition_offset(&self.cfg.dlq_topic, p as i32, Offset::Offset(o as i64))
                .map_err(|e| kafka_err("purge dead letters", e))?;
        }
        let consumer = self.reader("purge dead letters", DEAD_LETTER_READER)?;
        let marks = self.watermarks(consumer, &self.cfg.dlq_topic).await?;
        let was: std::collections::BTreeMap<i32, i64> = marks.into_iter().map(|(p, lo, _)| (p, lo)).collect();
        let done = admin
            .delete_records(&tpl, &opts)
            .await
            .map_err(|e| kafka_err("purge dead letters", e))?;
        let mut purged = 0;
        for e in done.elements() {
            e.error().map_err(|e| kafka_err("purge dead letters", e))?;
            if let Offset::Offset(now) = e.offset() {
                purged += (now - was.get(&e.partition()).copied().unwrap_or(now)).max(0) as u64;
            }
        }
        Ok(purged)
    }

    async fn subscribe(&self, group: &str) -> PortResult<KafkaSource> {
        let consumer: StreamConsumer = client_config(&self.cfg)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("enable.partition.eof", "false")
            .create()
            .map_err(|e| kafka_err("subscribe", e))?;
        consumer
            .subscribe(&[&self.cfg.topic])
            .map_err(|e| kafka_err("subscribe", e))?;
        let mut source = KafkaSource {
            bus: self.clone(),
            consumer: Arc::new(consumer),
            early: Vec::new(),
        };
        source.await_ready(group).await?;
        Ok(source)
    }
}

/// One member of the consumer group.
pub struct KafkaSource {
    bus: KafkaBus,
    consumer: Arc<StreamConsumer>,
    /// Records received while waiting for the first assignment, handed out by the next poll.
    early: Vec<Delivery>,
}

/// A record's header, as text.
fn header(m: &rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    m.headers()
        .and_then(|h| h.iter().find(|h| h.key == name))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// A dead letter as `dead_letter` wrote it: the reason and the origin in its headers.
fn dead_letter_of(m: &rdkafka::message::BorrowedMessage<'_>) -> DeadLetter {
    let d = delivery_of(m);
    DeadLetter {
        partition: d.partition,
        offset: d.offset,
        origin: header(m, "origin").unwrap_or_default(),
        key: d.key,
        payload: d.payload,
        reason: header(m, "reason").unwrap_or_default(),
    }
}

fn delivery_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Delivery {
    Delivery {
        partition: m.partition() as u32,
        offset: m.offset() as u64,
        key: m
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .unwrap_or_default(),
        payload: m.payload().unwrap_or_default().to_vec(),
        trace: header(m, TRACEPARENT),
    }
}

/// The group id of the dead-letter reader (it assigns partitions itself and never commits).
const DEAD_LETTER_READER: &str = "seckill-dead-letter-reader";

/// The record header carrying the publisher's trace context (W3C Trace Context's name).
const TRACEPARENT: &str = "traceparent";

impl KafkaSource {
    /// Joining a group takes a rebalance, and fetching starts only after it; a source that
    /// returned before then would poll empty batches and look drained. So: wait for an
    /// assignment, and if the group has a backlog, for its first record (bounded: with other
    /// members, the backlog may be theirs).
    async fn await_ready(&mut self, group: &str) -> PortResult<()> {
        let deadline = tokio::time::Instant::now() + self.bus.cfg.request_timeout * 2;
        let mut backlog = None;
        while tokio::time::Instant::now() < deadline && self.early.is_empty() {
            let assigned = self
                .consumer
                .assignment()
                .map_err(|e| kafka_err("subscribe", e))?;
            if assigned.count() > 0 {
                if backlog.is_none() {
                    backlog = Some(self.bus.lag(group).await?);
                }
                if backlog == Some(0) {
                    return Ok(());
                }
            }
            // Driving recv is what lets librdkafka serve the rebalance and the first fetch.
            if let Ok(m) = tokio::time::timeout(Duration::from_millis(100), self.consumer.recv()).await {
                let m = m.map_err(|e| kafka_err("subscribe", e))?;
                self.early.push(delivery_of(&m));
            }
        }
        if backlog.is_none() && self.early.is_empty() {
            return Err(PortError::determinate(
                "subscribe",
                "no partitions assigned in time",
            ));
        }
        Ok(())
    }
}

impl KafkaSource {
    /// Records in the assigned partitions past this member's position (the next record it would
    /// deliver: after the last delivered one, or the committed offset). Zero if unknown.
    async fn undelivered(&self) -> u64 {
        let consumer = self.consumer.clone();
        let (topic, timeout) = (self.bus.cfg.topic.clone(), self.bus.cfg.request_timeout);
        let count = blocking("position", move || {
            let positions = consumer.position()?;
            let committed = consumer.committed(timeout)?;
            let mut pending = 0u64;
            for e in positions.elements_for_topic(&topic) {
                let (low, high) = consumer.fetch_watermarks(&topic, e.partition(), timeout)?;
                let at = match (
                    e.offset(),
                    committed
                        .find_partition(&topic, e.partition())
                        .map(|c| c.offset()),
                ) {
                    (Offset::Offset(o), _) | (_, Some(Offset::Offset(o))) => o,
                    _ => low,
                };
                pending += (high - at.max(low)).max(0) as u64;
            }
            Ok(pending)
        });
        count.await.unwrap_or(0)
    }
}

impl OrderSource for KafkaSource {
    async fn poll(&mut self, max: usize) -> PortResult<Vec<Delivery>> {
        let max = max.max(1);
        let mut batch: Vec<Delivery> = std::mem::take(&mut self.early);
        let deadline = tokio::time::Instant::now() + self.bus.cfg.request_timeout;
        while batch.is_empty() {
            match tokio::time::timeout(self.bus.cfg.poll_wait, self.consumer.recv()).await {
                Ok(Err(e)) => return Err(kafka_err("poll", e)),
                Ok(Ok(m)) => batch.push(delivery_of(&m)),
                // Empty means "nothing to deliver", not "the fetcher is behind": while the assigned
                // partitions hold records not yet delivered, keep waiting (bounded).
                Err(_) if tokio::time::Instant::now() < deadline && self.undelivered().await > 0 => {}
                Err(_) => return Ok(Vec::new()),
            }
        }
        // Then whatever is already fetched, without waiting. An error after the first record
        // ends the batch instead of dropping what was taken: the consumer's position is past
        // those records already, so the batch goes on to the ledger (the error, if it lasts,
        // comes back on the next poll).
        while batch.len() < max {
            match self.consumer.recv().now_or_never() {
                Some(Ok(m)) => batch.push(delivery_of(&m)),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "poll: an error after {} records ends the batch", batch.len());
                    break;
                }
                None => break,
            }
        }
        Ok(batch)
    }

    async fn commit(&mut self, batch: &[Delivery]) -> PortResult<()> {
        let mut next: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for d in batch {
            let e = next.entry(d.partition).or_default();
            *e = (*e).max(d.offset + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in next {
            tpl.add_partition_offset(&self.bus.cfg.topic, p as i32, Offset::Offset(o as i64))
                .map_err(|e| kafka_err("commit", e))?;
        }
        let consumer = self.consumer.clone();
        blocking("commit", move || consumer.commit(&tpl, CommitMode::Sync)).await
    }

    async fn dead_letter(&mut self, d: &Delivery, reason: &str) -> PortResult<()> {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "origin",
                value: Some(&format!("{}/{}@{}", self.bus.cfg.topic, d.partition, d.offset)),
            });
        self.bus
            .send(&self.bus.cfg.dlq_topic, &d.key, &d.payload, Some(headers))
            .await
    }

    async fn rewind(&mut self) -> PortResult<()> {
        self.early.clear();
        let consumer = self.consumer.clone();
        let timeout = self.bus.cfg.request_timeout;
        blocking("rewind", move || {
            let committed = consumer.committed(timeout)?;
            let mut tpl = TopicPartitionList::new();
            for e in committed.elements() {
                let to = match e.offset() {
                    Offset::Offset(o) => Offset::Offset(o),
                    _ => Offset::Beginning,
                };
                tpl.add_partition_offset(e.topic(), e.partition(), to)?;
            }
            // No partition assigned (a rebalance took them, or the session expired and the
            // assignment was lost): nothing to seek — a partition assigned later starts at the
            // group's committed offset. librdkafka refuses to seek an empty list (_INVALID_ARG),
            // and a consumer that polls nothing after a failed rewind would never get its
            // partitions back (the real-store nemesis: both workers stopped for good).
            if tpl.count() == 0 {
                return Ok(());
            }
            // A seek refused for one partition is reported in its element, not as the call's
            // error: a rewind that left any partition where it was has failed (the consumer then
            // polls nothing until one succeeds).
            let seeked = consumer.seek_partitions(tpl, timeout)?;
            seeked.elements().iter().try_for_each(|e| e.error())
        })
        .await
    }
}
