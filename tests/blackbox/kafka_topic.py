"""A Kafka topic from outside, with confluent-kafka: made with its partitions before a
run, and read back from the start of every partition after it. Shared by the Kafka
round trip (`kafka_roundtrip.py`) and the chaos run's history check
(`bench/chaos_check.py`)."""

import json
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(brokers, topic, partitions):
    admin = AdminClient({"bootstrap.servers": brokers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=int(partitions), replication_factor=1)])
    futures[topic].result(timeout=30)


def read(brokers, topic, enough, seconds):
    """Every record of the topic, in partition order, as (message, its JSON value),
    until `enough(event_ids_seen, quiet_polls)` says so or `seconds` passed; a quiet
    poll is a second in which nothing arrived, counted since the last record."""
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"orderd-read-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    records, seen, quiet = [], set(), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not enough(seen, quiet):
        message = consumer.poll(1.0)
        if message is None:
            quiet += 1
            continue
        if message.error():
            raise RuntimeError(message.error())
        quiet = 0
        value = json.loads(message.value())
        seen.add(value["event_id"])
        records.append((message, value))
    consumer.close()
    return records
