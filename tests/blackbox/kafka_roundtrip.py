"""Kafka from outside, with confluent-kafka (librdkafka as PyPI ships it), a client
nobody here wrote.

    kafka_roundtrip.py create-topic BROKERS TOPIC PARTITIONS
    kafka_roundtrip.py run BASE_URL TOKENS_FILE BROKERS TOPIC ASYNCAPI_YAML

`run` creates 1,000 orders for the tenants of TOKENS_FILE (JSON: [[tenant, token], ...])
over HTTP, cancels every fourth one and sends a `traceparent` with every tenth create;
then it consumes the topic from the beginning and checks every event of the run: the
record key is the order id, the value the event, the headers its identity, each order's
events in one partition and in commit order, none missing, and each record's key,
headers and value valid against its Kafka message in the AsyncAPI document. Every
record is also read as a CloudEvent by the official CloudEvents SDK (its Kafka binding,
binary content mode), and each attribute is checked against the event. Exits 1 on any
violation.
"""

import json
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from datetime import datetime
from concurrent.futures import ThreadPoolExecutor

import confluent_kafka
import jsonschema
from cloudevents.kafka import KafkaMessage, from_binary
import yaml
import kafka_topic
from events_match_asyncapi import validators

ORDERS = 1000


def post(url, token, key, body=None, traceparent=None):
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    if traceparent:
        headers["traceparent"] = traceparent
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def write(base, tenants):
    """Creates ORDERS orders over the tenants; returns {order_id: (tenant, events, traceparent)}."""

    def one(i):
        tenant, token = tenants[i % len(tenants)]
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01" if i % 10 == 0 else None
        status, order = post(f"{base}/v1/orders", token, f"kafka-rt-{uuid.uuid4()}",
                             {"sku": f"KAFKA-{i}", "quantity": 1 + i % 7}, traceparent)
        assert status == 201, (status, order)
        events = ["OrderCreated"]
        if i % 4 == 0:
            status, cancelled = post(f"{base}/v1/orders/{order['id']}/cancel", token,
                                     f"kafka-rt-{uuid.uuid4()}")
            assert status == 200 and cancelled["status"] == "CANCELLED", (status, cancelled)
            events.append("OrderCancelled")
        return order["id"], (tenant, events, traceparent)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(one, range(ORDERS)))


def consume(brokers, topic, want, seconds=180):
    """The topic's records until `want` distinct events were seen (or `seconds` passed)."""
    return [
        {
            "partition": message.partition(),
            "offset": message.offset(),
            "key": message.key().decode(),
            "value": value,
            "headers": {k: v.decode() for k, v in (message.headers() or [])},
            "as_received": KafkaMessage(headers=dict(message.headers() or []),
                                        key=message.key(), value=message.value()),
        }
        for message, value in kafka_topic.read(brokers, topic, lambda seen, _: len(seen) >= want, seconds)
    ]


def asyncapi_checker(document):
    """A function that says what is wrong with a record against its Kafka message of
    the AsyncAPI document."""
    messages = validators(document)
    key = jsonschema.Draft202012Validator(document["components"]["schemas"]["RecordKey"],
                                          format_checker=jsonschema.FormatChecker())
    return lambda record: asyncapi_problems(messages, key, record)


def asyncapi_problems(messages, key, record):
    name = f"{record['value'].get('event_type')}OnKafka"
    if name not in messages:
        return [f"no Kafka message {name} in the AsyncAPI document"]
    payload, headers = messages[name]
    problems = []
    for what, validator, instance in [("value", payload, record["value"]),
                                      ("headers", headers, record["headers"]),
                                      ("key", key, record["key"])]:
        problems += [f"{name} {what}: {e.message}" for e in validator.iter_errors(instance)]
    return problems


