"""The official MCP Python SDK (`mcp` on PyPI), as an agent's host would use it: connect
to /mcp over Streamable HTTP with a bearer token, list the tools, and call create_order
twice with one requestId: one order, and the second call says it replayed. Written
for mcp 2.3 (its transport takes an httpx2 client that carries the token).

Usage: python mcp_python_client.py BASE_URL TOKEN
"""

import asyncio
import json
import sys
import uuid

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def check(condition, what):
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


async def main(base, token):
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers) as http, \
            streamable_http_client(f"{base}/mcp", http_client=http) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            info = await session.initialize()
            check(info.server_info.name == "orderd", f"initialized with protocol {info.protocol_version}")
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            check(sorted(tools) == ["cancel_order", "create_order", "get_order", "list_orders"], "four tools listed")
            pattern = tools["create_order"].input_schema["properties"]["requestId"]["pattern"]
            check(pattern == "^[A-Za-z0-9_-]{16,128}$", "requestId carries the key pattern")
            check(tools["create_order"].output_schema is not None, "create_order has an output schema")

            tag = f"python-sdk-{uuid.uuid4().hex}"
            args = {"requestId": f"python-sdk-{uuid.uuid4().hex}", "sku": "PY-1", "quantity": 2, "customer_ref": tag}
            first = await session.call_tool("create_order", args)
            second = await session.call_tool("create_order", args)
            check(not first.is_error and not second.is_error, "both calls succeed")
            check(first.structured_content == second.structured_content, "both answer the same order")
            check(second.content[0].text.startswith("Replayed"), "the second says it replayed")

            page = await session.call_tool("list_orders", {"limit": 100})
            tagged = [o for o in page.structured_content["items"] if o["customer_ref"] == tag]
            check(len(tagged) == 1, "exactly one order exists for the requestId")

            refused = await session.call_tool("create_order", {**args, "quantity": 3})
            problem = json.loads(refused.content[0].text)
            check(refused.is_error and problem["type"] == "/problems/idempotency-key-reused", "another request under the same requestId is refused")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
