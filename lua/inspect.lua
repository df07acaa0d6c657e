-- inspect.lua — read-only views for audit, invariants and order status. One bucket per call, so
-- each view is atomic within its slot.
-- op "bucket": KEYS stock, buyers, resv, xfer, gate of one bucket; ARGV[2] "summary" leaves the
--   buyers out (the set grows with the sale; the jobs read every bucket every few seconds)
--   -> {exists (0|1), stock, buyers[], resv (flat field/value list), xfer (flat field/value list),
--       gate (its value, or "" when missing)}
-- op "meta":   KEYS[1] sk:{A}:meta          -> flat field/value list (empty when not warmed)
-- op "buyer":  KEYS[1] sk:{A.b}:buyers  ARGV[2] user   -> 0 | 1
-- op "open":   KEYS[1] sk:{A.b}:resv    ARGV[2] reservation id -> its outbox entry | nil
-- Redis answers SMEMBERS and HGETALL in an order of its own (it depends on the encoding and the
-- version); the views are sorted so that every server and the embedded model give the same reply.
local function members(key)
  local m = redis.call("SMEMBERS", key)
  table.sort(m)
  return m
end
local function fields(key)
  local flat = redis.call("HGETALL", key)
  local names, values = {}, {}
  for i = 1, #flat, 2 do
    names[#names + 1] = flat[i]
    values[flat[i]] = flat[i + 1]
  end
  table.sort(names)
  local out = {}
  for _, name in ipairs(names) do
    out[#out + 1] = name
    out[#out + 1] = values[name]
  end
  return out
end

local op = ARGV[1]
if op == "bucket" then
  local stock = redis.call("GET", KEYS[1])
  local exists = 1
  if not stock then
    exists, stock = 0, 0
  end
  local buyers = {}
  if ARGV[2] ~= "summary" then
    buyers = members(KEYS[2])
  end
  return {exists, tonumber(stock), buyers, fields(KEYS[3]), fields(KEYS[4]), redis.call("GET", KEYS[5]) or ""}
elseif op == "meta" then
  return fields(KEYS[1])
elseif op == "buyer" then
  return redis.call("SISMEMBER", KEYS[1], ARGV[2])
elseif op == "open" then
  return redis.call("HGET", KEYS[1], ARGV[2])
end
return redis.error_reply("ERR inspect: unknown op " .. tostring(op))
