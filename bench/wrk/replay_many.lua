-- wrk: POST /v1/orders, each request a replay of one of KEYS keys (default 10000) named
-- PREFIX-1 .. PREFIX-KEYS, picked at random, so that most replays miss the replay cache
-- and read their record from the database. TOKEN and PREFIX come from the environment;
-- bench/scale creates the keys first.
local token = os.getenv("TOKEN")
local prefix = os.getenv("PREFIX")
local keys = tonumber(os.getenv("KEYS") or "10000")

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
end

function request()
  return wrk.format("POST", "/v1/orders", {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. "-" .. math.random(1, keys),
  }, '{"sku":"SKU-BENCH","quantity":1}')
end
