-- rebuild.lua — replace one bucket's keys with an image built from the ledger, after Redis lost
-- data (DESIGN §11.3 step 6). Only the recovery that closed this bucket's gate with its fence may
-- call it: the gate must read `recovering` with the same fence, so a runner that lost its claim
-- (paused past its lease, say) can never rebuild a bucket another runner already reopened.
--
-- KEYS[1] stock  KEYS[2] buyers  KEYS[3] resv  KEYS[4] xfer  KEYS[5] gate   (one bucket)
-- ARGV[1] fence  ARGV[2] stock (the ledger's remaining)
-- ARGV[3] n, then n buyers
-- then m, then m reservation ids the ledger holds (their outbox entries go)
-- then xfer field/value pairs to keep ("rel:<rid>" of cancelled orders, the take/give/ack marks
-- of the transfers the ledger's journal holds)
-- -> {"rebuilt", buyers, xfer fields} | {"fenced"} | {"open", reservation id}: an open
--    reservation the ledger does not hold is still here (it was told "queued": the outbox rescue
--    must republish it first); nothing is written.
local fence = ARGV[1]
local stock = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if not fence or not string.match(fence, "^%w+$") then
  return redis.error_reply("ERR rebuild: fence must be alphanumeric")
end
if not stock or stock < 0 or stock ~= math.floor(stock) then
  return redis.error_reply("ERR rebuild: stock must be a non-negative integer")
end
if not n or n < 0 or n ~= math.floor(n) or 4 + n > #ARGV then
  return redis.error_reply("ERR rebuild: bad buyer count")
end
local m = tonumber(ARGV[4 + n])
if not m or m < 0 or m ~= math.floor(m) or 4 + n + m > #ARGV or (#ARGV - 4 - n - m) % 2 ~= 0 then
  return redis.error_reply("ERR rebuild: bad held count or xfer pairs")
end
local gate = redis.call("GET", KEYS[5])
if not gate or string.match(gate, "^recovering|%a+|%d+|%d+|(%w*)$") ~= fence then
  return {"fenced"}
end
local held = {}
for i = 5 + n, 4 + n + m do
  held[ARGV[i]] = true
end
local outbox = redis.call("HGETALL", KEYS[3])
for i = 1, #outbox, 2 do
  local field = outbox[i]
  if not held[field] and not string.match(field, "^pending:") then
    return {"open", field}
  end
end
redis.call("DEL", KEYS[2], KEYS[3], KEYS[4])
redis.call("SET", KEYS[1], stock)
-- Lua 5.1's unpack has a stack limit: add members in chunks.
local chunk = 500
for i = 4, 3 + n, chunk do
  redis.call("SADD", KEYS[2], unpack(ARGV, i, math.min(i + chunk - 1, 3 + n)))
end
local first = 5 + n + m
for i = first, #ARGV, 2 * chunk do
  redis.call("HSET", KEYS[4], unpack(ARGV, i, math.min(i + 2 * chunk - 1, #ARGV)))
end
return {"rebuilt", n, (#ARGV - first + 1) / 2}
