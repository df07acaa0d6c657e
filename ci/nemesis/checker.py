"""The checker: the invariants of DESIGN §8 from the clients' history, the ledger read with its own
SQL and Redis read raw — no engine code (the one exception, `seckill audit`, is run as the
operator would and reported beside the checker's own verdicts, never instead of them).

Each check returns (name, violations, note): a violation is a sentence and, where it concerns
one user, the slice of the history around it."""

import json
from collections import defaultdict

import pymysql
import redis

# A 202 answered this long after it was sent: the publish timed out (the producer's delivery
# timeout, 3 s) and the reservation lived in Redis's outbox alone until the reconciler
# republished it — a Redis loss in between can take it (the exact account of DESIGN §8's L1).
SLOW_202 = 2.9


def route(user, n):
    """The engine's routing of a user to a business bucket (SplitMix64 mix, then a fair
    multiply-shift): DESIGN §4, reimplemented here from its published definition."""
    m = (1 << 64) - 1
    z = (user + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return (z * n) >> 64


class Stores:
    def __init__(self, mysql_url, redis_nodes):
        # mysql://user:pass@host:port/db
        rest = mysql_url.split("://", 1)[1]
        cred, hostdb = rest.split("@", 1)
        user, password = cred.split(":", 1)
        hostport, db = hostdb.split("/", 1)
        host, port = hostport.split(":")
        self.sql = dict(host=host, port=int(port), user=user, password=password, database=db.split("?")[0])
        if redis_nodes is None:  # SQL only
            return
        first = redis_nodes.split(",")[0].split("://")[1]
        h, p = first.split(":")
        # Short timeouts: a shard down (the nemesis's doing) must not hold a poll for long.
        self.redis = redis.RedisCluster(host=h, port=int(p), decode_responses=True, socket_timeout=1,
                                        socket_connect_timeout=1)

    def query(self, q, *args):
        c = pymysql.connect(**self.sql)
        try:
            with c.cursor() as cur:
                cur.execute(q, args)
                return cur.fetchall()
        finally:
            c.close()

    def ledger(self, activity):
        total = self.query("SELECT total_stock, bucket_count FROM activity WHERE id=%s", activity)[0]
        buckets = {b: (i, r) for b, i, r in self.query(
            "SELECT bucket_no, initial, remaining FROM stock_bucket WHERE activity_id=%s", activity)}
        orders = [dict(rid=r, user=u, bucket=b, qty=q, status=s, generation=g, created=float(c))
                  for r, u, b, q, s, g, c in self.query(
                      "SELECT reservation_id, user_id, bucket_no, qty, status, generation, "
                      "UNIX_TIMESTAMP(created_at) FROM seckill_order WHERE activity_id=%s", activity)]
        journal = self.query(
            "SELECT bucket_no, kind, reference, delta FROM stock_journal WHERE activity_id=%s", activity)
        return dict(total=total[0], n=total[1], buckets=buckets, orders=orders, journal=journal)

    def applied(self):
        """Every order row's reservation id, and every (sale, user) with a row."""
        rows = self.query("SELECT reservation_id, activity_id, user_id FROM seckill_order")
        return {r for r, _, _ in rows}, {(a, u) for _, a, u in rows}

    def generation(self, activity):
        rows = self.query("SELECT generation FROM activity_generation WHERE activity_id=%s", activity)
        return rows[0][0] if rows else None

    def gates(self, activity, n):
        """Every gate of the sale (the business buckets and the fallback), parsed; None where
        there is none or it cannot be read now."""
        out = {}
        for b in range(n + 1):
            try:
                out[b] = parse_gate(self.redis.get(f"sk:{{{activity}.{b}}}:gate"))
            except redis.RedisError:
                out[b] = None
        return out

    def cache(self, activity, n):
        out = {}
        for b in range(n + 1):
            k = f"sk:{{{activity}.{b}}}"
            stock = self.redis.get(f"{k}:stock")
            out[b] = dict(
                stock=None if stock is None else int(stock),
                resv=self.redis.hgetall(f"{k}:resv"),
                xfer=self.redis.hgetall(f"{k}:xfer"),
                buyers={int(u) for u in self.redis.smembers(f"{k}:buyers")},
                gate=self.redis.get(f"{k}:gate"),
            )
        return out


def parse_gate(value):
    """A gate as gate.lua writes it: state|intent|version|generation|fence (docs/architecture.md)."""
    if not value:
        return None
    state, intent, version, generation, fence = value.split("|")
    return dict(state=state, intent=intent, version=int(version), generation=int(generation), fence=fence)


def slice_of(history, user, around=None, n=12):
    ops = [o for o in history if o.get("user") == user]
    return [{k: o.get(k) for k in ("op", "proc", "t0", "t1", "status", "body", "error")} for o in ops[-n:]]


def check(activity, history, ledger, cache, losses, audit, metrics, watched):
    """Every verdict of one sale: [(name, [violations], note)]. `watched`, what the watches saw
    through the round: `bumps`, each generation the activity reached with the first time a poll
    of the ledger saw it (at or after its commit); `gates`, the polls' open gates of another
    generation than the ledger's, (time, bucket, gate's generation, ledger's); `generation`, the
    ledger's at quiescence; `commits` (commits.Watch), the records found below the consumer
    group's committed offsets and not in the ledger."""
    bumps, gates_seen, generation = watched["bumps"], watched["gates"], watched["generation"]
    hist = [o for o in history if o.get("round") == activity]
    orders = ledger["orders"]
    live = [o for o in orders if o["status"] in ("created", "paid")]
    holding = [o for o in orders if o["status"] != "failed"]
    by_rid = {o["rid"]: o for o in orders}
    verdicts = []

    # S1: no oversell — in total, per bucket against the journal, and never below zero.
    v = []
    sold = sum(o["qty"] for o in live)
    if sold > ledger["total"]:
        v.append(f"{sold} units sold of {ledger['total']}")
    net = defaultdict(int)
    xfer = defaultdict(int)
    out = defaultdict(int)  # units the rebalancer moved out of each bucket
    for b, kind, ref, delta in ledger["journal"]:
        net[b] += delta
        if kind == "transfer":
            xfer[b] += delta
            out[b] -= min(delta, 0)
    for b, (initial, remaining) in ledger["buckets"].items():
        sold_b = sum(o["qty"] for o in live if o["bucket"] == b)
        if remaining < 0:
            v.append(f"bucket {b}: remaining {remaining}")
        if initial - remaining != sold_b - xfer[b]:
            v.append(f"bucket {b}: initial {initial} - remaining {remaining} != sold {sold_b} - transfers {xfer[b]}")
        if net[b] != remaining - initial:
            v.append(f"bucket {b}: journal sums to {net[b]}, stock moved {remaining - initial}")
    verdicts.append(("S1 no oversell", v, f"{sold} of {ledger['total']} units sold"))

    # S2: one non-failed order per user.
    per_user = defaultdict(list)
    for o in holding:
        per_user[o["user"]].append(o["rid"])
    v = [(f"user {u} holds {len(r)} orders: {r}", slice_of(hist, u)) for u, r in per_user.items() if len(r) > 1]
    verdicts.append(("S2 one order per user", v, f"{len(per_user)} users hold an order"))

    # S3: Redis never negative.
    v = [f"bucket {b}: stock {c['stock']}" for b, c in cache.items() if c["stock"] is not None and c["stock"] < 0]
    verdicts.append(("S3 redis stock >= 0", v, ""))

    # S4: an order a user was shown created or paid stays (created, paid or cancelled).
    v = []
    shown = {}
    for o in hist:
        if o["op"] in ("view", "final") and o.get("status") == 200 and isinstance(o.get("body"), dict):
            st, rid = o["body"].get("state"), o["body"].get("reservation_id") or o.get("rid")
            if st in ("created", "paid") and rid:
                shown[rid] = o["user"]
    for rid, user in shown.items():
        o = by_rid.get(rid)
        if o is None or o["status"] == "failed":
            v.append((f"user {user} was shown order {rid} created/paid; the ledger has {o and o['status']}",
                      slice_of(hist, user)))
    verdicts.append(("S4 no confirmed order lost", v, f"{len(shown)} orders shown created or paid"))

    # The generation fence (DESIGN §11.3): an order reserved under generation g is never created
    # after the ledger moved past g — its unit was rebuilt into Redis and may be sold again. An
    # order row takes its created_at before the bump can commit (the bump waits for the order's
    # lock on the generation), and the poll saw the bump after its commit: sound either way.
    v = []
    for o in holding:
        later = [(g, t) for g, t in bumps.items() if g > o["generation"] and o["created"] > t]
        if later:
            g, t = min(later)
            v.append((f"order {o['rid']} of generation {o['generation']} created "
                      f"{o['created'] - t:.2f} s after the ledger reached generation {g}", slice_of(hist, o["user"])))
    stale = sum(1 for o in orders if o["status"] == "failed" and o["generation"] < max(bumps, default=0))
    verdicts.append(("generation fence", v, f"generations {sorted(bumps)}; {stale} failed orders of an older "
                     "generation than the last (refused as stale, or out of stock)"))

    # S6: an open gate carries the ledger's generation (DESIGN §11.3) — else it sells units for
    # orders the ledger refuses, or sells past a recovery. A recovery bumps while its fence holds
    # every gate closed and reopens with the new generation. Excused: a gate seen after a Redis
    # loss and before the next bump (a failover can bring back a gate image older than the last
    # recovery; the recovery it sets off fixes it). At quiescence, no excuse.
    v, excused = [], 0
    for t, b, gate_g, ledger_g in gates_seen:
        if any(l <= t and not any(l < bt <= t for bt in bumps.values()) for l in losses):
            excused += 1
            continue
        v.append(f"bucket {b}: open at generation {gate_g} while the ledger was at {ledger_g} "
                 f"({t - bumps.get(ledger_g, t):.2f} s after a poll first saw generation {ledger_g})")
    for b, c in cache.items():
        gate = parse_gate(c["gate"])
        if gate and gate["state"] == "open" and gate["generation"] != generation:
            v.append(f"bucket {b}: open at generation {gate['generation']} at quiescence; the ledger is at {generation}")
    verdicts.append(("S6 open gates carry the ledger's generation", v[:20] + ([f"... {len(v) - 20} more"] if len(v) > 20 else []),
                     f"{len(gates_seen)} polls saw an open gate of another generation; {excused} after a Redis loss"))

    # C1: the consumer commits only what the ledger applied (commits.py watched it live).
    commits = watched["commits"]
    v = [(f"record {f['partition']}@{f['offset']} (reservation {f['record']['reservation_id']}, user "
          f"{f['record']['user_id']}) was below the group's committed offset {f['committed']} and not in the ledger",
          slice_of(hist, f["record"]["user_id"]))
         for f in commits.found() if f["record"].get("activity_id") == activity]
    verdicts.append(("C1 commits follow the ledger", v,
                     f"{commits.earlier_polls + commits.polls()} polls of the group's offsets so far"))

    queued = [o for o in hist if o["op"] == "purchase" and o.get("status") == 202]

    # S5: after a pause answered 200, no purchase is queued until a resume is sent (the engine's
    # promise: once the pause returns, no reserve anywhere succeeds), unless Redis lost data in
    # between (a failover can take the pause's own gate writes: counted, not excused silently).
    ops = sorted((o for o in hist if o["op"] in ("pause", "resume")), key=lambda o: o["t0"])
    held, v, lost = [], [], 0
    for i, o in enumerate(ops):
        if o["op"] == "pause" and o.get("status") == 200:
            resume = next((r["t0"] for r in ops[i + 1:] if r["op"] == "resume"), float("inf"))
            held.append((o["t1"], resume))
    for q in queued:
        for start, end in held:
            if start < q["t0"] and q["t1"] < end:
                if any(start <= t <= q["t1"] for t in losses):
                    lost += 1
                    continue
                v.append((f"user {q['user']} told queued {q['t1'] - start:.2f} s after a pause returned, "
                          "before any resume was sent", slice_of(hist, q["user"])))
    verdicts.append(("S5 a pause holds", v, f"{len(held)} pauses; {lost} queued answers after a Redis loss during one"))

    # L1: every 202 ends as an order the user sees, or the order view tells the user otherwise.
    final = {}
    for o in hist:
        if o["op"] == "final" and o.get("status") == 200:
            final[o["user"]] = o["body"]
    v, l1_excused = [], 0
    for q in queued:
        rid, user = q["body"]["reservation_id"], q["user"]
        f = final.get(user)
        if f is None:
            v.append((f"user {user}: no final order view answered", slice_of(hist, user)))
            continue
        if f["state"] not in ("none", "queued"):
            # The order view shows this order's fate, or another order of the user's (a later
            # purchase after this one failed or was released): either way the user is told.
            continue
        slow = q["t1"] - q["t0"] >= SLOW_202
        if f["state"] == "none" and slow and any(q["t0"] <= t for t in losses):
            l1_excused += 1
            continue
        v.append((f"user {user}: told queued ({rid}); the order view says {f}", slice_of(hist, user)))
    verdicts.append(("L1 every queued answer resolved", v,
                     f"{len(queued)} queued; {l1_excused} lost with Redis data after an unknown publish"))

    # S7: a "duplicate" answer was true: the user had tried before in a way that may have
    # reserved (queued, an unknown outcome, no answer) or holds an order.
    v = []
    maybe = defaultdict(list)
    for o in sorted(hist, key=lambda o: o["t0"]):
        if o["op"] != "purchase":
            continue
        st, body = o.get("status"), o.get("body") or {}
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        if st == 409 and code == "duplicate":
            if not maybe[o["user"]] and o["user"] not in per_user:
                v.append((f"user {o['user']} told duplicate with no earlier attempt that could have reserved "
                          f"and no order", slice_of(hist, o["user"])))
        elif st == 202 or st is None or (st == 503 and not any(
                s in str(body.get("error", {}).get("message", "")) for s in ("paused", "recovering", "not ready"))):
            maybe[o["user"]].append(o["t0"])
    verdicts.append(("S7 duplicate answers true", v, ""))

    # Sold out was true: a buyer is told sold out when its own bucket and the fallback are empty
    # (DESIGN §4), so every unit of both was sold at least once or moved out — but for the units of failed orders (a unit Redis sold twice, a stale generation)
    # and of reservations that were held while others were told sold out and then given back: a
    # publish that failed ("orders cannot be queued"), an outcome left unknown or unanswered, a
    # reservation lost with Redis data (L1's excused) — the stated bound, for the whole sale. (A
    # unit given back after the sale's last buyer went stays unsold.) Per bucket, because another
    # bucket may hold units the rebalancer has not moved yet (a skewed sale's bounded undersell).
    n = ledger["n"]
    sold_out = [o for o in hist if o["op"] in ("purchase", "token") and o.get("status") == 410]
    failed = sum(1 for o in orders if o["status"] == "failed")
    held_back = sum(1 for o in hist if o["op"] == "purchase" and (o.get("status") is None or (
        o.get("status") == 503 and any(m in json.dumps(o.get("body")) for m in ("cannot be queued", "not known")))))
    bound = failed + held_back + l1_excused
    # Units moved in are left out (`out` only, from S1's pass over the journal): the rebalancer
    # may have brought them after the answer.
    never = {}  # bucket -> its units never sold
    for b, (initial, _) in ledger["buckets"].items():
        never[b] = initial - out[b] - sum(o["qty"] for o in holding if o["bucket"] == b)
    # Not judged: a bucket the rebalancer took from (or the fallback, if it did) — a transfer
    # taken and then given back to it leaves no trace in the end state, yet emptied it meanwhile.
    took = {b for b in never if out[b]} | {b for b, c in cache.items() if any(k.startswith("take:") for k in c["xfer"])}
    told = defaultdict(int)
    for o in sold_out:
        told[route(o["user"], n)] += 1
    v = [f"{k} answers said sold out to buyers of bucket {b}, yet {never[b]} of its units and {never[n]} of the "
         f"fallback's were never sold (bound: {failed} failed orders, {held_back} reservations maybe given back, "
         f"{l1_excused} lost with Redis data)" for b, k in sorted(told.items())
         if b not in took and n not in took and max(never[b], never[n]) > bound]
    verdicts.append(("sold-out answers true", v, f"{len(sold_out)} sold-out answers; bound {bound}; units never sold "
                     f"per bucket {dict(sorted((b, u) for b, u in never.items() if u > 0))}; "
                     f"not judged (the rebalancer took from them): {sorted(took)}"))

    # L3: nobody locked out: every buyer mark is a user with a non-failed order.
    v = []
    for b, c in cache.items():
        for u in c["buyers"]:
            if u not in per_user:
                v.append((f"bucket {b}: user {u} marked with no order", slice_of(hist, u)))
    verdicts.append(("L3 nobody locked out", v, ""))

    # R2: every holder of an order is marked where its unit came from and in its own bucket
    # (the engine's routing, reimplemented: `route`): the mark is what answers "duplicate".
    v = []
    for o in holding:
        for b in {o["bucket"], route(o["user"], ledger["n"])}:
            if o["user"] not in cache.get(b, {}).get("buyers", set()):
                v.append((f"user {o['user']} holds order {o['rid']} ({o['status']}) but is not marked in bucket {b}",
                          slice_of(hist, o["user"])))
    verdicts.append(("R2 buyers marked", v, ""))

    # R1 per bucket at quiescence, read raw.
    v = []
    n = ledger["n"]
    for b, c in cache.items():
        initial, _ = ledger["buckets"][b]
        if c["stock"] is None:
            v.append(f"bucket {b}: no stock key")
            continue
        open_ = sum(int(val.split("|")[1]) for rid, val in c["resv"].items()
                    if not rid.startswith("pending:") and by_rid.get(rid, {}).get("status") not in ("created", "paid"))
        sold_b = sum(o["qty"] for o in live if o["bucket"] == b)
        give = sum(int(val) for k, val in c["xfer"].items() if k.startswith("give:"))
        take = sum(int(val.split("|")[0]) for k, val in c["xfer"].items() if k.startswith("take:"))
        total = c["stock"] + open_ + sold_b - give + take
        if total != initial:
            v.append(f"bucket {b}: redis {c['stock']} + open {open_} + sold {sold_b} - in {give} + out {take} "
                     f"= {total}, initial {initial}")
        still = [r for r in c["resv"] if not r.startswith("pending:")]
        if still:
            v.append(f"bucket {b}: {len(still)} reservations still open at quiescence")
    verdicts.append(("R1 reconciled per bucket", v, f"{n} buckets and the fallback"))

    # The engine's own audit, as an operator runs it.
    body = (audit or {}).get("body") or {}
    ok = audit and audit.get("status") == 200 and body.get("verdict") == "ok" and body.get("r1_checked")
    verdicts.append(("seckill audit clean", [] if ok else [f"audit: {json.dumps(body)[:300]}"],
                     f"{body.get('units_sold')} units sold, R1 checked" if ok else ""))

    # The engine's metrics against the history: queued answers counted by the API processes.
    if metrics is not None:
        lo, hi, counted = metrics
        told = len(queued)
        v = [] if lo <= counted <= hi else [
            f"the API processes counted {counted} queued purchases; the history holds {told} "
            f"(bounds {lo}..{hi})"]
        verdicts.append(("metrics agree with history", v, f"{counted} counted, {told} answered"))
    return verdicts
