"""C1, watched live: the order consumer's group never commits past a record the ledger has not
applied (DESIGN §6: the offset is committed after the batch's transaction). At the end of a round
nothing shows it — the reconciler republishes what a skipped record left open — so it is watched
as it happens: the topic read raw from its beginning, the group's committed offsets and then the
ledger read with its own SQL, once a second.

A record is applied when the ledger has a row with its reservation id (an order, or one failed
as stale or out of stock), or its user holds an order of the sale (a duplicate buyer leaves no
row of its own). The ledger is read after the offsets, so a commit that followed its batch's
transaction always finds the batch applied: what is missing was committed before it was applied,
or never applied at all."""

import json
import threading
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

# The engine's consumer group and topic (docs/configuration.md).
GROUP = "seckill-orders"


class Commits:
    def __init__(self, brokers, topic, db):
        self.topic, self.db = topic, db
        # Quiet: a broker down is the nemesis's doing, not news (librdkafka logs at level ≤ 2 only).
        self.admin = AdminClient({"bootstrap.servers": brokers, "log_level": 2})
        self.reader = Consumer({"bootstrap.servers": brokers, "group.id": "nemesis-checker", "log_level": 2,
                                "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self.records = {}  # (partition, offset) -> decoded record
        self.read_to = {}  # partition -> next offset the reader will see
        self.checked = {}  # partition -> offsets below this were checked
        self.found = []  # (time, partition, offset, record, committed offset)
        self.polls = 0
        self.stop = threading.Event()

    def partitions(self):
        meta = self.reader.list_topics(self.topic, timeout=5).topics[self.topic]
        return sorted(meta.partitions)

    def committed(self, parts):
        from confluent_kafka import ConsumerGroupTopicPartitions
        req = ConsumerGroupTopicPartitions(GROUP, [TopicPartition(self.topic, p) for p in parts])
        res = self.admin.list_consumer_group_offsets([req], request_timeout=5)[GROUP].result(timeout=6)
        return {tp.partition: tp.offset for tp in res.topic_partitions if tp.offset >= 0 and not tp.error}

    def read(self, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            m = self.reader.poll(0.2)
            if m is None or m.error():
                continue
            try:
                rec = json.loads(m.value())
            except ValueError:
                rec = None  # not an order record: the engine dead-letters it; not ours to check
            self.records[(m.partition(), m.offset())] = rec
            self.read_to[m.partition()] = m.offset() + 1

    def check_once(self, parts):
        committed = self.committed(parts)
        rows, holders = self.db.applied()
        at = time.time()
        self.polls += 1
        for p, c in committed.items():
            start = self.checked.get(p, 0)
            upto = min(c, self.read_to.get(p, 0))  # only what the reader has seen
            for off in range(start, upto):
                rec = self.records.get((p, off))
                if rec is None:
                    continue  # compacted, a control record, or not an order
                if rec["reservation_id"] in rows or (rec["activity_id"], rec["user_id"]) in holders:
                    continue
                self.found.append((at, p, off, rec, c))
            self.checked[p] = max(start, upto)

    def loop(self):
        while not self.stop.is_set():
            try:
                parts = self.partitions()
                self.reader.assign([TopicPartition(self.topic, p, self.read_to.get(p, 0)) for p in parts])
                break
            except Exception:
                time.sleep(1)
        while not self.stop.is_set():
            self.read(1.0)
            try:
                self.check_once(parts)
            except Exception:
                pass  # a broker or MariaDB down (the nemesis's doing): the next poll checks
        self.reader.close()

    def start(self):
        threading.Thread(target=self.loop, daemon=True).start()
