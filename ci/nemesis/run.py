"""The real-store nemesis (DESIGN §13): the production topology on replicated stores, sales
driven by an independent client, a seeded schedule of overlapping faults, and a checker that
trusts nothing of the engine. ci/nemesis.sh starts the stores and runs this; see docs/nemesis.md.

The same seed gives the same schedule (faults, targets, times, holds) and the same buyers, not
the same interleaving: the stores and the engine run in real time."""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import threading
import time

import checker
import client
from commits import Watch
import procs
import report

# Fault kinds: (weight, hold range in seconds). Holds past the engine's timeouts where that is
# the point: a jobs runner stopped past its recovery lease (20 s), a worker past its Kafka
# session (6 s), an API process past the producer's delivery timeout (3 s), MariaDB past the
# lock wait (3 s).
FAULTS = {
    "proc_kill": (4, (1, 6)),
    "proc_pause": (3, None),
    "net_partition": (3, (2, 8)),
    "net_reset": (2, (1, 3)),
    "redis_replies_lost": (2, (1, 3)),
    "redis_lagging_failover": (2, (1, 3)),
    "redis_kill": (1, (2, 6)),
    "redis_restart_empty": (1, (1, 3)),
    "kafka_kill": (2, (3, 10)),
    "kafka_pause": (1, (3, 8)),
    "mariadb_kill": (2, (2, 8)),
    "mariadb_pause": (1, (2, 6)),
    "clock_skew": (1, (5, 15)),
    # Aimed at the windows a recovery opens (see Nemesis.zombie_api and zombie_jobs): the hold is
    # how long the shard stays down, and how far into its recovery the claimant is frozen.
    "zombie_api": (2, (1, 3)),
    "zombie_jobs": (2, (0, 5)),
    # A worker killed while its batch waits on a stopped MariaDB: the hold is how long MariaDB
    # stays stopped after the kill.
    "worker_mid_batch": (2, (2, 6)),
}
# The engine's long fault points (seckill_core::planted::Site), for --planted runs.
LONG_STALLS = ["recovery_close", "recovery_bump", "recovery_rebuild", "recovery_reopen", "recovery_finish",
               "rebalance_look", "rebalance_take"]
PAUSE_HOLD = {"api": (4, 8), "worker": (7, 10), "jobs": (21, 25)}
STORE_OF = {"redis": None, "kafka": [19092, 19093, 19094], "mariadb": [3307]}


def groups(kind, target, topology):
    """Faults of one group never overlap: one store's (two Kafka brokers down halts every
    publish; both nodes of a Redis shard down is `redis_restart_empty`'s job), or one process's
    kills, pauses and restarts (a network fault may overlap them). A zombie fault holds Redis and
    its processes (every jobs runner: it decides which one recovers)."""
    store = kind.split("_")[0]
    if store in ("redis", "kafka", "mariadb"):
        return {store}
    if kind == "zombie_api":
        return {"redis", target.split("~")[0]}
    if kind == "worker_mid_batch":
        return {"mariadb", target}
    if kind == "zombie_jobs":
        return {"redis"} | {p.name for p in topology.of("jobs")}
    return {target.split("@")[0]} if kind in ("proc_kill", "proc_pause", "clock_skew") else set()


