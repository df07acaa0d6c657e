-- limit.lua — one rate limit shared by every API process (DESIGN §12): GCRA over one key, on
-- Redis's clock (TIME), so that N processes admit what the configuration says, not N times it.
-- The per-process limiter in front of it stays the cheap first layer; this runs only for what
-- that one admitted. Not a stock script: it touches no bucket, and the simulation never runs it.
--
-- KEYS[1] the limit's key (its own hash tag: a user's limit lands on the user's slot)
-- ARGV[1] rate (requests per second)  ARGV[2] burst (requests admitted at once, >= 1)
-- ARGV[3] cost (requests this call takes at once, 1 <= cost <= burst: a process leasing a few
--         permits of a busy global limit per call)
-- -> {1, 0} admitted (the key's theoretical arrival time moves on by cost / rate)
--  | {0, retry_after_ms}: refused, nothing changes; cost requests fit again after that long
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not rate or rate <= 0 then
  return redis.error_reply("ERR limit: rate must be a positive number")
end
if not burst or burst < 1 or burst ~= math.floor(burst) then
  return redis.error_reply("ERR limit: burst must be a positive integer")
end
if not cost or cost < 1 or cost > burst or cost ~= math.floor(cost) then
  return redis.error_reply("ERR limit: cost must be an integer from 1 to burst")
end
local t = redis.call("TIME")
-- Microseconds since the epoch: about 1.8e15, exact in a double (below 2^53).
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = 1000000 / rate
local tat = tonumber(redis.call("GET", KEYS[1]) or "0") or 0
if tat < now then
  tat = now
end
local after = tat + interval * cost
-- Admitted while the arrival time it leaves is at most `burst` intervals ahead of now.
local allow_at = after - interval * burst
if allow_at > now then
  return {0, math.ceil((allow_at - now) / 1000)}
end
redis.call("SET", KEYS[1], string.format("%.0f", after), "PX", math.ceil((after - now) / 1000) + 1)
return {1, 0}
