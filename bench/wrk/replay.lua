-- wrk: the same POST /v1/orders under one Idempotency-Key, over and over: after the
-- first, every request is a replay. TOKEN and KEY come from the environment.
wrk.method = "POST"
wrk.path = "/v1/orders"
wrk.body = '{"sku":"SKU-BENCH","quantity":1}'
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = os.getenv("KEY")
