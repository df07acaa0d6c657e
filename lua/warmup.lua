-- warmup.lua — install an activity's stock plan in Redis. Idempotent: a key that already exists
-- is left exactly as it is (a second warmup must never refill a bucket that has been selling).
--
-- op "bucket": KEYS[1] sk:{A.b}:stock            ARGV[2] initial units of bucket b
--   -> {"created", initial} | {"exists", current}
-- op "meta":   KEYS[1] sk:{A}:meta               ARGV[2] plan version  ARGV[3] bucket count
--   -> {"created"} | {"exists"}; a different plan version is an error (plans never change in place)
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
  redis.call("HSET", KEYS[1], "version", ARGV[2], "buckets", ARGV[3], "state", "open")
  return {"created"}
end
return redis.error_reply("ERR warmup: unknown op " .. tostring(op))
