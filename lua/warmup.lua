-- warmup.lua — install an activity's stock plan in Redis. Idempotent: a key that already exists
-- is left exactly as it is (a second warmup must never refill a bucket that has been selling).
--
-- op "bucket": KEYS[1] sk:{A.b}:stock  KEYS[2] sk:{A.b}:gate  ARGV[2] initial units of bucket b
--   ARGV[3] "plan" (a new activity) | "installed"
--   -> {"created", initial} | {"exists", current} | {"lost"}
--   A bucket is warmed stock first, gate second: a gate without its stock key is a bucket that
--   was warmed and then lost its stock (Redis lost data). Refilling it from the plan would put
--   back every unit it sold, so nothing is written: that bucket is the recovery's to rebuild.
--   An installed activity's missing stock key is lost whatever else is missing: Redis may have
--   lost everything, the gate too, since the engine last looked (sold stock refilled: simulation
--   operator seed 95009).
-- op "meta":   KEYS[1] sk:{A}:meta   ARGV[2] plan version  ARGV[3] bucket count  ARGV[4] epoch
--   -> {"created"} | {"exists"}; a different plan version is an error (plans never change in place)
--   The epoch is the Redis server's run id at warmup: a later run id means Redis restarted since,
--   and may have lost data (the recovery job compares them).
-- The meta holds only the plan's shape, the epoch and the recovery claim with its fence (the
-- claim's while it runs, `finished` once it finished; DESIGN §11.2): the
-- operator's intent lives in the registry (MySQL) and is enforced by the gates (gate.lua).
-- op "claim":  KEYS[1] sk:{A}:meta   ARGV[2] fence  ARGV[3] lease ms  ARGV[4] version  ARGV[5] buckets
--   -> {"claimed", previous fence or ""} | {"busy", fence, ms left}
--   Recovery step 2: a live claim (deadline not passed) is left alone; an expired one is taken
--   over. The deadline is measured with Redis's own TIME, never a runner's clock. Recreates the
--   meta (without an epoch) if Redis lost it.
-- op "renew":  KEYS[1] sk:{A}:meta   ARGV[2] fence  ARGV[3] lease ms   -> {"renewed"} | {"lost"}
--   A lease of 0 lets the claim expire now (a runner giving up: the next one claims at once).
-- op "finish": KEYS[1] sk:{A}:meta   ARGV[2] fence  ARGV[3] epoch      -> {"finished"} | {"lost"}
--   ({"finished"} again for a re-sent finish: no claim left, this fence the last to finish and
--   the epoch already this one; a runner whose claim was taken over is told "lost" even where
--   its successor finished under the same run id — it recovered nothing)
--   Recovery's last step: the claim goes, the epoch is the run id the rebuild is valid for, and
--   field `finished` names the fence that finished.
-- op "moved":  KEYS[1] sk:{A}:meta   -> {"ok", n}
--   Counts a rebalancing round (field `moves`): engines that see it change forget their local
--   sold-out flags, so units moved into a drained bucket are offered again.
-- The engine warms every bucket and gate first and the meta hash last.
local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function lease_arg(least)
  local lease = tonumber(ARGV[3])
  if not lease or lease < least or lease ~= math.floor(lease) then
    return nil
  end
  return lease
end
local function fence_arg()
  if not ARGV[2] or not string.match(ARGV[2], "^%w+$") then
    return nil
  end
  return ARGV[2]
end

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
  if ARGV[3] ~= "plan" and ARGV[3] ~= "installed" then
    return redis.error_reply("ERR warmup: ARGV[3] must be plan or installed")
  end
  if ARGV[3] == "installed" or redis.call("EXISTS", KEYS[2]) == 1 then
    return {"lost"}
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
  redis.call("HSET", KEYS[1], "version", ARGV[2], "buckets", ARGV[3], "epoch", ARGV[4])
  return {"created"}
elseif op == "claim" then
  local fence, lease = fence_arg(), lease_arg(1)
  if not fence or not lease then
    return redis.error_reply("ERR warmup: claim wants an alphanumeric fence and a positive lease")
  end
  local version = redis.call("HGET", KEYS[1], "version")
  if version and version ~= ARGV[4] then
    return redis.error_reply("ERR warmup: plan version mismatch: have " .. version .. ", got " .. ARGV[4])
  end
  local now = now_ms()
  local held = redis.call("HGET", KEYS[1], "claim")
  local deadline = tonumber(redis.call("HGET", KEYS[1], "deadline") or "0")
  if held and held ~= fence and deadline > now then
    return {"busy", held, deadline - now}
  end
  redis.call("HSET", KEYS[1], "version", ARGV[4], "buckets", ARGV[5], "claim", fence, "deadline", now + lease)
  return {"claimed", held or ""}
elseif op == "renew" then
  local fence, lease = fence_arg(), lease_arg(0)
  if not fence or not lease then
    return redis.error_reply("ERR warmup: renew wants an alphanumeric fence and a lease (0: expire now)")
  end
  if redis.call("HGET", KEYS[1], "claim") ~= fence then
    return {"lost"}
  end
  redis.call("HSET", KEYS[1], "deadline", now_ms() + lease)
  return {"renewed"}
elseif op == "finish" then
  local fence = fence_arg()
  if not fence or not ARGV[3] or ARGV[3] == "" then
    return redis.error_reply("ERR warmup: finish wants an alphanumeric fence and an epoch")
  end
  local held = redis.call("HGET", KEYS[1], "claim")
  -- Finished already by this fence with this epoch: this call's own first run, sent again by a
  -- client that lost its reply.
  if not held and redis.call("HGET", KEYS[1], "finished") == fence
      and redis.call("HGET", KEYS[1], "epoch") == ARGV[3] then
    return {"finished"}
  end
  if held ~= fence then
    return {"lost"}
  end
  redis.call("HDEL", KEYS[1], "claim", "deadline")
  redis.call("HSET", KEYS[1], "epoch", ARGV[3], "finished", fence)
  return {"finished"}
elseif op == "moved" then
  -- Never create a meta of its own: after a data loss that is the recovery's to rebuild.
  if redis.call("EXISTS", KEYS[1]) == 0 then
    return {"ok", 0}
  end
  return {"ok", redis.call("HINCRBY", KEYS[1], "moves", 1)}
end
return redis.error_reply("ERR warmup: unknown op " .. tostring(op))
