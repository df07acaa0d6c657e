-- transfer.lua — move units between two buckets of one activity (rebalancing). The buckets may
-- live on different Redis Cluster nodes, so a transfer is three single-slot steps, each
-- idempotent by transfer id, recorded in the buckets' xfer hashes:
--
-- op "take" on the source:  KEYS[1] stock  KEYS[2] xfer  KEYS[3] gate
--                            ARGV: op, tid, units, target bucket, generation
--   -> {"taken", units} | {"exists", units} (already taken) | {"short"} (not enough stock)
--    | {"gated"} (the gate is missing, closed or recovering, or of another generation: the
--      transfer was planned before a recovery, whose rebuild the ledger would refuse it after)
--   records xfer "take:<tid>" = "<units>|<target>|<generation>"
-- op "give" on the target:  KEYS[1] stock  KEYS[2] xfer  KEYS[3] gate   ARGV: op, tid, units
--   -> {"given"} | {"exists"} | {"gated"};  records xfer "give:<tid>" = units
--   A target without its stock key is gated too: Redis lost that key (its gate is what a
--   recovery's check then finds alone), and INCRBY would create it with only these units.
-- A take or give on a recovering or closed gate is refused (DESIGN §11.3): the recovery rebuilds
-- the bucket from the ledger, and a transfer half done across it is finished from the journal.
-- op "ack" on the source:   KEYS[2] xfer                  ARGV: op, tid
--   -> {"acked"};  records xfer "ack:<tid>" = 1 — the transfer is complete everywhere
--
-- A take without its ack is a transfer in flight; the reconciler finishes it (ledger transfer,
-- give, ack). Units are never lost (the take is recorded) nor doubled (give is idempotent).
local op, tid = ARGV[1], ARGV[2]
if not tid or not string.match(tid, "^[%w%-]+$") then
  return redis.error_reply("ERR transfer: bad transfer id")
end
if op == "ack" then
  redis.call("HSET", KEYS[2], "ack:" .. tid, 1)
  return {"acked"}
end
local units = tonumber(ARGV[3])
if not units or units < 1 or units ~= math.floor(units) then
  return redis.error_reply("ERR transfer: units must be a positive integer")
end
local function gated(generation)
  local gate = redis.call("GET", KEYS[3])
  if not gate then
    return true
  end
  local state, current = string.match(gate, "^(%a+)|%a+|%d+|(%d+)|")
  return state == "recovering" or state == "closed" or (generation ~= nil and current ~= generation)
end
if op == "take" then
  local generation = ARGV[5]
  if not generation or not string.match(generation, "^%d+$") then
    return redis.error_reply("ERR transfer: take wants the gates' generation")
  end
  local taken = redis.call("HGET", KEYS[2], "take:" .. tid)
  if taken then
    return {"exists", tonumber(string.match(taken, "^(%d+)"))}
  end
  if gated(generation) then
    return {"gated"}
  end
  local stock = tonumber(redis.call("GET", KEYS[1]) or "0")
  if stock < units then
    return {"short"}
  end
  redis.call("DECRBY", KEYS[1], units)
  redis.call("HSET", KEYS[2], "take:" .. tid, units .. "|" .. ARGV[4] .. "|" .. generation)
  return {"taken", units}
elseif op == "give" then
  if redis.call("HEXISTS", KEYS[2], "give:" .. tid) == 1 then
    return {"exists"}
  end
  if gated(nil) or redis.call("EXISTS", KEYS[1]) == 0 then
    return {"gated"}
  end
  redis.call("INCRBY", KEYS[1], units)
  redis.call("HSET", KEYS[2], "give:" .. tid, units)
  return {"given"}
end
return redis.error_reply("ERR transfer: unknown op " .. tostring(op))
