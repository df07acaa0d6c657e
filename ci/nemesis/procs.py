"""The engine's processes as production runs them (`seckill serve --roles …`, release binary), each
in a cgroup of its own so that the nemesis can cut the network between one process and one store
(iptables' cgroup match on the process's own packets), and the stores' scripts."""

import os
import signal
import subprocess
import threading
import time
import urllib.request

CGROUP_ROOT = "/sys/fs/cgroup/unified"


def sh(*args, check=True, timeout=180):
    """Run one of the stores' scripts (or any command); its output, stripped."""
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return r.stdout.strip()


class Stores:
    """The replicated stores, through ci/nemesis/{redis,kafka,mariadb}.sh."""

    def __init__(self, here, state_dir):
        self.here, self.dir = here, state_dir

    def run(self, store, *args, check=True):
        return sh("bash", os.path.join(self.here, f"{store}.sh"), *args, "--dir", self.dir, check=check)

    def redis_nodes(self):
        return self.run("redis", "nodes")

    def redis_masters(self):
        return [int(p) for p in self.run("redis", "masters").split()]

    def redis_ports(self):
        return list(range(7300, 7306))

    def kafka_brokers(self):
        return self.run("kafka", "brokers")

    def mariadb_url(self):
        return self.run("mariadb", "url")


class Proc:
    """One `seckill serve` process: its role, listeners, log, cgroup; started again after a kill."""

    def __init__(self, name, role, port, admin, binary, env, log_dir):
        self.name, self.role, self.port, self.admin = name, role, port, admin
        self.binary, self.env, self.log_dir = binary, env, log_dir
        self.popen = None
        # The nemesis holds it down or stopped: the supervisor leaves it alone. Set and read
        # under the lock the supervisor's look-and-start takes, so that a fault's kill and the
        # supervisor's start never interleave (two instances, one on the ports, one orphaned).
        self._lock = threading.RLock()
        self._held = False
        self.skew = None  # a wall-clock offset (libfaketime) for its next start
        self.cgroup = f"nemesis/{name}"
        os.makedirs(os.path.join(CGROUP_ROOT, self.cgroup), exist_ok=True)

    @property
    def held(self):
        return self._held

    @held.setter
    def held(self, value):
        with self._lock:
            self._held = value

    def restart_if_exited(self):
        """Start it again if it exited while nobody held it; its exit code if so."""
        with self._lock:
            if self.popen is None or self._held or self.alive():
                return None
            code = self.popen.returncode
            self._start()
            return code

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_base(self):
        return f"http://127.0.0.1:{self.admin}"

    def start(self):
        # Under the lock, as the supervisor's look-and-start: a fault's start and the
        # supervisor's must not both find it down and both start one.
        with self._lock:
            if not self.alive():
                self._start()

    def _start(self):
        env = dict(self.env)
        if self.skew:
            env["LD_PRELOAD"] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
            env["FAKETIME"] = self.skew
            # Only the wall clock moves: tokio's timers (the monotonic clock) stay true.
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
            env["FAKETIME_NO_CACHE"] = "1"
        log = open(os.path.join(self.log_dir, f"{self.name}.log"), "ab")
        # Into its cgroup before exec, so that every socket it opens carries it.
        procs = os.path.join(CGROUP_ROOT, self.cgroup, "cgroup.procs")
        cmd = [
            "sh", "-c", f'echo $$ > {procs} && exec "$0" "$@"', self.binary, "serve",
            "--roles", self.role, "--listen", f"127.0.0.1:{self.port}",
            "--admin-listen", f"127.0.0.1:{self.admin}",
        ]
        self.popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.close()

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.popen.pid, sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        if self.popen:
            self.popen.wait()

    def stop(self):
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def ready(self):
        try:
            with urllib.request.urlopen(f"{self.admin_base}/readyz", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def wait_ready(self, seconds=90):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.ready():
                return True
            self.restart_if_exited()
            time.sleep(0.3)
        return False


class Topology:
    """≥ 3 api, ≥ 2 worker, ≥ 2 jobs processes on their own ports."""

    def __init__(self, binary, env, log_dir, api=3, worker=2, jobs=2, base_port=18100):
        self.procs = []
        port = base_port
        for role, n in (("api", api), ("worker", worker), ("jobs", jobs)):
            for i in range(n):
                self.procs.append(Proc(f"{role}-{i}", role, port, port + 1, binary, env, log_dir))
                port += 2

    def of(self, role):
        return [p for p in self.procs if p.role == role]

    def start(self):
        # The first applies the migrations (under a MySQL lock in any case); the others follow.
        first, rest = self.procs[0], self.procs[1:]
        first.start()
        if not first.wait_ready():
            raise RuntimeError(f"{first.name} not ready: see its log")
        for p in rest:
            p.start()
        for p in rest:
            if not p.wait_ready():
                raise RuntimeError(f"{p.name} not ready: see its log")

    def supervise(self, event):
        """Start again what exited on its own (a process that met a store down at its start
        exits 2): a supervisor's job in production (systemd, Kubernetes)."""
        for p in self.procs:
            code = p.restart_if_exited()
            if code is not None:
                event(f"{p.name} exited ({code}); started again")

    def stop(self):
        for p in self.procs:
            p.held = True
            p.stop()


class Net:
    """Network faults with iptables on the loopback: a process's own packets to a store (cgroup
    match), or a store's replies to everyone (source port). Every rule is removed at heal."""

    def __init__(self):
        self.rules = []

    def _rule(self, op, spec):
        # Tagged, so that ci/nemesis.sh removes what an interrupted run left.
        sh("iptables", op, "OUTPUT", "-m", "comment", "--comment", "nemesis", *spec)

    def add(self, spec):
        self._rule("-A", spec)
        self.rules.append(spec)

    def remove(self, spec):
        if spec in self.rules:
            self.rules.remove(spec)
            self._rule("-D", spec)

    def partition(self, proc, ports, reset=False):
        """The process's packets to the store's ports are dropped (the link stalls; what it sent
        arrives late, retransmitted, once healed), or answered with a TCP reset."""
        action = ["REJECT", "--reject-with", "tcp-reset"] if reset else ["DROP"]
        specs = [["-m", "cgroup", "--path", proc.cgroup, "-p", "tcp", "--dport", str(p), "-j", *action]
                 for p in ports]
        for s in specs:
            self.add(s)
        return specs

    def replies_lost(self, ports):
        """One way: the store's replies (and replication stream) are dropped; requests arrive and run."""
        specs = [["-p", "tcp", "--sport", str(p), "-j", "DROP"] for p in ports]
        for s in specs:
            self.add(s)
        return specs

    def heal(self):
        for s in list(self.rules):
            self.remove(s)
