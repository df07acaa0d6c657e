#!/usr/bin/env python3
"""The dashboard and the alert rules against a real Prometheus scraping a real engine.

Starts `seckill serve` as three processes, one per role (api, worker, jobs), on the real stores
(REDIS_URL, KAFKA_BROKERS, DATABASE_URL: ci/services.sh), and Debian's `prometheus` scraping
their admin listeners every second with deploy/prometheus/alerts.yml loaded. Creates a sale,
drives it with `seckill load`, then makes an R1 difference by hand (one unit added to a bucket's
Redis stock) and checks through Prometheus's HTTP API:

- every query of deploy/grafana/seckill.json (Grafana's variables substituted) is valid and
  returns series, and the activity variable's values include the sale;
- every alert rule was evaluated without error, and every series an alert expression reads
  exists (counters and gauges are exported from start, at zero);
- the reconcile-difference alert is pending or firing.

The processes get a database of their own on DATABASE_URL's server (dropped at the end): the jobs
process walks every sale in its ledger, and the shared one holds every earlier run's.

    ci/prometheus.py path/to/seckill
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "deploy/grafana/seckill.json")
ALERTS = os.path.join(ROOT, "deploy/prometheus/alerts.yml")
ADMIN = "prometheus-check-admin-token-0123"
# Grafana's variables as a dashboard over the last minutes would have them.
VARIABLES = {"$__rate_interval": "15s", "$__interval": "5s", "$activity": ".*"}


def say(msg):
    print(f"[prometheus] {msg}", flush=True)


def fail(msg):
    print(f"[prometheus] FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, token=None, timeout=10):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait(what, check, seconds):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.5)
    fail(f"{what} (after {seconds} s; last: {last})")


def redis_command(url, *args):
    """One command over RESP (redis-py is not needed for one INCRBY)."""
    u = urllib.parse.urlparse(url)
    with socket.create_connection((u.hostname, u.port or 6379), timeout=5) as s:
        out = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in
                                                 (str(x).encode() for x in args))
        s.sendall(out)
        reply = s.recv(4096)
    if not reply.startswith((b":", b"+")):
        fail(f"redis {args}: {reply!r}")
    return reply


def main():
    seckill = os.path.abspath(sys.argv[1])
    for var in ("REDIS_URL", "KAFKA_BROKERS", "DATABASE_URL"):
        if not os.environ.get(var):
            fail(f"{var} is not set: run ci/services.sh and source its env first")
    prometheus = shutil.which("prometheus")
    if not prometheus:
        fail("prometheus is not installed (apt-get install prometheus)")
    work = tempfile.mkdtemp(prefix="seckill-prometheus-")
    procs = []
    database = OwnDatabase(os.environ["DATABASE_URL"])
    try:
        run(seckill, prometheus, work, procs, database.url)
    except SystemExit:
        # What the processes said is the first thing to read when a check failed.
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name), errors="replace") as f:
                    lines = f.readlines()[-40:]
                print(f"[prometheus] --- {name} (last {len(lines)} lines)", file=sys.stderr)
                sys.stderr.writelines(lines)
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
        database.drop()


class OwnDatabase:
    """A database of this run's on the server of `shared` (a mysql:// URL), through `mariadb`."""

    def __init__(self, shared):
        u = urllib.parse.urlsplit(shared)
        self.name = f"seckill_prometheus_{os.getpid()}_{int(time.time())}"
        self.client = ["mariadb", "-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306),
                       "-u", urllib.parse.unquote(u.username or ""),
                       f"-p{urllib.parse.unquote(u.password or '')}"]
        done = self.sql(f"CREATE DATABASE `{self.name}`")
        if done.returncode != 0:
            fail(f"create database {self.name}: {done.stderr.strip()}")
        self.url = urllib.parse.urlunsplit(u._replace(path=f"/{self.name}"))

    def sql(self, statement):
        return subprocess.run(self.client + ["-e", statement], capture_output=True, text=True)

    def drop(self):
        self.sql(f"DROP DATABASE IF EXISTS `{self.name}`")


