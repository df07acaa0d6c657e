-- release.lua — give a reservation's units back to ITS OWN bucket (never to route(user): a unit
-- taken from the fallback goes back to the fallback). Idempotent in every mode.
--
-- KEYS[1] sk:{A.b}:stock  KEYS[2] sk:{A.b}:buyers  KEYS[3] sk:{A.b}:resv  KEYS[4] sk:{A.b}:xfer
-- KEYS[5] sk:{A.b}:gate
-- ARGV[1] mode  ARGV[2] reservation id  ARGV[3] user  ARGV[4] qty  ARGV[5] generation ("failed")
--   "unpublished": the order never reached the bus (a determinate publish failure): the open
--                  reservation goes back and the buyer mark is cleared, so the user may retry.
--   "rejected":    the ledger refused it (the user already holds another order): the open
--                  reservation goes back, the buyer mark stays.
--   "cancelled":   a durable order was cancelled (payment timeout): the units go back once,
--                  remembered as xfer field "rel:<reservation id>"; an open entry is closed too.
--   "adopt":       the reconciler is about to republish the open reservation: it is marked
--                  (a trailing "|r" on its value) -> {"adopted"} | {"absent"}. From then on an
--                  "unpublished" release refuses it (-> {"adopted"}): the purchase that failed to
--                  publish must not give back units whose order is on its way after all.
--   "failed":      the ledger failed the order (stale generation, or out of stock where Redis
--                  overstated): it frees its user (DESIGN §6). The open entry is closed with no
--                  units back (the ledger never took them), and the buyer mark goes — run on the
--                  bucket the unit came from and on the user's own bucket, where a pending mark
--                  of this attempt goes too. Only once per reservation (xfer field
--                  "fail:<reservation id>") and only while the gate is at the reservation's
--                  generation: a rebuild since marked the ledger's live buyers only, so a mark
--                  now is a newer reservation's, which must keep it.
--                  -> {"freed", 1 | 0 (the mark was not this reservation's to clear)}
-- -> {"released", qty} | {"absent"} (nothing open / already released) | {"adopted"}
--    | {"missing"} ("cancelled", "failed": the stock key is gone, nothing written)
-- No mode ever creates a missing stock key: INCRBY on it would make a bucket of the released
-- units alone, which looks whole to the recovery's check while the units it held are gone (R1,
-- simulation chaos seeds 50472, 50482, 90158). A missing key is the recovery's to rebuild from
-- the ledger, where an unpublished or rejected unit was never taken and a cancelled one is back:
-- "unpublished" and "rejected" close the reservation without the INCRBY; "cancelled" writes
-- nothing and is tried again after the rebuild (which keeps the rel: mark the ledger's cancel
-- implies).
local mode, rid, user = ARGV[1], ARGV[2], ARGV[3]
if not rid or not string.match(rid, "^%x+$") then
  return redis.error_reply("ERR release: reservation id must be hex")
end
local open = redis.call("HGET", KEYS[3], rid)
local qty
if open then
  qty = tonumber(string.match(open, "^%d+|(%d+)|"))
end

if mode == "adopt" then
  if not open then
    return {"absent"}
  end
  if not string.match(open, "|r$") then
    redis.call("HSET", KEYS[3], rid, open .. "|r")
  end
  return {"adopted"}
elseif mode == "unpublished" or mode == "rejected" then
  if not open then
    return {"absent"}
  end
  if mode == "unpublished" and string.match(open, "|r$") then
    return {"adopted"}
  end
  if redis.call("EXISTS", KEYS[1]) == 1 then
    redis.call("INCRBY", KEYS[1], qty)
  end
  redis.call("HDEL", KEYS[3], rid)
  if mode == "unpublished" then
    redis.call("SREM", KEYS[2], user)
  end
  return {"released", qty}
elseif mode == "cancelled" then
  if redis.call("HEXISTS", KEYS[4], "rel:" .. rid) == 1 then
    return {"absent"}
  end
  if not open then
    qty = tonumber(ARGV[4])
    if not qty or qty < 1 or qty ~= math.floor(qty) then
      return redis.error_reply("ERR release: qty must be a positive integer")
    end
  end
  if redis.call("EXISTS", KEYS[1]) == 0 then
    return {"missing"}
  end
  redis.call("INCRBY", KEYS[1], qty)
  redis.call("HDEL", KEYS[3], rid)
  redis.call("HSET", KEYS[4], "rel:" .. rid, qty)
  return {"released", qty}
elseif mode == "failed" then
  if not string.match(ARGV[5] or "", "^%d+$") then
    return redis.error_reply("ERR release: failed wants the reservation's generation")
  end
  if redis.call("EXISTS", KEYS[1]) == 0 then
    return {"missing"}
  end
  redis.call("HDEL", KEYS[3], rid)
  if redis.call("HEXISTS", KEYS[4], "fail:" .. rid) == 1 then
    return {"freed", 0}
  end
  redis.call("HSET", KEYS[4], "fail:" .. rid, 1)
  local gate = redis.call("GET", KEYS[5])
  if not gate or string.match(gate, "^%a+|%a+|%d+|(%d+)|") ~= ARGV[5] then
    return {"freed", 0}
  end
  local pending = redis.call("HGET", KEYS[3], "pending:" .. user)
  if pending and string.sub(pending, 1, #rid + 1) == rid .. "|" then
    redis.call("HDEL", KEYS[3], "pending:" .. user)
  end
  return {"freed", redis.call("SREM", KEYS[2], user)}
end
return redis.error_reply("ERR release: unknown mode " .. tostring(mode))
