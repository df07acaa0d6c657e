-- inspect.lua — read-only views for audit, invariants and order status. One bucket per call, so
-- each view is atomic within its slot.
-- op "bucket": KEYS stock, buyers, resv, xfer of one bucket
--   -> {exists (0|1), stock, buyers[], resv (flat field/value list), xfer (flat field/value list)}
-- op "meta":   KEYS[1] sk:{A}:meta          -> flat field/value list (empty when not warmed)
-- op "buyer":  KEYS[1] sk:{A.b}:buyers  ARGV[2] user   -> 0 | 1
local op = ARGV[1]
if op == "bucket" then
  local stock = redis.call("GET", KEYS[1])
  local exists = 1
  if not stock then
    exists, stock = 0, 0
  end
  return {exists, tonumber(stock), redis.call("SMEMBERS", KEYS[2]),
          redis.call("HGETALL", KEYS[3]), redis.call("HGETALL", KEYS[4])}
elseif op == "meta" then
  return redis.call("HGETALL", KEYS[1])
elseif op == "buyer" then
  return redis.call("SISMEMBER", KEYS[1], ARGV[2])
end
return redis.error_reply("ERR inspect: unknown op " .. tostring(op))
