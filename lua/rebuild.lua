-- rebuild.lua — replace one bucket's keys with an image built from the ledger, after Redis lost
-- data. Only the recovery job calls it, and only with the activity `recovering` and the order
-- topic drained, so nothing is in flight: no open reservations, no pending marks.
--
-- KEYS[1] sk:{A.b}:stock  KEYS[2] sk:{A.b}:buyers  KEYS[3] sk:{A.b}:resv  KEYS[4] sk:{A.b}:xfer
-- ARGV[1] stock (the ledger's remaining)  ARGV[2] n = number of buyers  ARGV[3..2+n] buyers
-- ARGV[3+n..] xfer field/value pairs to keep (e.g. "rel:<rid>" of cancelled orders)
-- -> {"rebuilt", buyers, xfer fields}
local stock = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
if not stock or stock < 0 or stock ~= math.floor(stock) then
  return redis.error_reply("ERR rebuild: stock must be a non-negative integer")
end
if not n or n < 0 or n ~= math.floor(n) or 2 + n > #ARGV or (#ARGV - 2 - n) % 2 ~= 0 then
  return redis.error_reply("ERR rebuild: bad buyer count or xfer pairs")
end
redis.call("DEL", KEYS[2], KEYS[3], KEYS[4])
redis.call("SET", KEYS[1], stock)
-- Lua 5.1's unpack has a stack limit: add members in chunks.
local chunk = 500
for i = 3, 2 + n, chunk do
  redis.call("SADD", KEYS[2], unpack(ARGV, i, math.min(i + chunk - 1, 2 + n)))
end
local first = 3 + n
for i = first, #ARGV, 2 * chunk do
  redis.call("HSET", KEYS[4], unpack(ARGV, i, math.min(i + 2 * chunk - 1, #ARGV)))
end
return {"rebuilt", n, (#ARGV - 2 - n) / 2}
