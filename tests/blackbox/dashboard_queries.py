"""Every query of a Grafana dashboard returns data from a real Prometheus.

Usage: python dashboard_queries.py PROMETHEUS_URL DASHBOARD.json [MORE.json ...]
"""

import json
import sys
import time
import urllib.parse
import urllib.request


def query(prometheus, expr):
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def main(prometheus, dashboards):
    failures = 0
    for path in dashboards:
        with open(path) as f:
            dashboard = json.load(f)
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                answer = {}
                for _ in range(30):
                    answer = query(prometheus, expr)
                    if answer.get("status") == "success" and answer["data"]["result"]:
                        break
                    time.sleep(1)
                if answer.get("status") == "success" and answer["data"]["result"]:
                    print(f"ok: {path}: {panel['title']}: {len(answer['data']['result'])} series")
                else:
                    failures += 1
                    print(f"FAIL: {path}: {panel['title']}: {expr} -> {answer}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
