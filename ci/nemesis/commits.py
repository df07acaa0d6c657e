"""C1, watched live: the order consumer's group never commits past a record the ledger has not
applied (DESIGN §6: the offset is committed after the batch's transaction). At the end of a round
nothing shows it — the reconciler republishes what a skipped record left open — so it is watched
as it happens: the topic read raw from its beginning, the group's committed offsets and then the
ledger read with its own SQL, once a second.

A record is applied when the ledger has a row with its reservation id (an order, or one failed
as stale or out of stock), or its user holds an order of the sale (a duplicate buyer leaves no
row of its own). The ledger is read after the offsets, so a commit that followed its batch's
transaction always finds the batch applied: what is missing was committed before it was applied,
or never applied at all.

It runs as a process of its own (`Watch` starts it and starts it again if it dies: librdkafka
has been seen to abort on an assertion while brokers are killed under it), and writes what it
finds to `<out>.jsonl` and how many polls it made to `<out>.polls`. Started again, it checks the
topic from its beginning once more: the ledger only grows, so that is sound."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

# The engine's consumer group (docs/configuration.md).
GROUP = "seckill-orders"


def watch(brokers, topic, mysql_url, out):
    from confluent_kafka import Consumer, TopicPartition

    import checker

    db = checker.Stores(mysql_url, None)
    quiet = {"bootstrap.servers": brokers, "log_level": 2, "enable.auto.commit": False}
    reader = Consumer(dict(quiet, **{"group.id": "nemesis-checker", "auto.offset.reset": "earliest"}))
    # The group's committed offsets, read as any member would (OffsetFetch; it never joins).
    offsets = Consumer(dict(quiet, **{"group.id": GROUP}))
    while True:
        try:
            parts = sorted(reader.list_topics(topic, timeout=5).topics[topic].partitions)
            break
        except Exception:
            time.sleep(1)
    reader.assign([TopicPartition(topic, p, 0) for p in parts])
    records, read_to, checked, polls = {}, {}, {}, 0
    found = open(out + ".jsonl", "a")
    while True:
        deadline = time.time() + 1
        while time.time() < deadline:
            m = reader.poll(0.2)
            if m is None or m.error():
                continue
            try:
                records[(m.partition(), m.offset())] = json.loads(m.value())
            except ValueError:
                pass  # not an order record: the engine dead-letters it; not ours to check
            read_to[m.partition()] = m.offset() + 1
        try:
            committed = {tp.partition: tp.offset
                         for tp in offsets.committed([TopicPartition(topic, p) for p in parts], timeout=5)
                         if tp.offset >= 0 and not tp.error}
            rows, holders = db.applied()
        except Exception:
            continue  # a broker or MariaDB down (the nemesis's doing): the next poll checks
        at = time.time()
        for p, c in committed.items():
            start = checked.get(p, 0)
            upto = min(c, read_to.get(p, 0))  # only what the reader has seen
            for off in range(start, upto):
                rec = records.get((p, off))
                if rec is None or rec["reservation_id"] in rows or (rec["activity_id"], rec["user_id"]) in holders:
                    continue
                found.write(json.dumps(dict(t=at, partition=p, offset=off, record=rec, committed=c)) + "\n")
                found.flush()
            checked[p] = max(start, upto)
        polls += 1
        with open(out + ".polls.tmp", "w") as f:
            f.write(str(polls))
        os.replace(out + ".polls.tmp", out + ".polls")


class Watch:
    """The watcher process, kept running; what it found, read back."""

    def __init__(self, brokers, topic, mysql_url, out, event):
        self.args = ["--brokers", brokers, "--topic", topic, "--mysql", mysql_url, "--out", out]
        self.out, self.event, self.proc, self.stopped = out, event, None, False
        self.earlier_polls = 0  # of the watchers that died

    def start(self):
        with open(self.out + ".log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *self.args], stderr=log)
        threading.Thread(target=self.keep, daemon=True).start()

    def keep(self):
        code = self.proc.wait()
        if not self.stopped:
            self.event(f"the commits watcher exited ({code}); started again")
            self.earlier_polls += self.polls()
            self.start()

    def stop(self):
        self.stopped = True
        if self.proc:
            self.proc.kill()

    def found(self):
        """Each record found once (a watcher started again may find one again)."""
        try:
            with open(self.out + ".jsonl") as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []
        return list({(r["partition"], r["offset"]): r for r in reversed(rows)}.values())

    def polls(self):
        """Polls of the group's offsets, by the watcher running now."""
        try:
            with open(self.out + ".polls") as f:
                return int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    for a in ("--brokers", "--topic", "--mysql", "--out"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    watch(a.brokers, a.topic, a.mysql, a.out)
