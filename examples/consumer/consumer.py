"""A reference consumer of orderd's events: at least once in, exactly once applied.

Reads the SQS queue subscribed to orderd's SNS topic (raw message delivery) and keeps a
read model of order statuses in PostgreSQL, in a schema of its own (`consumer`). Each
message is handled in one transaction that first records its `event_id` in an inbox
table: a redelivered event finds its id there and changes nothing, so duplicates (which
at-least-once delivery promises) are harmless. Event types it does not know (a newer
orderd's) are recorded and skipped, never an error. The trace the event carries in its
`traceparent` attribute is continued by the span of its handling.

    pip install boto3 'psycopg[binary]' opentelemetry-sdk
    python consumer.py --queue-url URL --database-url postgres://... [--endpoint-url URL]
        [--idle-exit SECONDS]

Prints one line per message: `applied|duplicate|skipped <event_id> <event_type>
trace=<trace id or ->`.
"""

import argparse
import json
import time

import boto3
import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS consumer;
CREATE TABLE IF NOT EXISTS consumer.inbox (
    event_id    uuid PRIMARY KEY,
    event_type  text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS consumer.order_status (
    tenant_id uuid NOT NULL,
    order_id  uuid NOT NULL,
    status    text NOT NULL,
    PRIMARY KEY (tenant_id, order_id)
);
"""

KNOWN = {"OrderCreated", "OrderCancelled"}


def handle(db, tracer, message):
    attributes = {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}
    # Continue the caller's trace: the attribute is a W3C traceparent.
    context = TraceContextTextMapPropagator().extract(carrier=attributes)
    event = json.loads(message["Body"])
    # The attributes are orderd's own (the body is whatever the writer stored).
    event_id = attributes.get("event_id", event.get("event_id"))
    event_type = attributes.get("event_type", event.get("event_type", "?"))
    with tracer.start_as_current_span("orders process", context=context, kind=trace.SpanKind.CONSUMER) as span:
        span.set_attribute("messaging.message.id", event_id)
        trace_id = format(span.get_span_context().trace_id, "032x") if "traceparent" in attributes else "-"
        with db.transaction():
            first = db.execute(
                "INSERT INTO consumer.inbox (event_id, event_type) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (event_id, event_type),
            ).rowcount == 1
            if not first:
                outcome = "duplicate"
            elif event_type not in KNOWN:
                outcome = "skipped"
            else:
                order = event["order"]
                # Events of one order arrive in commit order; the newest status wins.
                db.execute(
                    "INSERT INTO consumer.order_status (tenant_id, order_id, status) VALUES (%s, %s, %s) "
                    "ON CONFLICT (tenant_id, order_id) DO UPDATE SET status = EXCLUDED.status",
                    (event["tenant_id"], order["id"], order["status"]),
                )
                outcome = "applied"
    print(f"{outcome} {event_id} {event_type} trace={trace_id}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--endpoint-url", help="an SQS-compatible endpoint (moto, LocalStack)")
    parser.add_argument("--idle-exit", type=float, help="stop after this many seconds without a message")
    args = parser.parse_args()

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("orderd-consumer")
    sqs = boto3.client("sqs", endpoint_url=args.endpoint_url)
    with psycopg.connect(args.database_url, autocommit=True) as db:
        db.execute(SCHEMA)
        idle_since = time.monotonic()
        while args.idle_exit is None or time.monotonic() - idle_since < args.idle_exit:
            answer = sqs.receive_message(QueueUrl=args.queue_url, MaxNumberOfMessages=10,
                                         MessageAttributeNames=["All"], WaitTimeSeconds=1)
            for message in answer.get("Messages", []):
                idle_since = time.monotonic()
                handle(db, tracer, message)
                # Deleted only once its effect committed: a crash before this line means
                # the message comes again, and the inbox makes that harmless.
                sqs.delete_message(QueueUrl=args.queue_url, ReceiptHandle=message["ReceiptHandle"])


if __name__ == "__main__":
    main()
