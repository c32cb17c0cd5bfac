"""OpenTelemetry traces of a running orderd, received over OTLP/HTTP and decoded with the
official protobuf definitions (the `opentelemetry-proto` package).

    otlp_traces.py receive PORT OUT
        an OTLP/HTTP receiver: every span of every export is appended to OUT as JSON.
    otlp_traces.py check BASE TOKEN OUT QUEUE_URL LOG
        sends a create that continues a caller's trace and checks what arrived: a server
        span whose parent is the caller's span, child spans under it, a relay span in the
        same trace, the SQS message's `traceparent` attribute, the request log line's
        `trace_id`, and no secret among the span attributes.
"""

import json
import sys
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def receive(port, out):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with open(out, "a") as f:
                for resource in request.resource_spans:
                    service = next((a.value.string_value for a in resource.resource.attributes
                                    if a.key == "service.name"), None)
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            f.write(json.dumps({
                                "service": service,
                                "name": span.name,
                                "kind": Span.SpanKind.Name(span.kind),
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "attributes": {a.key: str(getattr(a.value, a.value.WhichOneof("value")))
                                               for a in span.attributes if a.value.WhichOneof("value")},
                            }) + "\n")
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(port)), Handler).serve_forever()


def sqs(queue_url, action, payload):
    endpoint = queue_url.split("/", 3)[:3]
    request = urllib.request.Request(
        "/".join(endpoint) + "/", data=json.dumps(payload).encode(), method="POST",
        headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0",
                 "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0"})
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read() or b"{}")


def check(base, token, out, queue_url, log):
    failures = []

    def expect(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    key, customer = f"otlp-{uuid.uuid4().hex}", f"secret-customer-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"sku": "OTLP-1", "quantity": 1, "customer_ref": customer}).encode()
    request = urllib.request.Request(f"{base}/v1/orders", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Idempotency-Key": key, "traceparent": f"00-{trace_id}-{parent}-01"})
    with urllib.request.urlopen(request) as answer:
        expect(answer.status == 201, f"the traced create answered {answer.status}")

    spans, deadline = [], time.time() + 60
    while time.time() < deadline:
        with open(out) as f:
            spans = [json.loads(line) for line in f if line.strip()]
        ours = [s for s in spans if s["trace_id"] == trace_id]
        if any(s["kind"] == "SPAN_KIND_PRODUCER" for s in ours):
            break
        time.sleep(0.5)
    ours = [s for s in spans if s["trace_id"] == trace_id]
    for span in ours:
        print(f"     {span['kind']:<20} {span['name']:<22} parent {span['parent_span_id'] or '-'} {span['attributes']}")
    server = [s for s in ours if s["kind"] == "SPAN_KIND_SERVER"]
    expect(len(server) == 1 and server[0]["parent_span_id"] == parent,
           "one server span, a child of the caller's span")
    if server:
        attributes = server[0]["attributes"]
        expect(attributes.get("http.route") == "/v1/orders" and attributes.get("http.response.status_code") == "201",
               "the server span names the route template and the status")
        below, frontier = [], [server[0]["span_id"]]
        while frontier:
            children = [s for s in ours if s["parent_span_id"] in frontier]
            below += children
            frontier = [s["span_id"] for s in children]
        expect(len(below) >= 2, f"{len(below)} spans below the server span (idempotency, database)")
        expect(any(s["attributes"].get("idempotency.outcome") == "created" for s in below),
               "the idempotency span carries its outcome")
    producer = [s for s in ours if s["kind"] == "SPAN_KIND_PRODUCER"]
    expect(len(producer) == 1 and producer[0]["attributes"].get("messaging.system") == "aws_sns",
           "the relay's publish span is in the caller's trace, with the messaging conventions")
    secrets = [token, key, customer]
    leaked = [s["name"] for s in spans for value in s["attributes"].values() if any(x in value for x in secrets)]
    expect(not leaked, "no token, key or customer reference among span attributes")

    attribute, deadline = None, time.time() + 60
    while attribute is None and time.time() < deadline:
        answer = sqs(queue_url, "ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": 10,
                                                    "MessageAttributeNames": ["All"], "WaitTimeSeconds": 1})
        for message in answer.get("Messages", []):
            attribute = message.get("MessageAttributes", {}).get("traceparent", {}).get("StringValue")
    expect(attribute is not None and attribute.split("-")[1] == trace_id,
           f"the SQS message carries the caller's trace id ({attribute})")

    with open(log, errors="replace") as f:
        lines = [json.loads(line) for line in f if line.startswith("{")]
    logged = [line for line in lines if line.get("fields", {}).get("message") == "request"
              and line["fields"].get("route") == "/v1/orders"]
    expect(any(line["fields"].get("trace_id") == trace_id for line in logged),
           "the request log line carries the trace id")
    if failures:
        sys.exit(f"{len(failures)} trace check(s) failed")


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        receive(*sys.argv[2:4])
    else:
        check(*sys.argv[2:7])
