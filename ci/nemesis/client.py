"""The independent client: buyers and an operator driving one sale through the API processes,
every request and every answer (or none) recorded with its times. It knows the engine only by its
HTTP API (docs/api.md): no engine code."""

import asyncio
import hashlib
import hmac
import json
import time

import aiohttp
import jwt

# How long a request may take before the client gives up on it (no answer: outcome unknown).
REQUEST_TIMEOUT = 8.0
# 503 messages that promise nothing was bought (every other 503 leaves the outcome open).
NOTHING_BOUGHT = ("paused", "recovering", "not ready", "nothing was bought")


def now():
    return time.time()


class History:
    """Every request and answer: one JSON object per line."""

    def __init__(self, path):
        self.path, self.ops = path, []

    def add(self, **op):
        self.ops.append(op)
        return op

    def write(self):
        with open(self.path, "a") as f:
            for op in self.ops:
                f.write(json.dumps(op, separators=(",", ":")) + "\n")


class Client:
    def __init__(self, cfg, topology, history, rng):
        self.cfg, self.topology, self.history, self.rng = cfg, topology, history, rng
        self.jwt_cache = {}

    def token_for(self, user):
        t = self.jwt_cache.get(user)
        if t is None:
            claims = {"sub": str(user), "exp": int(now()) + 6 * 3600, "aud": self.cfg["audience"]}
            t = self.jwt_cache[user] = jwt.encode(claims, self.cfg["jwt_secret"], algorithm="HS256")
        return t

    def api(self):
        return self.rng.choice(self.topology.of("api"))

    async def call(self, session, proc, method, path, user=None, body=None, admin=False, **meta):
        """One request, recorded: status None when no answer came (refused, reset, timed out)."""
        base = proc.admin_base if admin else proc.base
        headers = {"x-request-id": f"n{self.rng.getrandbits(60):x}"}
        if admin:
            headers["authorization"] = f"Bearer {self.cfg['admin_token']}"
        elif user is not None:
            headers["authorization"] = f"Bearer {self.token_for(user)}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["content-type"] = "application/json"
        headers.update(meta.pop("headers", {}))
        op = dict(meta, user=user, proc=proc.name, method=method, path=path, t0=now(),
                  rid_sent=headers["x-request-id"])
        try:
            async with session.request(method, base + path, data=data, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as r:
                text = await r.text()
                op["status"] = r.status
                try:
                    op["body"] = json.loads(text) if text else None
                except ValueError:
                    op["body"] = text[:200]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            op["status"], op["error"] = None, type(e).__name__
        op["t1"] = now()
        return self.history.add(**op)

    # -- the buyer -------------------------------------------------------------------------------

    async def buyer(self, session, activity, user, until):
        """Token then purchase, again after anything that leaves the way open (503, 429, no
        answer) until a definite answer; then the order's fate: pay, cancel, or leave it to the
        payment timeout."""
        queued = None
        for attempt in range(self.cfg["attempts"]):
            if now() > until:
                return
            proc = self.api()
            tok = await self.call(session, proc, "POST", f"/api/v1/activities/{activity}/token",
                                  user=user, op="token", round=activity)
            if tok["status"] == 200:
                proc = self.api()
                buy = await self.call(session, proc, "POST", f"/api/v1/activities/{activity}/purchase",
                                      user=user, body={"token": tok["body"]["token"]}, op="purchase",
                                      round=activity)
                if buy["status"] == 202:
                    queued = buy["body"]["reservation_id"]
                    break
                if buy["status"] in (409, 410, 425) or (buy["status"] or 500) < 500 and buy["status"] != 429:
                    return
            elif tok["status"] in (410, 404, 401, 403, 400):
                return
            await asyncio.sleep(self.rng.uniform(0.3, 1.2) * (1 + attempt / 2))
        if queued is None:
            return
        # Follow the reservation until the ledger has it.
        state = None
        for _ in range(40):
            await asyncio.sleep(self.rng.uniform(0.5, 1.5))
            if now() > until + 20:
                return
            v = await self.call(session, self.api(), "GET",
                                f"/api/v1/activities/{activity}/reservations/{queued}",
                                user=user, op="view", round=activity, rid=queued)
            if v["status"] == 200:
                state = v["body"]["state"]
                if state != "queued":
                    break
        if state != "created":
            return
        fate = self.rng.random()
        if fate < self.cfg["pay_ratio"]:
            await self.pay(session, activity, user, queued)
        elif fate < self.cfg["pay_ratio"] + self.cfg["cancel_ratio"]:
            for _ in range(5):
                c = await self.call(session, self.api(), "POST", f"/api/v1/orders/{queued}/cancel",
                                    user=user, op="cancel", round=activity, rid=queued)
                if c["status"] in (200, 409, 404):
                    break
                await asyncio.sleep(1)

    async def pay(self, session, activity, user, rid):
        body = json.dumps({"payment_id": f"p-{rid[:16]}", "reservation_id": rid,
                           "amount_minor": self.cfg["price"]}, separators=(",", ":")).encode()
        for _ in range(5):
            t = int(now())
            mac = hmac.new(self.cfg["payment_secret"].encode(), f"{t}.".encode() + body, hashlib.sha256)
            p = await self.call(session, self.api(), "POST", "/api/v1/payments/callback", body=body,
                                op="pay", round=activity, rid=rid, user=user,
                                headers={"x-seckill-signature": f"t={t},v1={mac.hexdigest()}"})
            if p["status"] is not None and p["status"] < 500:
                return
            await asyncio.sleep(1)

    # -- the operator ----------------------------------------------------------------------------

    async def operator(self, session, activity, until):
        """Pauses and resumes through random API processes' admin listeners, each call again
        until it answers 200 (a pause that did not answer may or may not hold)."""
        while now() < until:
            await asyncio.sleep(self.rng.uniform(3, 8))
            if now() >= until:
                break
            await self.admin_until_ok(session, activity, "pause")
            await asyncio.sleep(self.rng.uniform(0.5, 2.5))
            await self.admin_until_ok(session, activity, "resume")

    async def admin_until_ok(self, session, activity, what, body=None, path=None):
        path = path or f"/api/v1/admin/activities/{activity}/{what}"
        for _ in range(60):
            r = await self.call(session, self.api(), "POST", path, body=body, admin=True, op=what,
                                round=activity)
            if r["status"] in (200, 201):
                return r
            await asyncio.sleep(1)
        raise RuntimeError(f"operator: {what} never answered 200: {r}")

    # -- one sale --------------------------------------------------------------------------------

    async def sale(self, activity, spec, users, sale_seconds):
        conn = aiohttp.TCPConnector(limit=self.cfg["connections"])
        async with aiohttp.ClientSession(connector=conn) as session:
            await self.admin_until_ok(session, activity, "create", body=spec,
                                      path="/api/v1/admin/activities")
            # Every API process learns the sale at its next registry refresh.
            for p in self.topology.of("api"):
                for _ in range(100):
                    r = await self.call(session, p, "GET", f"/api/v1/activities/{activity}",
                                        op="activity", round=activity)
                    if r["status"] == 200:
                        break
                    await asyncio.sleep(0.2)
            until = now() + sale_seconds
            sem = asyncio.Semaphore(self.cfg["concurrency"])
            # A flash sale's burst: most buyers in its first seconds.
            burst = self.cfg["burst_seconds"]

            async def one(user):
                # Half in the burst, the others through the sale (and the faults).
                await asyncio.sleep(self.rng.expovariate(1 / burst) if self.rng.random() < 0.5
                                    else self.rng.uniform(0, sale_seconds * 0.9))
                async with sem:
                    await self.buyer(session, activity, user, until)

            tasks = [asyncio.create_task(one(u)) for u in users]
            tasks.append(asyncio.create_task(self.operator(session, activity, until - 2)))
            await asyncio.gather(*tasks)

    async def final_views(self, activity, users):
        """After the heal: every user's order as the order view shows it (the user's last word)."""
        conn = aiohttp.TCPConnector(limit=self.cfg["connections"])
        sem = asyncio.Semaphore(64)
        async with aiohttp.ClientSession(connector=conn) as session:
            async def one(user):
                async with sem:
                    for _ in range(10):
                        v = await self.call(session, self.api(), "GET",
                                            f"/api/v1/activities/{activity}/orders/{user}",
                                            user=user, op="final", round=activity)
                        if v["status"] == 200:
                            return
                        await asyncio.sleep(1)
            await asyncio.gather(*(one(u) for u in users))

    async def audit(self, activity):
        async with aiohttp.ClientSession() as session:
            return await self.call(session, self.api(), "GET",
                                   f"/api/v1/admin/activities/{activity}/audit", admin=True,
                                   op="audit", round=activity)