def cloudevent_problems(record):
    """What the CloudEvents SDK reads differently from the event the record carries."""
    value = record["value"]
    try:
        event = from_binary(record["as_received"], data_unmarshaller=json.loads)
    except Exception as e:  # the SDK refused the record: that is the finding
        return [f"not a CloudEvent: {e!r}"]
    wanted = {
        "specversion": "1.0",
        "id": value["event_id"],
        "source": f"/orderd/tenants/{value['tenant_id']}",
        "type": value["event_type"],
        "subject": value["order"]["id"],
        "datacontenttype": "application/json",
    }
    problems = [f"CloudEvent {name} {event.get(name)!r}, wanted {want!r}"
                for name, want in wanted.items() if event.get(name) != want]
    sent = datetime.fromisoformat(value["occurred_at"])
    if datetime.fromisoformat(event.get("time") or "1970-01-01T00:00:00Z") != sent:
        problems.append(f"CloudEvent time {event.get('time')}, the event occurred at {sent}")
    if event.data != value:
        problems.append("CloudEvent data is not the event")
    return problems


def check(orders, records, document):
    problems = []
    by_key = defaultdict(list)
    against_asyncapi = asyncapi_checker(document)
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        problems += against_asyncapi(r)
        problems += cloudevent_problems(r)
        value, headers = r["value"], r["headers"]
        order_id = value["order"]["id"]
        if r["key"] != order_id:
            problems.append(f"key {r['key']} is not the order id {order_id}")
        for name in ("event_id", "event_type", "tenant_id"):
            if headers.get(name) != str(value[name]):
                problems.append(f"header {name}={headers.get(name)} but the event says {value[name]}")
        if headers.get("schema_version") != str(value["schema_version"]):
            problems.append(f"schema_version header {headers.get('schema_version')}")
        by_key[r["key"]].append(r)
    duplicates = 0
    for order_id, (tenant, events, traceparent) in orders.items():
        got = by_key.get(order_id, [])
        if len({r["partition"] for r in got}) > 1:
            problems.append(f"order {order_id} spread over partitions")
        types = []
        for r in got:
            if types and types[-1] == r["value"]["event_type"]:
                duplicates += 1  # at least once: a redelivery, in place
                continue
            types.append(r["value"]["event_type"])
        if types != events:
            problems.append(f"order {order_id}: {types}, wanted {events}")
        if got and got[0]["value"]["tenant_id"] != tenant:
            problems.append(f"order {order_id} published for another tenant")
        if got and got[0]["headers"].get("traceparent") != traceparent:
            problems.append(f"order {order_id}: traceparent {got[0]['headers'].get('traceparent')}, sent {traceparent}")
    extra = set(by_key) - set(orders)
    if extra:
        problems.append(f"{len(extra)} orders nobody created")
    return problems, duplicates


def run(base, tokens_file, brokers, topic, asyncapi):
    with open(tokens_file) as f:
        tenants = json.load(f)
    with open(asyncapi) as f:
        document = yaml.safe_load(f)
    started = time.monotonic()
    orders = write(base, tenants)
    wrote = time.monotonic() - started
    want = sum(len(events) for _, events, _ in orders.values())
    records = consume(brokers, topic, want)
    problems, duplicates = check(orders, records, document)
    partitions = len({r["partition"] for r in records})
    print(f"kafka: {len(orders)} orders of {len(tenants)} tenants written in {wrote:.1f} s; "
          f"{len(records)} records read back over {partitions} partitions by confluent-kafka "
          f"{confluent_kafka.version()} (librdkafka {confluent_kafka.libversion()[0]}), "
          f"{want} events expected, {duplicates} redelivered")
    if records:
        first = from_binary(records[0]["as_received"], data_unmarshaller=json.loads)
        attributes = {k: v.decode() if isinstance(v, bytes) else v
                      for k, v in first.get_attributes().items()}
        print(f"  one record as the CloudEvents SDK reads it: {json.dumps(attributes)}")
    for problem in problems[:20]:
        print("  " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "create-topic":
        kafka_topic.create_topic(*sys.argv[2:5])
        print(f"created {sys.argv[3]} with {sys.argv[4]} partitions")
    else:
        sys.exit(run(*sys.argv[2:7]))
