-- wrk: GET /healthz, the cheapest answer the server gives (no token, no database): the
-- ceiling a replay is compared with on the same server and load tool.
wrk.method = "GET"
wrk.path = "/healthz"