def schedule(seed, rounds, active, topology, aim=None):
    """The whole run's faults: (round, at seconds into the round, kind, target, hold). `aim`: a
    kind every round begins with (a test of one window, as a planted bug needs)."""
    rng = random.Random(seed)
    kinds = list(FAULTS)
    weights = [FAULTS[k][0] for k in kinds]
    out = []
    for r in range(rounds):
        t, busy, aimed = rng.uniform(1, 3), {}, not aim
        while t < active:
            kind = rng.choices(kinds, weights)[0] if aimed else aim
            if kind == "zombie_api" and t > 5:
                continue  # only in the burst: its purchases in flight are what it freezes
            if kind == "worker_mid_batch":
                target, hold = rng.choice(topology.of("worker")).name, rng.uniform(*FAULTS[kind][1])
            elif kind in ("proc_kill", "proc_pause", "net_partition", "net_reset", "clock_skew"):
                p = rng.choice(topology.procs)
                target = p.name
                if kind == "proc_pause":
                    hold = rng.uniform(*PAUSE_HOLD[p.role])
                elif kind.startswith("net_"):
                    target = f"{p.name}>{rng.choice(['redis', 'kafka', 'mariadb'])}"
                    hold = rng.uniform(*FAULTS[kind][1])
                else:
                    hold = rng.uniform(*FAULTS[kind][1])
                if kind == "clock_skew":
                    target = f"{p.name}@{rng.choice([-1, 1]) * rng.randint(2, 20)}s"
            elif kind.startswith("zombie"):
                role = kind.split("_")[1]
                target = f"{rng.choice(topology.of(role)).name}~master#{rng.randrange(3)}"
                hold = rng.uniform(*FAULTS[kind][1])
            elif kind.startswith("redis"):
                target, hold = f"master#{rng.randrange(3)}", rng.uniform(*FAULTS[kind][1])
            elif kind.startswith("kafka"):
                target = rng.choice(["leader", "broker"])
                target = f"{target}#{rng.randrange(6) if target == 'leader' else rng.randrange(1, 4)}"
                hold = rng.uniform(*FAULTS[kind][1])
            else:
                target, hold = "mariadb", rng.uniform(*FAULTS[kind][1])
            gs = groups(kind, target, topology)
            if any(busy.get(g, 0) > t for g in gs):
                t += rng.expovariate(1 / 2.5)
                continue
            # A zombie fault lasts until a recovery finished (up to about 50 s), not its hold.
            for g in gs:
                busy[g] = t + (50 if kind.startswith("zombie") else hold + 3)
            out.append(dict(round=r, at=round(t, 2), kind=kind, target=target, hold=round(hold, 2)))
            aimed = True
            t += rng.expovariate(1 / 4.0)
    return out


