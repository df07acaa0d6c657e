-- warmup.lua — install an activity's stock plan in Redis. Idempotent: a key that already exists
-- is left exactly as it is (a second warmup must never refill a bucket that has been selling).
--
-- op "bucket": KEYS[1] sk:{A.b}:stock            ARGV[2] initial units of bucket b
--   -> {"created", initial} | {"exists", current}
-- op "meta":   KEYS[1] sk:{A}:meta   ARGV[2] plan version  ARGV[3] bucket count  ARGV[4] epoch
--   -> {"created"} | {"exists"}; a different plan version is an error (plans never change in place)
--   The epoch is the Redis server's run id at warmup: a later run id means Redis restarted since,
--   and may have lost data (the recovery job compares them).
-- op "state":  KEYS[1] sk:{A}:meta   ARGV[2] state  ARGV[3] plan version  ARGV[4] bucket count
--              ARGV[5] epoch ("" keeps the current one)   -> {"ok"}
--   Sets open / paused / recovering / closed; recreates the meta hash if Redis lost it.
-- op "moved":  KEYS[1] sk:{A}:meta   -> {"ok", n}
--   Counts a rebalancing round (field `moves`): engines that see it change forget their local
--   sold-out flags, so units moved into a drained bucket are offered again.
-- The engine warms every bucket first and the meta hash last, so `state=open` means "all warm".
local op = ARGV[1]
if op == "bucket" then
  local initial = tonumber(ARGV[2])
  if not initial or initial < 0 or initial ~= math.floor(initial) then
    return redis.error_reply("ERR warmup: initial must be a non-negative integer")
  end
  local current = redis.call("GET", KEYS[1])
  if current then
    return {"exists", tonumber(current)}
  end
  redis.call("SET", KEYS[1], initial)
  return {"created", initial}
elseif op == "meta" then
  local version = redis.call("HGET", KEYS[1], "version")
  if version then
    if version ~= ARGV[2] then
      return redis.error_reply("ERR warmup: plan version mismatch: have " .. version .. ", got " .. ARGV[2])
    end
    return {"exists"}
  end
  redis.call("HSET", KEYS[1], "version", ARGV[2], "buckets", ARGV[3], "state", "open", "epoch", ARGV[4])
  return {"created"}
elseif op == "state" then
  local state = ARGV[2]
  if state ~= "open" and state ~= "paused" and state ~= "recovering" and state ~= "closed" then
    return redis.error_reply("ERR warmup: unknown state " .. tostring(state))
  end
  local version = redis.call("HGET", KEYS[1], "version")
  if version and version ~= ARGV[3] then
    return redis.error_reply("ERR warmup: plan version mismatch: have " .. version .. ", got " .. ARGV[3])
  end
  redis.call("HSET", KEYS[1], "version", ARGV[3], "buckets", ARGV[4], "state", state)
  if ARGV[5] ~= "" then
    redis.call("HSET", KEYS[1], "epoch", ARGV[5])
  end
  return {"ok"}
elseif op == "moved" then
  -- Never create a meta of its own: after a data loss that is the recovery's to rebuild.
  if redis.call("EXISTS", KEYS[1]) == 0 then
    return {"ok", 0}
  end
  return {"ok", redis.call("HINCRBY", KEYS[1], "moves", 1)}
end
return redis.error_reply("ERR warmup: unknown op " .. tostring(op))
