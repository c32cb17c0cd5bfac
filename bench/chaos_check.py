"""The history check of the chaos run (bench/chaos): reads what the clients saw (the k6
history, one JSON line per answer), what the database holds, and what reached the bus
(the Kafka topic the relays publish to, read from the start of every partition),
and checks every promise over the whole history:

- each key answered 2xx made exactly one order, the one it was answered with, and any
  other key made at most one (an answer lost in a fault may leave one behind);
- every 2xx answer of a key is byte-for-byte the same (a replay is exact);
- a cancel answered 200 left its order cancelled;
- no answer was a 5xx other than 503 (a fault is "try again", never "broken");
- every order has its events in the outbox, none DEAD, none left unpublished;
- every event in the outbox reached the topic (none lost), nothing else did, each
  under its order's key, and each order's events are in their commit order in its
  partition (duplicates, which at-least-once allows, may repeat an event but never put
  an older one after a newer).

    chaos_check.py HISTORY.jsonl DATABASE_URL KAFKA_BROKERS TOPIC
    chaos_check.py create-topic KAFKA_BROKERS TOPIC      (three partitions, before the run)

Prints the figures and each violation; exits 1 when there is any.
"""

import collections
import json
import sys

from pathlib import Path

import psycopg

# The topic's reading is shared with the black-box Kafka check.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "blackbox"))
import kafka_topic  # noqa: E402


def read_history(path):
    answers = collections.defaultdict(list)
    intents = set()
    statuses = collections.Counter()
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            line = line.strip()
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if entry["op"] == "intent":
                intents.add((entry["tenant"], entry["key"]))
                continue
            statuses[(entry["op"], entry["status"])] += 1
            answers[(entry["op"], entry["tenant"], entry["key"])].append(entry)
    return intents, answers, statuses


def read_topic(brokers, topic, want):
    """Every record of the topic, in partition order, until every event id in `want`
    was seen and the topic stays quiet for a few seconds (or five minutes passed)."""
    quiet_after_all = lambda seen, quiet: want <= seen and quiet >= 5
    return [(message.partition(), message.key().decode(), value)
            for message, value in kafka_topic.read(brokers, topic, quiet_after_all, 300)]


def main():
    if sys.argv[1] == "create-topic":
        kafka_topic.create_topic(*sys.argv[2:4], 3)
        return 0
    history, database_url, brokers, topic = sys.argv[1:5]
    violations = []
    intents, answers, statuses = read_history(history)

    with psycopg.connect(database_url) as conn:
        orders = conn.execute(
            "SELECT tenant_id::text, customer_ref, id::text, status FROM orders WHERE customer_ref LIKE 'chaos-%'"
        ).fetchall()
        events = conn.execute(
            "SELECT event_id::text, aggregate_id::text, aggregate_seq, event_type, status FROM outbox_event"
        ).fetchall()

    by_key = collections.defaultdict(list)
    for tenant, ref, order_id, status in orders:
        by_key[(tenant, ref)].append((order_id, status))
    order_status = {order_id: status for _, _, order_id, status in orders}

    # Every key answered 2xx: the same bytes each time, and what the answer says holds.
    answered = collections.Counter()
    for (op, tenant, key), seen in answers.items():
        good = [a for a in seen if 200 <= a["status"] < 300]
        if not good:
            continue
        answered[op] += 1
        if len({a["sha"] for a in good}) != 1:
            violations.append(f"{op} key {key}: its {len(good)} 2xx answers differ")
        order_id = good[0]["id"]
        if op == "cancel":
            if order_status.get(order_id) != "CANCELLED":
                violations.append(f"cancel key {key}: answered 200, order {order_id} is {order_status.get(order_id)}")
            continue
        made = by_key.get((tenant, key), [])
        if len(made) != 1:
            violations.append(f"key {key}: answered 2xx, made {len(made)} orders")
        elif made[0][0] != order_id:
            violations.append(f"key {key}: answered with order {order_id}, made {made[0][0]}")
    # Every order: made by a key a client sent, one per key.
    for (tenant, key), made in by_key.items():
        if len(made) > 1:
            violations.append(f"key {key}: made {len(made)} orders")
        if (tenant, key) not in intents:
            violations.append(f"order {made[0][0]}: no client sent its key {key} for that tenant")
    unanswered_orders = sum(
        1 for (tenant, key) in by_key
        if not any(200 <= a["status"] < 300 for a in answers.get(("create", tenant, key), []))
    )

    for (op, status), n in statuses.items():
        if status >= 500 and status != 503:
            violations.append(f"{n} {op} answers were {status}")

    # The outbox: every order's events, all published.
    kinds = collections.defaultdict(set)
    seq_of = {}
    for event_id, aggregate_id, seq, event_type, status in events:
        kinds[aggregate_id].add(event_type)
        seq_of[event_id] = (aggregate_id, seq)
        if status != "PUBLISHED":
            violations.append(f"event {event_id} ({event_type} of {aggregate_id}) is {status}")
    for order_id, status in order_status.items():
        if "OrderCreated" not in kinds[order_id]:
            violations.append(f"order {order_id}: no OrderCreated in the outbox")
        if status == "CANCELLED" and "OrderCancelled" not in kinds[order_id]:
            violations.append(f"order {order_id}: cancelled, no OrderCancelled in the outbox")

    # The bus: every event arrived, in its order's commit order.
    records = read_topic(brokers, topic, set(seq_of))
    received = collections.Counter()
    last_seq = {}
    out_of_order = 0
    for _partition, key, value in records:
        event_id = value["event_id"]
        received[event_id] += 1
        if event_id not in seq_of:
            violations.append(f"record {event_id}: no such event in the outbox")
            continue
        aggregate, seq = seq_of[event_id]
        if key != aggregate:
            violations.append(f"event {event_id}: under key {key}, not its order {aggregate}")
        if seq < last_seq.get(aggregate, 0):
            out_of_order += 1
            violations.append(f"order {aggregate}: event {seq} arrived after event {last_seq[aggregate]}")
        last_seq[aggregate] = max(seq, last_seq.get(aggregate, 0))
    lost = [event_id for event_id in seq_of if received[event_id] == 0]
    for event_id in lost[:20]:
        violations.append(f"event {event_id} of order {seq_of[event_id][0]}: never reached the topic")
    if len(lost) > 20:
        violations.append(f"... {len(lost) - 20} more events never reached the topic")
    duplicates = sum(n - 1 for n in received.values() if n > 1)

    tally = ", ".join(f"{op} {status}: {n}" for (op, status), n in sorted(statuses.items()))
    print(f"history: {len(intents)} keys sent, {sum(statuses.values())} answers ({tally})")
    print(f"orders: {len(orders)} ({answered['create']} keys answered 2xx, {unanswered_orders} made by keys "
          f"whose answer was lost), {answered['cancel']} cancels answered 2xx")
    print(f"events: {len(events)} in the outbox, {len(records)} records read back "
          f"({duplicates} redelivered), {len(lost)} lost, {out_of_order} out of order")
    for line in violations[:50]:
        print(f"VIOLATION {line}")
    print(f"violations: {len(violations)}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
