-- settle.lua — close an open reservation once the ledger holds its order durably. The units stay
-- sold; only the outbox entry goes. Idempotent.
-- KEYS[1] sk:{A.b}:resv   ARGV[1] reservation id   -> {"settled"} | {"absent"}
if redis.call("HDEL", KEYS[1], ARGV[1]) == 1 then
  return {"settled"}
end
return {"absent"}
