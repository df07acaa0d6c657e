-- gate.lua — one bucket's sale gate, `sk:{A.b}:gate` (DESIGN §11.2): the only thing that
-- enforces the operator's intent at the reserve. It shares the bucket's hash tag, so the reserve
-- reads it in the same atomic script as the stock.
--
-- Value: "<state>|<intent>|<version>|<generation>|<fence>"
--   state       open | paused | closed | recovering — what `reserve.lua` obeys (only `open` sells)
--   intent      the operator's latest intent known here (open | paused | closed); equals state
--               unless recovering, when it is what the reopen must return to
--   version     the registry version of that intent: an older write never overrides a newer one
--   generation  the activity's generation (bumped by every recovery); reserve stamps it on the
--               reservation, the ledger refuses orders of an older one
--   fence       the recovery claim that closed the gate (recovering only; else empty)
-- A missing gate counts as closed.
--
-- KEYS[1] sk:{A.b}:gate
-- op "init"    ARGV intent, version, generation      create if missing -> {"created"} | {"exists"}
-- op "set"     ARGV intent, version, generation      the operator's pause / resume / close
--   -> {"ok"} (applied) | {"recovering"} (intent recorded; the reopen applies it)
--    | {"stale"} (a newer intent is already here) | {"missing"} (nothing to gate: closed already)
-- op "close"   ARGV fence, generation                recovery step 3 -> {"closed"}
--   | {"newer", generation}: the gate carries a newer generation than the caller's registry
--   read — a recovery the caller did not see reopened it since, and the caller's claim is stale
--   (a runner paused between its claim and its close must not halt the sale again)
-- op "reopen"  ARGV fence, intent, version, generation
--   -> {"reopened", state} (also when already reopened at this generation: a re-sent reopen)
--    | {"fenced"} (another claim holds the gate, or it is not recovering)
-- op "read"    -> the value, or false
local op = ARGV[1]
local INTENTS = { open = true, paused = true, closed = true }

local function parse(v)
  if not v then
    return nil
  end
  local state, intent, version, generation, fence =
    string.match(v, "^(%a+)|(%a+)|(%d+)|(%d+)|(%w*)$")
  if not state then
    return nil
  end
  return { state = state, intent = intent, version = tonumber(version), generation = tonumber(generation), fence = fence }
end

local function write(g)
  redis.call("SET", KEYS[1], g.state .. "|" .. g.intent .. "|" .. g.version .. "|" .. g.generation .. "|" .. g.fence)
end

local function intent_args(i)
  local intent, version, generation = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if not INTENTS[intent] then
    return nil, redis.error_reply("ERR gate: intent must be open, paused or closed")
  end
  if not version or version < 0 or version ~= math.floor(version) then
    return nil, redis.error_reply("ERR gate: version must be a non-negative integer")
  end
  if not generation or generation < 0 or generation ~= math.floor(generation) then
    return nil, redis.error_reply("ERR gate: generation must be a non-negative integer")
  end
  return { intent = intent, version = version, generation = generation }
end

local function fence_arg(i)
  local fence = ARGV[i]
  if not fence or not string.match(fence, "^%w+$") then
    return nil
  end
  return fence
end

if op == "read" then
  return redis.call("GET", KEYS[1])
end

local current = redis.call("GET", KEYS[1])
local gate = parse(current)
if current and not gate then
  return redis.error_reply("ERR gate: unreadable gate " .. current)
end

if op == "init" or op == "set" then
  local want, err = intent_args(2)
  if not want then
    return err
  end
  if op == "init" then
    if gate then
      return {"exists"}
    end
    write({ state = want.intent, intent = want.intent, version = want.version, generation = want.generation, fence = "" })
    return {"created"}
  end
  if not gate then
    return {"missing"}
  end
  if want.version <= gate.version then
    return {"stale"}
  end
  gate.intent, gate.version = want.intent, want.version
  if gate.state == "recovering" then
    write(gate)
    return {"recovering"}
  end
  gate.state = want.intent
  write(gate)
  return {"ok"}
elseif op == "close" then
  local fence = fence_arg(2)
  if not fence then
    return redis.error_reply("ERR gate: fence must be alphanumeric")
  end
  local generation = tonumber(ARGV[3])
  if not generation or generation < 0 or generation ~= math.floor(generation) then
    return redis.error_reply("ERR gate: generation must be a non-negative integer")
  end
  if gate and gate.generation > generation then
    return {"newer", gate.generation}
  end
  gate = gate or { intent = "closed", version = 0, generation = 0 }
  gate.state, gate.fence = "recovering", fence
  write(gate)
  return {"closed"}
elseif op == "reopen" then
  local fence = fence_arg(2)
  if not fence then
    return redis.error_reply("ERR gate: fence must be alphanumeric")
  end
  local want, err = intent_args(3)
  if not want then
    return err
  end
  -- Reopened already at this generation: this call's own first run (a client that lost the
  -- reply and sent the script again). Only the runner whose bump made the generation reopens
  -- at it; a runner that took over bumps past it first.
  if gate and gate.state ~= "recovering" and gate.fence == "" and gate.generation == want.generation then
    return {"reopened", gate.state}
  end
  if not gate or gate.state ~= "recovering" or gate.fence ~= fence then
    return {"fenced"}
  end
  -- The newer intent wins: an operator's pause that reached the gate during the recovery stands.
  if want.version > gate.version then
    gate.intent, gate.version = want.intent, want.version
  end
  gate.state, gate.generation, gate.fence = gate.intent, want.generation, ""
  write(gate)
  return {"reopened", gate.state}
end
return redis.error_reply("ERR gate: unknown op " .. tostring(op))
