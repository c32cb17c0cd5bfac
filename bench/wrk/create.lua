-- wrk: POST /v1/orders with a new Idempotency-Key every request (every one executes).
-- TOKEN comes from the environment. Each wrk thread has its own Lua state, so each
-- draws its own random prefix.
local token = os.getenv("TOKEN")
local prefix
local counter = 0

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
  prefix = string.format("%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
end

function request()
  counter = counter + 1
  return wrk.format("POST", "/v1/orders", {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "bench-" .. prefix .. "-" .. counter,
  }, '{"sku":"SKU-BENCH","quantity":1}')
end