def run(seckill, prometheus, work, procs, database_url):
    run_id = f"{os.getpid()}-{int(time.time())}"
    env = dict(os.environ,
               DATABASE_URL=database_url,
               SECKILL_TOPIC=f"seckill.prometheus.{run_id}",
               SECKILL_ADMIN_TOKEN=ADMIN,
               SECKILL_TOKEN_SECRET="prometheus-check-token-secret-0123456789",
               SECKILL_JWT_SECRET="prometheus-check-jwt-secret-0123456789ab",
               SECKILL_JWT_AUDIENCE="seckill",
               SECKILL_PAYMENT_SECRET="prometheus-check-payment-secret-012345",
               SECKILL_LOG="warn")
    # The schema first, once, as a deployment's migration job does: three processes that each
    # migrate a new database at once race on it (sqlx: "migration ... is partially applied").
    migrate = subprocess.run([seckill, "migrate"], env=env, capture_output=True, text=True, timeout=120)
    if migrate.returncode != 0:
        fail(f"seckill migrate: {migrate.stdout}{migrate.stderr}")
    roles = {}
    for role in ("api", "worker", "jobs"):
        public, admin = free_port(), free_port()
        log = open(os.path.join(work, f"{role}.log"), "w")
        procs.append(subprocess.Popen(
            [seckill, "serve", "--roles", role, "--listen", f"127.0.0.1:{public}",
             "--admin-listen", f"127.0.0.1:{admin}"], env=env, stdout=log, stderr=log))
        roles[role] = (public, admin)
    for role, (_, admin) in roles.items():
        wait(f"the {role} process is ready",
             lambda: http("GET", f"http://127.0.0.1:{admin}/readyz")[0] == 200, 120)
    say("api, worker and jobs processes ready")

    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [ALERTS],
        "scrape_configs": [{
            "job_name": "seckill",
            "static_configs": [{"targets": [f"127.0.0.1:{admin}"], "labels": {"role": role}}
                               for role, (_, admin) in roles.items()],
        }],
    }
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        yaml.safe_dump(config, f)
    plog = open(os.path.join(work, "prometheus.log"), "w")
    procs.append(subprocess.Popen(
        [prometheus, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/data",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=plog, stderr=plog))
    base = f"http://127.0.0.1:{port}"
    wait("prometheus is ready", lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200, 60)

    def query(expr):
        status, answer = http("GET", f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if status != 200 or answer.get("status") != "success":
            fail(f"query {expr!r} is not valid: {answer}")
        return answer["data"]["result"]

    wait("prometheus scrapes all three processes",
         lambda: len(query('up{job="seckill"} == 1')) == 3, 60)
    say(f"prometheus on :{port} scrapes all three processes")

    activity = int(time.time()) % 1_000_000_000 + 1_000_000
    now = int(time.time() * 1000)
    spec = {"id": activity, "total_stock": 300, "buckets": 4, "fallback_pct": 10,
            "start_ms": now - 1000, "end_ms": now + 600_000, "pay_timeout_ms": 600_000}
    api_public, api_admin = roles["api"]
    status, body = http("POST", f"http://127.0.0.1:{api_admin}/api/v1/admin/activities", spec, ADMIN)
    if status != 201:
        fail(f"create the sale: {status} {body}")
    say(f"sale {activity}: 300 units in 4 buckets")
    load = subprocess.run(
        [seckill, "load", "--url", f"http://127.0.0.1:{api_public}", "--activity", str(activity),
         "--users", "1000", "--connections", "8", "--duration", "20", "--json"],
        env=env, capture_output=True, text=True, timeout=120)
    if load.returncode != 0:
        fail(f"seckill load: {load.stdout}{load.stderr}")
    say(f"load: {load.stdout.strip()[:300]}")

    # The reconciler's gauges for the sale, then a difference made by hand: one unit more in
    # bucket 0's Redis stock than the ledger and the outbox account for.
    wait("the jobs' gauges show the sale",
         lambda: query(f'seckill_stock_remaining{{activity="{activity}"}}'), 60)
    wait("the orders are applied (consumer lag 0)",
         lambda: query("max(seckill_consumer_lag) == 0"), 60)
    redis_command(os.environ["REDIS_URL"], "INCRBY", f"sk:{{{activity}.0}}:stock", 1)
    say("bucket 0: one unit added to Redis by hand")

    def difference_alert():
        _, answer = http("GET", f"{base}/api/v1/alerts")
        return [a for a in answer["data"]["alerts"]
                if a["labels"].get("alertname") == "SeckillReconcileDifference"
                and a["labels"].get("activity") == str(activity)
                and a["state"] in ("pending", "firing")]
    found = wait("the reconcile-difference alert is pending or firing", difference_alert, 90)
    say(f"SeckillReconcileDifference {found[0]['state']} for activity {activity}")

    # Every dashboard query, as Grafana would send it.
    dashboard = json.load(open(DASHBOARD))
    checked = 0
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            if "$" in expr:
                fail(f"panel {panel['title']!r}: unsubstituted variable in {expr!r}")
            if not query(expr):
                fail(f"panel {panel['title']!r}: {expr!r} returns no series")
            checked += 1
    for var in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var.get("definition", ""))
        if var["type"] == "query":
            if not m:
                fail(f"variable {var['name']}: cannot read {var.get('definition')!r}")
            _, answer = http("GET", f"{base}/api/v1/label/{m.group(2)}/values?"
                             + urllib.parse.urlencode({"match[]": m.group(1)}))
            if str(activity) not in answer["data"]:
                fail(f"variable {var['name']}: {answer['data']} lacks activity {activity}")
    say(f"dashboard: {checked} queries valid, each returns series")

    # Every alert rule: evaluated by Prometheus without error, and every series it reads exists.
    rules = [r for g in yaml.safe_load(open(ALERTS))["groups"] for r in g["rules"]]
    _, answer = http("GET", f"{base}/api/v1/rules")
    loaded = {r["name"]: r for g in answer["data"]["groups"] for r in g["rules"]}
    for rule in rules:
        name = rule["alert"]
        got = loaded.get(name)
        if not got or got.get("health") != "ok":
            fail(f"alert {name}: not evaluated cleanly: {got}")
        query(rule["expr"])
        for selector in re.findall(r"seckill_[a-z_]+(?:\{[^}]*\})?", rule["expr"]):
            if not query(f"count({selector})"):
                metric = selector.split("{")[0]
                seen = [r["metric"] for r in query(metric)]
                fail(f"alert {name}: {selector} has no series (not exported at zero?); "
                     f"{metric} has {seen}")
    say(f"alerts: {len(rules)} rules evaluated cleanly, every series they read exists")


if __name__ == "__main__":
    main()
