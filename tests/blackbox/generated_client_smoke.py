"""A client generated from openapi/openapi.yaml by openapi-python-client, used as any
client developer would use it: create, replay, conflict, cancel, get, list.

Usage: python generated_client_smoke.py BASE_URL TOKEN  (the generated package importable)
"""

import sys
import uuid

from orderd_client import AuthenticatedClient
from orderd_client.api.orders import cancel_order, create_order, get_order, list_orders
from orderd_client.models import CreateOrderRequest, Order, OrderPage, Problem


def check(condition, what):
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main(base, token):
    client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)
    key = f"generated-client-{uuid.uuid4().hex}"
    body = CreateOrderRequest(sku="GEN-1", quantity=2, customer_ref="from a generated client")

    first = create_order.sync_detailed(client=client, body=body, idempotency_key=key)
    check(first.status_code == 201 and isinstance(first.parsed, Order), "create answers 201 with an Order")
    order = first.parsed
    check(first.headers.get("location") == f"/v1/orders/{order.id}", "Location names the order")

    again = create_order.sync_detailed(client=client, body=body, idempotency_key=key)
    check(again.status_code == 201 and again.content == first.content, "a retry replays the same bytes")
    check(again.headers.get("idempotent-replayed") == "true", "the replay says so")

    other = CreateOrderRequest(sku="GEN-1", quantity=3)
    conflict = create_order.sync_detailed(client=client, body=other, idempotency_key=key)
    check(conflict.status_code == 422 and isinstance(conflict.parsed, Problem), "the key with another body is a 422 Problem")
    check(conflict.parsed.type_ == "/problems/idempotency-key-reused", "its type is idempotency-key-reused")

    cancelled = cancel_order.sync_detailed(
        client=client, id=order.id, idempotency_key=f"generated-cancel-{uuid.uuid4().hex}"
    )
    check(cancelled.status_code == 200 and cancelled.parsed.status.value == "CANCELLED", "cancel answers the CANCELLED order")

    fetched = get_order.sync_detailed(client=client, id=order.id)
    check(fetched.status_code == 200 and fetched.parsed.status.value == "CANCELLED", "get sees the cancel")

    page = list_orders.sync_detailed(client=client, limit=10)
    check(isinstance(page.parsed, OrderPage) and [o.id for o in page.parsed.items] == [order.id], "list has exactly the order")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
