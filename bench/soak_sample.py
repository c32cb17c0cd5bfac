"""Samples a running orderd and its database every INTERVAL seconds into a CSV, for the
soak (bench/soak). Standard library only; the database through psql.

    soak_sample.py METRICS_URL DATABASE_URL PID OUT.csv [INTERVAL] [SECONDS]

Each row is one window: the request rate, the 5xx answers and the p50/p99 latency per
route in that window (from the deltas of orderd's Prometheus histograms), the relay's
commit-to-acknowledgement p50/p99 in it, the pending events, orderd's resident memory
and open descriptors, and per table the live and dead tuples, the size with indexes and
TOAST, the autovacuum and autoanalyze runs so far, and the rows inserted and deleted so
far. It stops after SECONDS, or when the process is gone.
"""

import csv
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

TABLES = ["orders", "idempotency_record", "outbox_event"]
ROUTES = {
    "create": ("POST", "/v1/orders"),
    "cancel": ("POST", "/v1/orders/{id}/cancel"),
    "list": ("GET", "/v1/orders"),
}
# Labels may hold braces themselves (route="/v1/orders/{id}/cancel"): the label set
# runs to the last closing brace.
SAMPLE = re.compile(r'^([a-z_]+)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|\+Inf)$')
LABEL = re.compile(r'([a-z_]+)="([^"]*)"')


def scrape(url):
    """{(name, frozenset(labels)): value} of the Prometheus text page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = frozenset(LABEL.findall(m.group(2) or ""))
            values[(m.group(1), labels)] = float(m.group(3))
    return values


def histogram(values, name, **match):
    """Cumulative bucket counts {le: count} of histogram `name` summed over the series
    whose labels include `match`."""
    buckets = defaultdict(float)
    for (metric, labels), value in values.items():
        if metric != f"{name}_bucket":
            continue
        labels = dict(labels)
        if all(labels.get(k) == v for k, v in match.items()):
            buckets[float("inf") if labels["le"] == "+Inf" else float(labels["le"])] += value
    return buckets


def quantile(before, after, q):
    """The q-quantile of the observations between two scrapes of one histogram, with
    linear interpolation inside the bucket (as Prometheus' histogram_quantile)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if total <= 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return lower


def counter(values, name, **match):
    return sum(v for (metric, labels), v in values.items()
               if metric == name and all(dict(labels).get(k) == w for k, w in match.items()))


def server_errors(values):
    return sum(v for (metric, labels), v in values.items()
               if metric == "http_requests_total" and dict(labels).get("status", "").startswith("5"))


def database(url):
    query = """
        SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid), autovacuum_count,
               autoanalyze_count, n_tup_ins, n_tup_del
          FROM pg_stat_user_tables WHERE relname IN ('orders', 'idempotency_record', 'outbox_event');
        SELECT 'pending', count(*), 0, 0, 0, 0, 0, 0 FROM outbox_event WHERE status = 'PENDING';
    """
    out = subprocess.run(["psql", "-XAtq", "-F", ",", url, "-c", query], check=True,
                         capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        name, *numbers = line.split(",")
        rows[name] = [int(n) for n in numbers]
    return rows


def process(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def main(metrics_url, database_url, pid, out, interval=10, seconds=10 ** 9):
    interval, seconds = float(interval), float(seconds)
    columns = ["t_s", "requests_per_s", "http_5xx"]
    for kind in ROUTES:
        columns += [f"{kind}_p50_ms", f"{kind}_p99_ms"]
    columns += ["lag_p50_ms", "lag_p99_ms", "pending_events", "rss_mib", "fds"]
    for table in TABLES:
        columns += [f"{table}_{c}" for c in ("live", "dead", "bytes", "autovacuums", "autoanalyzes", "inserted", "deleted")]
    started = time.monotonic()
    before = scrape(metrics_url)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        while time.monotonic() - started < seconds:
            time.sleep(interval)
            if not os.path.exists(f"/proc/{pid}"):
                break
            now = scrape(metrics_url)
            row = [round(time.monotonic() - started, 1)]
            requests = counter(now, "http_requests_total") - counter(before, "http_requests_total")
            row += [round(requests / interval, 1), server_errors(now) - server_errors(before)]
            for method, route in ROUTES.values():
                b = histogram(before, "http_request_duration_seconds", method=method, route=route)
                a = histogram(now, "http_request_duration_seconds", method=method, route=route)
                row += [round(quantile(b, a, 0.5) * 1000, 2), round(quantile(b, a, 0.99) * 1000, 2)]
            b, a = histogram(before, "outbox_publish_lag_seconds"), histogram(now, "outbox_publish_lag_seconds")
            row += [round(quantile(b, a, 0.5) * 1000, 2), round(quantile(b, a, 0.99) * 1000, 2)]
            tables = database(database_url)
            rss, fds = process(pid)
            row += [tables.get("pending", [0])[0], round(rss, 1), fds]
            for table in TABLES:
                row += tables.get(table, [0] * 7)
            writer.writerow(row)
            f.flush()
            before = now


if __name__ == "__main__":
    main(*sys.argv[1:])
