"""Every message the relay publishes validates against asyncapi/asyncapi.yaml: the body
against the payload schema of its message, the SNS message attributes against the
headers schema. Black-box: orders are made over HTTP, messages are read back from an SQS
queue subscribed (raw delivery) to the topic orderd publishes to.

Usage: python events_match_asyncapi.py ASYNCAPI_YAML BASE_URL TOKEN QUEUE_URL
(moto's endpoint is taken from QUEUE_URL).
"""

import json
import sys
import time
import urllib.request
import uuid
from urllib.parse import urlsplit

import jsonschema
import yaml


def http(method, url, headers=None, body=None):
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def sqs(queue_url, action, payload):
    parts = urlsplit(queue_url)
    endpoint = f"{parts.scheme}://{parts.netloc}/"
    headers = {
        "X-Amz-Target": f"AmazonSQS.{action}",
        "Content-Type": "application/x-amz-json-1.0",
        "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0",
    }
    status, body = http("POST", endpoint, headers, json.dumps(payload).encode())
    assert status == 200, body
    return json.loads(body or b"{}")


def validators(document):
    """Draft 2020-12 validators for each message's payload and headers, with the
    document's component references resolved inside one schema."""
    schemas = document["components"]["schemas"]
    text = json.dumps(schemas).replace("#/components/schemas/", "#/$defs/")
    defs = json.loads(text)
    out = {}
    for name, message in document["components"]["messages"].items():
        payload_ref = message["payload"]["$ref"].replace("#/components/schemas/", "#/$defs/")
        headers_ref = message["headers"]["$ref"].replace("#/components/schemas/", "#/$defs/")
        checker = jsonschema.FormatChecker()
        out[name] = (
            jsonschema.Draft202012Validator({"$defs": defs, "$ref": payload_ref}, format_checker=checker),
            jsonschema.Draft202012Validator({"$defs": defs, "$ref": headers_ref}, format_checker=checker),
        )
    return out


def main(spec_path, base, token, queue_url):
    with open(spec_path) as f:
        document = yaml.safe_load(f)
    check = validators(document)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    order_ids = []
    # The first create continues a caller's trace: its event must carry it.
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    for i, ref in enumerate(["asyncapi-a", None, "asyncapi-c"]):
        body = {"sku": f"ASYNC-{i}", "quantity": i + 1}
        if ref:
            body["customer_ref"] = ref
        headers = {**auth, "Idempotency-Key": f"asyncapi-{uuid.uuid4().hex}"}
        if i == 0:
            headers["traceparent"] = traceparent
        status, answer = http("POST", f"{base}/v1/orders", headers, json.dumps(body).encode())
        assert status == 201, answer
        order_ids.append(json.loads(answer)["id"])
    for order_id in order_ids[:2]:
        status, answer = http("POST", f"{base}/v1/orders/{order_id}/cancel", {**auth, "Idempotency-Key": f"asyncapi-{uuid.uuid4().hex}"})
        assert status == 200, answer
    expected = len(order_ids) + 2
    messages = []
    deadline = time.time() + 120
    while len(messages) < expected and time.time() < deadline:
        answer = sqs(queue_url, "ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": 10, "MessageAttributeNames": ["All"], "WaitTimeSeconds": 1})
        for message in answer.get("Messages", []):
            messages.append(message)
            sqs(queue_url, "DeleteMessage", {"QueueUrl": queue_url, "ReceiptHandle": message["ReceiptHandle"]})
    if len(messages) != expected:
        print(f"FAIL: {len(messages)} of {expected} messages arrived", file=sys.stderr)
        sys.exit(1)
    failures = 0
    for message in messages:
        body = json.loads(message["Body"])
        attributes = {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}
        payload_validator, headers_validator = check[body.get("event_type", "?")]
        for what, validator, instance in [("body", payload_validator, body), ("attributes", headers_validator, attributes)]:
            errors = sorted(validator.iter_errors(instance), key=str)
            for error in errors:
                failures += 1
                print(f"FAIL: {body.get('event_type')} {what}: {error.message} at {list(error.absolute_path)}", file=sys.stderr)
        print(f"ok: {body['event_type']} {body['event_id']} matches its message in the AsyncAPI document")
        traced = body["order"]["sku"] == "ASYNC-0" and body["event_type"] == "OrderCreated"
        if traced and attributes.get("traceparent") != traceparent:
            failures += 1
            print(f"FAIL: the traced create's event carries traceparent {attributes.get('traceparent')!r}", file=sys.stderr)
        if not traced and "traceparent" in attributes:
            failures += 1
            print("FAIL: an untraced request's event carries a traceparent", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(*sys.argv[1:5])
