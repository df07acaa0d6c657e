-- reserve.lua — take units for one user from ONE stock bucket, atomically (one slot: every key
-- shares the bucket's hash tag). This file is the only place the reserve logic exists.
--
-- KEYS[1] sk:{A.b}:stock   KEYS[2] sk:{A.b}:buyers   KEYS[3] sk:{A.b}:resv   KEYS[4] sk:{A.b}:gate
-- KEYS[5] sk:{A.b}:void    (reservation ids of fallback attempts the reconciler gave up)
--
-- op "own"      (the user's own bucket)  ARGV: op, user, qty, reservation id, now_ms, bucket, fallback("1"|"0")
-- op "fallback" (the fallback bucket)    ARGV: op, user, qty, reservation id, now_ms, bucket,
--                                               generation (the own bucket's "pending" answer's)
--   -> {"reserved", bucket, generation} | {"duplicate"} | {"empty"} | {"pending", generation}
--    | {"not_warmed"}
--    | {"voided"} (fallback only: the attempt was given up, see op "void"; nothing is taken)
--    | {"stale"} (fallback only: this gate's generation is not the one the own bucket's mark was
--      left under — a recovery rebuilt Redis in between, which dropped the mark (it marks the
--      ledger's buyers only): a unit taken now would be held by a user no longer marked in the
--      own bucket, free to reserve there again; nothing is taken)
--    | {"gated", state}: the bucket's gate (gate.lua) is not open — state closed, paused or
--      recovering; a missing gate counts as closed. Nothing is taken and no mark is left.
--   "pending" (own only, when the bucket is empty and a fallback exists): the user is marked in
--   this bucket's buyers and a `pending:<user>` field records the attempt, so that the same user
--   cannot also win from this bucket later while the fallback attempt is in flight. It answers
--   the gate's generation, which the fallback reserve must find unchanged.
-- op "resolve"  (the user's own bucket, after the fallback attempt)
--               ARGV: op, user, "keep"|"clear", reservation id (the attempt's)
--   "keep": the user won from the fallback; the buyer mark stays, the pending field goes.
--   "clear": the fallback was empty too; mark and pending field both go.   -> {"resolved", n}
--   Only while the pending field is this attempt's (n = 1; else nothing changes, n = 0): a late
--   resolve — a process stalled past the reconciler's give-up, or a zombie across a recovery —
--   must not clear the mark of the user's newer reservation.
-- op "void"     (the fallback bucket, by the reconciler giving up an old pending mark)
--               ARGV: op, user, reservation id
--   -> {"open"}: the attempt's unit is open here, its publish in flight: its purchase resolves
--      the mark (or, once the reconciler republished it and the ledger holds it, a later pass
--      finds it "held"); nothing changes
--    | {"held"}: the user holds a unit of this bucket (an order's): the mark must be kept
--    | {"voided"}: the id is recorded in KEYS[5]; a fallback reserve of it that arrives later
--      (queued behind a slow Redis past the reconciler's grace period) answers {"voided"} and
--      takes nothing, so clearing the own bucket's mark cannot leave a unit without its mark.
--
-- A reservation is the field <reservation id> of resv with value
-- "<user>|<qty>|<reserved_at_ms>|<generation>" (the generation of the gate it was taken under);
-- it stays there (the outbox) until the ledger holds the order (settle) or it is released.
local op = ARGV[1]
local user = ARGV[2]
if not user or not string.match(user, "^%d+$") then
  return redis.error_reply("ERR reserve: user must be a decimal id")
end

if op == "resolve" then
  local attempt = ARGV[4]
  if ARGV[3] ~= "keep" and ARGV[3] ~= "clear" then
    return redis.error_reply("ERR reserve: resolve wants keep or clear")
  end
  if not attempt or not string.match(attempt, "^%x+$") then
    return redis.error_reply("ERR reserve: reservation id must be hex")
  end
  local pending = redis.call("HGET", KEYS[3], "pending:" .. user)
  if not pending or string.sub(pending, 1, #attempt + 1) ~= attempt .. "|" then
    return {"resolved", 0}
  end
  redis.call("HDEL", KEYS[3], "pending:" .. user)
  if ARGV[3] == "clear" then
    redis.call("SREM", KEYS[2], user)
  end
  return {"resolved", 1}
end

if op == "void" then
  local rid = ARGV[3]
  if not rid or not string.match(rid, "^%x+$") then
    return redis.error_reply("ERR reserve: reservation id must be hex")
  end
  if redis.call("HEXISTS", KEYS[3], rid) == 1 then
    return {"open"}
  end
  local holds = redis.call("SISMEMBER", KEYS[2], user) == 1
  if holds then
    return {"held"}
  end
  redis.call("SADD", KEYS[5], rid)
  return {"voided"}
end

if op ~= "own" and op ~= "fallback" then
  return redis.error_reply("ERR reserve: unknown op " .. tostring(op))
end
local qty = tonumber(ARGV[3])
if not qty or qty < 1 or qty ~= math.floor(qty) then
  return redis.error_reply("ERR reserve: qty must be a positive integer")
end
local rid = ARGV[4]
if not rid or not string.match(rid, "^%x+$") then
  return redis.error_reply("ERR reserve: reservation id must be hex")
end

if op == "fallback" and not string.match(ARGV[7] or "", "^%d+$") then
  return redis.error_reply("ERR reserve: fallback wants the pending mark's generation")
end
if op == "fallback" and redis.call("SISMEMBER", KEYS[5], rid) == 1 then
  return {"voided"}
end
-- A re-sent reserve (a client that lost the reply and sent the same script again: the cluster
-- client re-sends on a connection error) answers what its first run did: not "duplicate" for the
-- user's own reservation, which goes on to become the order.
local prior = redis.call("HGET", KEYS[3], rid)
if prior then
  local holder, held_generation = string.match(prior, "^(%d+)|%d+|%d+|(%d+)")
  if holder == user then
    return {"reserved", tonumber(ARGV[6]), tonumber(held_generation)}
  end
end

local stock = redis.call("GET", KEYS[1])
if not stock then
  return {"not_warmed"}
end
local gate = redis.call("GET", KEYS[4])
if not gate then
  return {"gated", "closed"}
end
local state, generation = string.match(gate, "^(%a+)|%a+|%d+|(%d+)|")
if not state then
  return redis.error_reply("ERR reserve: unreadable gate " .. gate)
end
if state ~= "open" then
  return {"gated", state}
end
if op == "fallback" and generation ~= ARGV[7] then
  return {"stale"}
end
if op == "own" then
  local pending = redis.call("HGET", KEYS[3], "pending:" .. user)
  if pending and string.sub(pending, 1, #rid + 1) == rid .. "|" then
    return {"pending", tonumber(generation)} -- this attempt's mark, re-sent
  end
end
if redis.call("SISMEMBER", KEYS[2], user) == 1 then
  return {"duplicate"}
end
if tonumber(stock) >= qty then
  redis.call("DECRBY", KEYS[1], qty)
  redis.call("SADD", KEYS[2], user)
  redis.call("HSET", KEYS[3], rid, user .. "|" .. qty .. "|" .. ARGV[5] .. "|" .. generation)
  return {"reserved", tonumber(ARGV[6]), tonumber(generation)}
end
if op == "own" and ARGV[7] == "1" then
  redis.call("SADD", KEYS[2], user)
  redis.call("HSET", KEYS[3], "pending:" .. user, rid .. "|" .. ARGV[5])
  return {"pending", tonumber(generation)}
end
return {"empty"}
