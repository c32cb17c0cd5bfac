"""Reads the soak's CSV (bench/soak_sample.py), draws it as a PNG a person can look at,
and prints the steady-state figures against their targets.

    soak_report.py SAMPLES.csv OUT.png [WARMUP_SECONDS] [WINDOW_SECONDS]

The first window is the WINDOW_SECONDS after WARMUP_SECONDS, the last window the final
WINDOW_SECONDS (defaults: 300 and 600, a 30-minute soak's "first ten minutes after
warm-up" and "last ten"; a short run gets a third of its length each). Targets: p99 per
route in the last window at most 1.3 times the first; resident memory grown less than
10 %; the purged tables' sizes grown less than 5 % (a plateau; orders grow with every
create, by design); the relay's lag p99 at most 50 ms (the mean of the windows', as
for the routes, with the worst window and how many passed 50 ms beside it);
no 5xx; the purges deleting at least what was inserted over the last window. Prints,
asserts nothing (the exit code is 0).
"""

import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TABLES = ["orders", "idempotency_record", "outbox_event"]
# The tables the purges keep at a plateau; orders are the business record and grow with
# every create, by design.
PURGED = ["idempotency_record", "outbox_event"]
KINDS = ["create", "cancel", "list"]


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [{k: float(v) for k, v in row.items()} for row in rows]


def window(rows, start, end):
    return [r for r in rows if start < r["t_s"] <= end]


def finite(values):
    return [v for v in values if not math.isnan(v)]


def mean(values):
    values = finite(values)
    return sum(values) / len(values) if values else float("nan")


def worst(values):
    values = finite(values)
    return max(values) if values else float("nan")


def draw(rows, out):
    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(3, 2, figsize=(14, 12), sharex=True)
    ax = axes[0][0]
    for kind in KINDS:
        ax.plot(t, [r[f"{kind}_p99_ms"] for r in rows], label=f"{kind} p99")
        ax.plot(t, [r[f"{kind}_p50_ms"] for r in rows], linestyle=":", label=f"{kind} p50")
    ax.set_ylabel("ms")
    ax.set_title("latency per route (10 s windows)")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.plot(t, [r["lag_p99_ms"] for r in rows], label="lag p99")
    ax.plot(t, [r["lag_p50_ms"] for r in rows], linestyle=":", label="lag p50")
    ax.axhline(50, color="grey", linewidth=0.5)
    # Logarithmic: the backlog laid down at the start lags by seconds, the steady
    # state by milliseconds.
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title("commit to acknowledgement")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    for table in TABLES:
        ax.plot(t, [r[f"{table}_bytes"] / 2 ** 20 for r in rows], label=table)
    ax.set_ylabel("MiB")
    ax.set_title("relation size with indexes and TOAST")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    for table in TABLES:
        ax.plot(t, [r[f"{table}_live"] for r in rows], label=f"{table} live")
        ax.plot(t, [r[f"{table}_dead"] for r in rows], linestyle=":", label=f"{table} dead")
    ax.set_title("tuples")
    ax.legend(fontsize=8)
    ax = axes[2][0]
    ax.plot(t, [r["rss_mib"] for r in rows], label="RSS MiB")
    ax.plot(t, [r["fds"] for r in rows], label="open descriptors")
    ax.set_title("orderd process")
    ax.set_xlabel("minutes")
    ax.legend(fontsize=8)
    ax = axes[2][1]
    ax.plot(t, [r["requests_per_s"] for r in rows], label="requests/s")
    ax.plot(t, [r["pending_events"] for r in rows], label="pending events")
    ax.plot(t, [r["http_5xx"] for r in rows], label="5xx")
    ax.set_title("load and backlog")
    ax.set_xlabel("minutes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def verdict(ok):
    return "met" if ok else "NOT MET"


def report(rows, warmup, span):
    end = rows[-1]["t_s"]
    first = window(rows, warmup, warmup + span)
    last = window(rows, end - span, end)
    print(f"soak of {end / 60:.1f} min: first window {warmup / 60:.1f}-{(warmup + span) / 60:.1f} min, "
          f"last window {(end - span) / 60:.1f}-{end / 60:.1f} min")
    for kind in KINDS:
        a, b = mean([r[f"{kind}_p99_ms"] for r in first]), mean([r[f"{kind}_p99_ms"] for r in last])
        ratio = b / a if a else float("nan")
        print(f"  {kind} p99 (mean of windows): {a:.1f} -> {b:.1f} ms, x{ratio:.2f}  <= 1.3: {verdict(ratio <= 1.3)}")
    a, b = mean([r["rss_mib"] for r in first]), mean([r["rss_mib"] for r in last])
    growth = b / a - 1
    print(f"  RSS: {a:.1f} -> {b:.1f} MiB, {growth * 100:+.1f} %  < 10 %: {verdict(growth < 0.10)}")
    for table in TABLES:
        a = mean([r[f"{table}_bytes"] for r in first])
        b = mean([r[f"{table}_bytes"] for r in last])
        growth = b / a - 1
        target = f"< 5 %: {verdict(growth < 0.05)}" if table in PURGED else "(grows with every create)"
        print(f"  {table}: {a / 2 ** 20:.0f} -> {b / 2 ** 20:.0f} MiB, {growth * 100:+.1f} %  {target}")
    lags = finite([r["lag_p99_ms"] for r in last])
    lag = mean(lags)
    over = sum(1 for v in lags if v > 50)
    print(f"  relay lag p99 (mean of windows): {lag:.1f} ms  <= 50 ms: {verdict(lag <= 50)}; "
          f"worst window {worst(lags):.1f} ms, {over} of {len(lags)} windows over 50 ms")
    errors = sum(r["http_5xx"] for r in rows)
    print(f"  5xx answers, whole run: {errors:.0f}  == 0: {verdict(errors == 0)}")
    for table in PURGED:
        ins = last[-1][f"{table}_inserted"] - last[0][f"{table}_inserted"]
        dele = last[-1][f"{table}_deleted"] - last[0][f"{table}_deleted"]
        print(f"  {table}: {ins:.0f} inserted, {dele:.0f} deleted in the last window  deleted >= 0.95 x inserted: "
              f"{verdict(dele >= 0.95 * ins)}")
    print(f"  requests/s, last window: {mean([r['requests_per_s'] for r in last]):.0f}")


def main(path, out, warmup=None, span=None):
    rows = load(path)
    if not rows:
        print("soak: no samples")
        return
    end = rows[-1]["t_s"]
    warmup = float(warmup) if warmup else (300.0 if end >= 1800 else end / 6)
    span = float(span) if span else (600.0 if end >= 1800 else end / 3)
    draw(rows, out)
    report(rows, warmup, span)


if __name__ == "__main__":
    main(*sys.argv[1:])