class Nemesis:
    """Injects the faults, records when each began and ended, and heals."""

    def __init__(self, stores, topology, net, event, db, buckets):
        self.stores, self.topology, self.net, self.event = stores, topology, net, event
        self.db, self.buckets = db, buckets  # the raw reads the zombie faults aim by
        self.activity = None  # the round's sale
        self.timeline = []  # {kind, target, t0, t1}
        self.losses = []  # times Redis may have lost acknowledged writes
        self.kills = []  # (proc name, time)
        self.lock = threading.Lock()
        # One lock per group (`groups`): the schedule keeps a group's faults apart by their
        # planned holds, but a fault may outlast its hold (a node slow to rejoin); the next of
        # its group then waits for it instead of meeting it half done.
        self.group_locks = {}

    def proc(self, name):
        return next(p for p in self.topology.procs if p.name == name)

    def store_ports(self, store):
        return self.stores.redis_ports() if store == "redis" else STORE_OF[store]

    def master(self, target):
        masters = self.stores.redis_masters()
        return masters[int(target.split("#")[1]) % len(masters)]

    def generation(self):
        """The ledger's generation of the round's sale (-1: not known now, MariaDB down)."""
        try:
            g = self.db.generation(self.activity)
        except Exception:
            return -1
        return -1 if g is None else g

    def recovering(self):
        """Whether a recovery claim holds a gate of the round's sale closed now."""
        return any(g and g["state"] == "recovering" for g in self.db.gates(self.activity, self.buckets).values())

    @staticmethod
    def wait_for(cond, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if cond():
                return True
            time.sleep(0.2)
        return False

    def restart_empty(self, target, hold):
        """A shard's master and its replica killed and started again empty, `hold` seconds later."""
        port = self.master(target)
        replica = self.stores.run("redis", "replica-of", str(port))
        self.stores.run("redis", "kill", replica)
        self.stores.run("redis", "kill", str(port))
        self.losses.append(time.time())
        time.sleep(hold)
        self.stores.run("redis", "restart", str(port))
        self.stores.run("redis", "restart", replica)
        return f"{port} and its replica {replica} restarted empty"

    def zombie_api(self, p, master, hold):
        """An API process frozen mid-sale (reserve replies waiting in its sockets) across a
        shard's loss and the whole recovery after it, then thawed: it publishes reservations of
        the generation the recovery ended — the ledger must refuse them (DESIGN §11.3)."""
        g0 = self.generation()
        p.signal(signal.SIGSTOP)
        try:
            time.sleep(0.2)
            if g0 < 0:
                self.wait_for(lambda: self.generation() >= 0, 10)
                g0 = self.generation()
            detail = self.restart_empty(master, hold)
            bumped = self.wait_for(lambda: self.generation() > g0 >= 0, 45)
            return f"{detail}; thawed at generation {self.generation()} (from {g0}{'' if bumped else ', not moved in 45 s'})"
        finally:
            p.signal(signal.SIGCONT)

    def zombie_jobs(self, a, master, hold):
        """A jobs runner frozen in the middle of its recovery past its lease, then thawed once
        its successor finished: it resumes at whatever step the freeze caught it (waiting out
        the publish window, rescuing, bumping, rebuilding, reopening) — the fences must stop it.
        The other runners are held stopped until it claimed, so that the claimant is `a`."""
        others = [p for p in self.topology.of("jobs") if p is not a]
        for p in others:
            p.signal(signal.SIGSTOP)
        frozen = False
        try:
            detail = self.restart_empty(master, 1.0)
            if not self.wait_for(self.recovering, 30):
                return f"{detail}; no recovery claimed within 30 s"
            g1 = self.generation()  # read while the claimant waits out the publish window
            time.sleep(hold)
            if not self.recovering():
                return f"{detail}; the recovery finished within {hold:.1f} s, before the freeze"
            a.signal(signal.SIGSTOP)
            frozen = True
            for p in others:
                p.signal(signal.SIGCONT)
            # Its successor takes the claim over once the lease ran out (20 s), then recovers.
            done = self.wait_for(lambda: self.generation() > max(g1, 0) and not self.recovering(), 50)
            return (f"{detail}; {a.name} frozen {hold:.1f} s into its recovery, thawed "
                    f"{'after its successor recovered' if done else 'with no successor done in 50 s'} "
                    f"(generation {g1} -> {self.generation()})")
        finally:
            for p in others + ([a] if frozen else []):
                p.signal(signal.SIGCONT)

    def run(self, f):
        """One fault, start to end (blocking: each runs on its own thread), once the faults of
        its groups before it have ended."""
        with self.lock:
            locks = [self.group_locks.setdefault(g, threading.Lock())
                     for g in sorted(groups(f["kind"], f["target"], self.topology))]
        for lock in locks:
            lock.acquire()
        try:
            self.inject(f)
        finally:
            for lock in reversed(locks):
                lock.release()

    def inject(self, f):
        kind, target, hold = f["kind"], f["target"], f["hold"]
        t0 = time.time()
        detail, failed = "", None
        try:
            if kind == "proc_kill":
                p = self.proc(target)
                p.held = True
                p.kill()
                self.kills.append((p.name, time.time()))
                time.sleep(hold)
                p.held = False
                p.start()
            elif kind == "proc_pause":
                p = self.proc(target)
                p.held = True
                p.signal(signal.SIGSTOP)
                time.sleep(hold)
                p.signal(signal.SIGCONT)
                p.held = False
            elif kind in ("net_partition", "net_reset"):
                name, store = target.split(">")
                specs = self.net.partition(self.proc(name), self.store_ports(store), reset=kind == "net_reset")
                time.sleep(hold)
                for s in specs:
                    self.net.remove(s)
            elif kind == "redis_replies_lost":
                port = self.master(target)
                detail = str(port)
                specs = self.net.replies_lost([port])
                time.sleep(hold)
                for s in specs:
                    self.net.remove(s)
            elif kind == "redis_lagging_failover":
                port = self.master(target)
                detail = self.stores.run("redis", "lagging-failover", str(port), str(int(hold * 1000)))
                self.losses.append(time.time())
                self.stores.run("redis", "restart", str(port))
            elif kind == "redis_kill":
                port = self.master(target)
                detail = str(port)
                self.stores.run("redis", "kill", str(port))
                # Replication is asynchronous: the replica promoted may lack the last writes.
                self.losses.append(time.time())
                time.sleep(hold)
                self.stores.run("redis", "restart", str(port))
            elif kind == "redis_restart_empty":
                detail = self.restart_empty(target, hold)
            elif kind in ("zombie_api", "zombie_jobs"):
                name, master = target.split("~")
                procs_ = [self.proc(name)] + (self.topology.of("jobs") if kind == "zombie_jobs" else [])
                for p in procs_:
                    p.held = True
                try:
                    zombie = self.zombie_api if kind == "zombie_api" else self.zombie_jobs
                    detail = zombie(self.proc(name), master, hold)
                finally:
                    for p in procs_:
                        p.held = False
            elif kind in ("kafka_kill", "kafka_pause"):
                what, n = target.split("#")
                node = (self.stores.run("kafka", "leader", "seckill.orders", n) if what == "leader" else n)
                detail = f"node {node}"
                if kind == "kafka_kill":
                    self.stores.run("kafka", "kill", node)
                    time.sleep(hold)
                    self.stores.run("kafka", "restart", node)
                else:
                    self.stores.run("kafka", "pause", node)
                    time.sleep(hold)
                    self.stores.run("kafka", "resume", node)
            elif kind == "worker_mid_batch":
                p = self.proc(target)
                p.held = True
                self.stores.run("mariadb", "pause")
                try:
                    # Its batches meanwhile polled (and, were it committing before applying,
                    # committed) wait on MariaDB: the kill takes them mid-apply.
                    time.sleep(1.5)
                    p.kill()
                    self.kills.append((p.name, time.time()))
                    time.sleep(hold)
                finally:
                    self.stores.run("mariadb", "resume")
                    time.sleep(1)
                    p.held = False
                    p.start()
            elif kind == "mariadb_kill":
                self.stores.run("mariadb", "kill")
                time.sleep(hold)
                self.stores.run("mariadb", "restart")
            elif kind == "mariadb_pause":
                self.stores.run("mariadb", "pause")
                time.sleep(hold)
                self.stores.run("mariadb", "resume")
            elif kind == "clock_skew":
                name, skew = target.split("@")
                p = self.proc(name)
                p.held = True
                p.kill()
                self.kills.append((p.name, time.time()))
                p.skew = ("+" if not skew.startswith("-") else "") + skew
                p.start()
                p.held = False
                time.sleep(hold)
                p.held = True
                p.kill()
                self.kills.append((p.name, time.time()))
                p.skew = None
                p.start()
                p.held = False
        except Exception as e:  # a fault that could not be injected is reported, not hidden
            failed = str(e)
        t1 = time.time()
        # The error's end is what says why; the word FAILED leads, whatever is cut.
        detail = f"FAILED: {failed[-190:]}" if failed else detail.strip()[-200:]
        with self.lock:
            self.timeline.append(dict(f, t0=t0, t1=t1, detail=detail, failed=failed is not None))
        self.event(f"fault {kind} {target} {hold:.1f}s done {detail if failed else detail[-120:]}")

    def heal(self):
        self.net.heal()
        for p in self.topology.procs:
            p.signal(signal.SIGCONT)
            p.held = False
            p.skew = None
        # Every node running and resumed: each script's `start` is idempotent (it starts what is
        # down; Kafka's also resumes a paused node).
        for port in self.stores.redis_ports():
            self.stores.run("redis", "resume", str(port), check=False)
        self.stores.run("mariadb", "resume", check=False)
        for store in ("redis", "kafka", "mariadb"):
            self.stores.run(store, "start")


class Scraper:
    """Every API process's queued-purchase counter, each second, per incarnation (a restarted
    process counts from zero): its value when the round began (0 for one started since), its
    last value and when that was read."""

    def __init__(self, topology):
        self.topology = topology
        self.base, self.last = {}, {}  # (name, pid) -> value; (name, pid) -> (value, time)
        self.stop = False

    def scrape(self):
        import urllib.request
        for p in self.topology.of("api"):
            if not p.alive():
                continue
            try:
                with urllib.request.urlopen(f"{p.admin_base}/metrics", timeout=1) as r:
                    text = r.read().decode()
            except Exception:
                continue
            m = re.search(r'^seckill_purchases_total\{[^}]*outcome="queued"[^}]*\} (\d+)', text, re.M)
            self.last[(p.name, p.popen.pid)] = (int(m.group(1)) if m else 0, time.time())

    def loop(self):
        while not self.stop:
            self.scrape()
            time.sleep(1)

    def round_start(self):
        self.last = {}
        self.scrape()
        self.base = {k: v for k, (v, _) in self.last.items()}

    def bounds(self, hist, kills, started):
        """(lo, hi, counted): the queued purchases the API processes counted in the round, and
        the bounds the history sets: its 202s, less those a killed process may have counted
        after its last scrape (never read back: sent to it before the kill, answered after that
        scrape — the client may note an answer well after the process sent it, past the kill,
        on a busy box), plus the purchases that got no answer (which the engine may have
        counted queued)."""
        self.scrape()
        counted = sum(v - self.base.get(k, 0) for k, (v, _) in self.last.items())
        purchases = [o for o in hist if o["op"] == "purchase"]
        told = sum(1 for o in purchases if o.get("status") == 202)
        missed = 0
        for name, at in kills:
            read = max((w for (n, _), (_, w) in self.last.items() if n == name and w <= at), default=started)
            missed += sum(1 for o in purchases if o.get("status") == 202 and o["proc"] == name
                          and o["t0"] <= at and o["t1"] >= read)
        unanswered = sum(1 for o in purchases if o.get("status") is None)
        return told - missed, told + unanswered, counted


def cpu_sampler(samples, stop):
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    prev = read()
    while not stop.is_set():
        time.sleep(1)
        cur = read()
        total, idle = cur[0] - prev[0], cur[1] - prev[1]
        samples.append((time.time(), 1 - idle / total if total else 0))
        prev = cur


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--stock", type=int, default=400)
    ap.add_argument("--users", type=int, default=1200)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--sale-seconds", type=float, default=30)
    ap.add_argument("--aim", choices=list(FAULTS), help="a fault every round begins with")
    ap.add_argument("--long-stall", choices=LONG_STALLS,
                    help="with --planted: the long fault point the first jobs runner arms, and no other "
                         "(else one drawn for each)")
    args = ap.parse_args()
    args.planted = os.environ.get("SECKILL_PLANTED")
    args.stalls = os.environ.get("SECKILL_NEMESIS_STALLS") == "1"

    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(args.dir, "run")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    events = open(os.path.join(out, "events.log"), "w")
    started = time.time()

    def event(msg):
        line = f"{time.time() - started:8.2f}s {msg}"
        events.write(line + "\n")
        events.flush()
        print(line, flush=True)

    stores = procs.Stores(here, args.dir)
    cfg = dict(
        audience="seckill", jwt_secret="nemesis-jwt-secret-7f3a91c4e2b85d06",
        admin_token="nemesis-admin-token-5b9e2d7c", payment_secret="nemesis-payment-4c8e1a7f",
        price=1999, attempts=8, pay_ratio=0.6, cancel_ratio=0.1, connections=256,
        concurrency=400, burst_seconds=3.0,
    )
    env = dict(
        os.environ,
        SECKILL_REDIS_CLUSTER="1", REDIS_CLUSTER_NODES=stores.redis_nodes(),
        KAFKA_BROKERS=stores.kafka_brokers(), DATABASE_URL=stores.mariadb_url(),
        SECKILL_TOPIC="seckill.orders", SECKILL_TOPIC_REPLICATION="3",
        SECKILL_ADMIN_TOKEN=cfg["admin_token"], SECKILL_TOKEN_SECRET="nemesis-token-secret-2d6f8a1c9e3b5d7f0a4c",
        SECKILL_JWT_SECRET=cfg["jwt_secret"], SECKILL_JWT_AUDIENCE=cfg["audience"],
        SECKILL_PAYMENT_SECRET=cfg["payment_secret"], SECKILL_LOG="warn",
    )
    for k in ("REDIS_URL", "SECKILL_REQUIRE_SERVICES", "SECKILL_NEMESIS_STALLS"):
        env.pop(k, None)
    topology = procs.Topology(args.bin, env, os.path.join(out, "logs"))
    if args.stalls:
        # The engine's fault points (DESIGN §9 v2), armed in each process with a seed of its own:
        # it pauses itself exactly where a pause hurts most, which no signal from outside can aim
        # at. Of the long ones (far past the recovery lease, once per process), one site per jobs
        # runner: more would keep every recovery waiting out one after another.
        for i, p in enumerate(topology.procs):
            seed = args.seed * 100 + i
            site = "" if p.role != "jobs" else random.Random(seed).choice(LONG_STALLS) if not args.long_stall \
                else args.long_stall if p is topology.of("jobs")[0] else ""
            p.env = dict(env, SECKILL_STALLS=f"{seed}:{site}")
            event(f"{p.name}: SECKILL_STALLS={p.env['SECKILL_STALLS']}")
    net = procs.Net()
    # Raw reads of their own for the nemesis and the watcher below (each on its own threads).
    nemesis = Nemesis(stores, topology, net, event, checker.Stores(stores.mariadb_url(), stores.redis_nodes()),
                      args.buckets)
    rng = random.Random(args.seed)
    history = client.History(os.path.join(out, "history.jsonl"))
    open(history.path, "w").close()
    buyer = client.Client(cfg, topology, history, rng)
    db = checker.Stores(stores.mariadb_url(), stores.redis_nodes())
    watch_db = checker.Stores(stores.mariadb_url(), stores.redis_nodes())

    # Each round: a sale with faults through it (active), then the heal and the settle (a round
    # takes about active + 25 s). The schedule covers as many rounds as could fit; a round starts
    # while the time left holds one.
    active = args.sale_seconds + 10
    budget = args.minutes * 60
    rounds = max(1, int(budget // (active + 25)))
    plan = schedule(args.seed, rounds, active, topology, args.aim)
    if args.planted:
        event(f"PLANTED: {args.planted} (every process): this run must fail")
    if args.stalls:
        event("the engine's fault points are armed in every process (SECKILL_STALLS)")
    event(f"seed {args.seed}: up to {rounds} rounds of {active:.0f} s under faults; schedule:")
    for f in plan:
        event(f"  round {f['round']} +{f['at']:6.2f}s {f['kind']:<24} {f['target']:<22} hold {f['hold']:.2f}s")

    cpu, stop_cpu = [], threading.Event()
    threading.Thread(target=cpu_sampler, args=(cpu, stop_cpu), daemon=True).start()
    event("starting the engine: 3 api, 2 worker, 2 jobs")
    topology.start()
    # The consumer's commits against the ledger, watched live (the engine created the topic).
    commits = Watch(stores.kafka_brokers(), env["SECKILL_TOPIC"], stores.mariadb_url(),
                    os.path.join(out, "commits"), event)
    commits.start()
    scraper = Scraper(topology)
    threading.Thread(target=scraper.loop, daemon=True).start()
    supervising = threading.Event()

    def supervise():
        while not supervising.is_set():
            topology.supervise(event)
            time.sleep(0.5)
    threading.Thread(target=supervise, daemon=True).start()

    results = []
    base_activity = int(time.time()) % 100000 * 100
    for r in range(rounds):
        if r > 0 and time.time() - started + active + 25 > budget:
            event(f"round {r}: no time left for another round")
            break
        activity = base_activity + r + 1
        now_ms = int(time.time() * 1000)
        spec = dict(id=activity, total_stock=args.stock, buckets=args.buckets, fallback_pct=10,
                    start_ms=now_ms, end_ms=now_ms + int((active + 30) * 1000),
                    pay_timeout_ms=8000, unit_price_minor=cfg["price"])
        # Every other round is skewed: 60% of the buyers route to two buckets (the engine's
        # routing, reimplemented by the checker), so that the rebalancer moves stock all sale long.
        hot = (0, 1) if r % 2 else ()
        users = []
        while len(users) < args.users:
            u = rng.randrange(1, 1 << 40)
            if not hot or rng.random() >= 0.6 or checker.route(u, args.buckets) in hot:
                users.append(u)
        scraper.round_start()
        nemesis.kills, nemesis.activity = [], activity
        round_start = time.time()
        event(f"round {r}: sale {activity}, {args.stock} units, {len(users)} buyers"
              + (f", 60% routed to buckets {hot}" if hot else ""))
        bumps, gates_seen, watching = {}, [], threading.Event()

        def watch_generation(activity=activity, bumps=bumps, gates_seen=gates_seen, watching=watching):
            # Twice a second, its own SQL and raw Redis: each generation the ledger reaches, first
            # seen, and every open gate of another generation than the ledger's (S6; the ledger
            # read before and after the gates and unchanged, so that a bump in between is no
            # finding: the generation only grows).
            while not watching.is_set():
                try:
                    g = watch_db.generation(activity)
                    if g is not None:
                        bumps.setdefault(g, time.time())
                        gates = watch_db.gates(activity, args.buckets)
                        if watch_db.generation(activity) == g:
                            gates_seen += [(time.time(), b, x["generation"], g) for b, x in gates.items()
                                           if x and x["state"] == "open" and x["generation"] != g]
                except Exception:
                    pass  # MariaDB or a Redis shard down: the nemesis's doing
                time.sleep(0.5)
        threading.Thread(target=watch_generation, daemon=True).start()
        timers = [threading.Timer(f["at"], nemesis.run, args=(f,)) for f in plan if f["round"] == r]
        for t in timers:
            t.daemon = True
            t.start()
        asyncio.run(buyer.sale(activity, spec, users, args.sale_seconds))
        for t in timers:
            t.join(timeout=0)
        # The heal: every fault over (they end on their own), then everything back.
        deadline = time.time() + 60
        while any(t.is_alive() for t in timers) and time.time() < deadline:
            time.sleep(0.5)
        nemesis.heal()
        event(f"round {r}: healed; waiting for quiescence")
        settled = None
        q_deadline = time.time() + 150
        while time.time() < q_deadline:
            topology.supervise(event)
            a = asyncio.run(buyer.audit(activity))
            b = a.get("body") or {}
            if a.get("status") == 200 and b.get("r1_checked") and b.get("open_reservations") == 0:
                settled = a
                break
            time.sleep(2)
        event(f"round {r}: {'settled' if settled else 'NOT settled'} after {time.time() - round_start:.0f} s")
        asyncio.run(buyer.final_views(activity, users))
        # The engine's audit as an operator reads it: again after an answer that is no verdict
        # (a Redis call timed out under the load), as an operator would.
        for _ in range(5):
            audit = asyncio.run(buyer.audit(activity))
            if audit.get("status") == 200:
                break
            time.sleep(2)
        hist = [o for o in history.ops if o.get("round") == activity]
        ledger = db.ledger(activity)
        cache = db.cache(activity, ledger["n"])
        metrics = scraper.bounds(hist, nemesis.kills, round_start)
        watching.set()
        watched = dict(bumps=bumps, gates=gates_seen, generation=db.generation(activity), commits=commits)
        verdicts = checker.check(activity, history.ops, ledger, cache, nemesis.losses, audit, metrics, watched)
        if not settled:
            verdicts.append(("settled after the heal", ["no quiescence within 150 s"], ""))
        results.append(dict(round=r, activity=activity, t0=round_start, t1=time.time(), verdicts=verdicts))
        for name, v, note in verdicts:
            event(f"round {r}: {'ok ' if not v else 'VIOLATED'} {name} {note}")
            for x in v[:5]:
                event(f"    {x if isinstance(x, str) else x[0]}")
                if not isinstance(x, str):
                    for op in x[1]:
                        event(f"      {json.dumps(op)[:240]}")

    supervising.set()
    commits.stop()
    scraper.stop = True
    stop_cpu.set()
    history.write()
    topology.stop()
    ok = report.write(out, args, started, plan, nemesis.timeline, results, history.ops, cpu)
    event(f"report: {out}/report.txt, plot: {out}/sale.png")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
