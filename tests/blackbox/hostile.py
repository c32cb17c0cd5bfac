"""Hostile clients against a running orderd, at a small scale, with the outcome asserted.

Each probe is what an attacker without a token (or a greedy tenant) would try; each
asserts what the service promises instead: authenticated clients keep getting 2xx,
connections held by silent or non-reading clients are closed at their deadline, and the
process's memory and descriptors stay bounded. Plain sockets from the standard library:
nothing here shares code with orderd.

    hostile.py edge BASE TOKEN NOISY_TOKEN PID LOG
        slow heads, slow bodies without a token, a 38 s idle keep-alive connection,
        a noisy tenant and a forged-log attempt, all at once; the instance runs with
        a small in-flight cap, a 2 s read timeout, a 50 s idle timeout and a
        per-tenant rate limit.
    hostile.py non-readers BASE TOKEN PID WRITE_TIMEOUT_S SLOTS
        every connection slot held by clients that pipeline /docs and never read.
    hostile.py descriptors BASE TOKEN PID
        many more silent sockets than the descriptor limit allows connections.
    hostile.py every-path BASE TOKEN PID METRICS_BASE
        a tenant sends every path (those of the served OpenAPI document, the others the
        service serves, one it does not) every method, with an empty chunked body twice
        and then a 256 MiB one; each must be answered, and no 256 MiB body may grow
        the process by 1 MiB.
    hostile.py idle-slots BASE TOKEN PID SLOTS
        every connection slot held by anonymous clients that asked /healthz once and
        went idle; a tenant's create must be answered, and exactly the connection idle
        longest closed for it.
    hostile.py anonymous-bodies BASE TOKEN PID CONNECTIONS
        CONNECTIONS clients without a token, each announcing a 65,536-byte create body,
        sending 60,000 bytes of it and stalling; resident memory is measured before and
        during, and an authenticated create is served throughout.
"""

import asyncio
import json
import os
import resource
import socket
import sys
import threading
import time
import uuid
from urllib.parse import urlparse

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


class Process:
    """Samples a process's resident memory and open descriptors while probes run."""

    def __init__(self, pid):
        self.pid = pid
        self.max_rss_kib = 0
        self.max_fds = 0

    def sample(self):
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    self.max_rss_kib = max(self.max_rss_kib, int(line.split()[1]))
        self.max_fds = max(self.max_fds, len(os.listdir(f"/proc/{self.pid}/fd")))

    async def watch(self, stop):
        while not stop.is_set():
            self.sample()
            await asyncio.sleep(0.2)


async def request(host, port, method, path, token=None, body=None, headers=()):
    """One request on a fresh connection: (status, body bytes)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"host: {host}", "connection: close"]
        if token:
            lines.append(f"authorization: Bearer {token}")
        payload = b""
        if body is not None:
            payload = json.dumps(body).encode()
            lines += ["content-type: application/json", f"content-length: {len(payload)}"]
        lines += list(headers)
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, rest


async def create(host, port, token):
    status, _ = await request(
        host, port, "POST", "/v1/orders", token,
        {"sku": "HOSTILE-1", "quantity": 1},
        headers=[f"idempotency-key: hostile-{uuid.uuid4().hex}"],
    )
    return status


async def until_closed(reader, limit=60.0):
    """Reads until the server closes; returns (seconds it took, what was received)."""
    started = time.monotonic()
    received = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), limit)
            if not chunk:
                break
            received += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except asyncio.TimeoutError:
        return None, received
    return time.monotonic() - started, received


async def trickled(host, port, opening, trickle):
    """Sends `opening` at once and then `trickle`'s bytes one every half second, until
    the server closes the connection: (seconds from the opening, what was received)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(opening)
    await writer.drain()
    started = time.monotonic()

    async def send():
        try:
            for byte in trickle:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.5)
        except (ConnectionError, OSError):
            pass

    sending = asyncio.create_task(send())
    _, received = await until_closed(reader)
    sending.cancel()
    writer.close()
    return time.monotonic() - started, received


async def slow_head(host, port):
    """A request head sent one byte every half second."""
    head = f"GET /v1/orders HTTP/1.1\r\nhost: {host}\r\nx-padding: {'a' * 200}\r\n\r\n"
    return await trickled(host, port, b"", head.encode())


async def slow_body(host, port):
    """A 60,000-byte create announced without a token, its body sent a byte at a time."""
    head = (f"POST /v1/orders HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"idempotency-key: slow-{uuid.uuid4().hex}\r\ncontent-length: 60000\r\n\r\n{{")
    return await trickled(host, port, head.encode(), b" " * 59999)


async def idle_keep_alive(host, port, idle_s):
    """A request, `idle_s` seconds of silence, then another on the same connection."""
    reader, writer = await asyncio.open_connection(host, port)
    ask = f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
    writer.write(ask)
    await writer.drain()
    first = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
    await asyncio.sleep(idle_s)
    try:
        writer.write(ask)
        await writer.drain()
        second = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        second = b""
    writer.close()
    return first.startswith(b"HTTP/1.1 200"), second.startswith(b"HTTP/1.1 200")


async def forged_log_line(host, port, token):
    """An MCP tool call whose tool name carries a line break and a fake log line."""
    call = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "list_orders\nFORGED-LINE level=ERROR msg=\"owned\"", "arguments": {}},
    }
    status, _ = await request(
        host, port, "POST", "/mcp", token, call,
        headers=["accept: application/json, text/event-stream"],
    )
    return status


async def edge(base, token, noisy_token, pid, log):
    url = urlparse(base)
    host, port = url.hostname, url.port
    process = Process(pid)
    stop = asyncio.Event()
    watcher = asyncio.create_task(process.watch(stop))

    idle = asyncio.create_task(idle_keep_alive(host, port, 38))
    # HOSTILE_SOCKETS sets the scale: 60 slow heads and 60 slow bodies in CI.
    sockets = int(os.environ.get("HOSTILE_SOCKETS", "60"))
    heads = [asyncio.create_task(slow_head(host, port)) for _ in range(sockets)]
    bodies = [asyncio.create_task(slow_body(host, port)) for _ in range(sockets)]

    async def flood():
        statuses = []
        deadline = time.monotonic() + 8

        async def worker():
            while time.monotonic() < deadline:
                statuses.append(await create(host, port, noisy_token))

        await asyncio.gather(*(worker() for _ in range(16)))
        return statuses

    flooding = asyncio.create_task(flood())
    await asyncio.sleep(0.5)
    quiet = []
    for _ in range(10):
        quiet += await asyncio.gather(*(create(host, port, token) for _ in range(4)))
        await asyncio.sleep(0.2)
    noisy = await flooding
    check(all(s == 201 for s in quiet),
          f"the quiet tenant's {len(quiet)} creates were all 201 during the attack: {sorted(set(quiet))}")
    check(429 in noisy, f"the noisy tenant met its own limit ({noisy.count(429)} of {len(noisy)} answered 429)")

    head_results = await asyncio.gather(*heads)
    check(all(b" 408 " in received.split(b"\r\n", 1)[0] for _, received in head_results),
          "every slow head was answered 408")
    slowest = max(t for t, _ in head_results)
    check(slowest < 2 + 5, f"every slow head was closed at the 2 s read timeout (slowest {slowest:.1f} s)")
    body_results = await asyncio.gather(*bodies)
    statuses = sorted({received.split(b" ", 2)[1].decode() for _, received in body_results if received})
    # The token is looked at from the head: a body without one is never read, and its
    # sender is answered 401 at once.
    check(statuses == ["401"], f"every slow body without a token was refused 401: {statuses}")
    slowest = max(t for t, _ in body_results)
    check(slowest < 2 + 5, f"every slow body's connection was closed within the read timeout ({slowest:.1f} s)")

    status = await forged_log_line(host, port, token)
    check(status == 200, f"the forged-name tool call was answered ({status})")

    first, second = await idle
    check(first and second, "a keep-alive connection idle for 38 s (idle timeout 50 s) was still served")

    stop.set()
    await watcher
    print(f"peak RSS {process.max_rss_kib / 1024:.1f} MiB, peak descriptors {process.max_fds}")
    check(process.max_rss_kib < 256 * 1024, "resident memory stayed under 256 MiB")
    check(process.max_fds < 2 * sockets + 180,
          "open descriptors stayed bounded (about one per hostile socket)")

    await asyncio.sleep(0.5)
    with open(log, errors="replace") as text:
        lines = text.readlines()
    check(any("FORGED-LINE" in line for line in lines), "the tool call reached the log")
    forged = [line for line in lines if line.startswith("FORGED-LINE")]
    check(not forged, "no log line starts with what a client sent")


async def non_readers(base, token, pid, write_timeout_s, slots):
    url = urlparse(base)
    host, port = url.hostname, url.port
    process = Process(pid)
    hogs = []
    for _ in range(slots):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, port))
        sock.setblocking(False)
        ask = f"GET /docs HTTP/1.1\r\nhost: {host}\r\n\r\n".encode() * 20
        try:
            sock.send(ask)
        except BlockingIOError:
            pass
        hogs.append(sock)
    await asyncio.sleep(0.5)
    process.sample()
    started = time.monotonic()
    status, _ = await request(host, port, "GET", "/healthz")
    waited = time.monotonic() - started
    check(status == 200, f"a new client was served while {slots} non-readers held every slot")
    print(f"the new client waited {waited:.2f} s (write timeout {write_timeout_s} s)")
    check(waited < write_timeout_s + 1 + 5,
          "it was served about when the non-readers' write deadline passed")
    status = await create(host, port, token)
    check(status == 201, f"an authenticated create was served afterwards ({status})")
    closed = 0
    for sock in hogs:
        sock.setblocking(True)
        sock.settimeout(10)
        try:
            while sock.recv(1 << 20):
                pass
            closed += 1  # the server's end of stream
        except socket.timeout:
            pass  # still open
        except OSError:
            closed += 1  # reset by the server
        sock.close()
    check(closed == slots, f"the server closed every non-reader's connection ({closed} of {slots})")
    process.sample()
    print(f"peak RSS {process.max_rss_kib / 1024:.1f} MiB, peak descriptors {process.max_fds}")
    check(process.max_rss_kib < 256 * 1024, "resident memory stayed under 256 MiB")


async def descriptors(base, token, pid):
    url = urlparse(base)
    host, port = url.hostname, url.port
    process = Process(pid)
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    limit = int(line.split()[3])
    stop = asyncio.Event()
    watcher = asyncio.create_task(process.watch(stop))
    silent = []
    for _ in range(limit + 100):
        try:
            silent.append(await asyncio.open_connection(host, port))
        except OSError:
            break
    print(f"{len(silent)} silent sockets opened against a descriptor limit of {limit}")
    served = await asyncio.wait_for(create(host, port, token), 120)
    check(served == 201, f"an authenticated create was served once silent sockets timed out ({served})")
    for _, writer in silent:
        writer.close()
    status, _ = await request(host, port, "GET", "/healthz")
    check(status == 200, "the server still accepts connections afterwards")
    stop.set()
    await watcher
    print(f"peak descriptors {process.max_fds} of {limit}")
    check(process.max_fds <= limit, "the process never held more descriptors than its limit")


async def anonymous_body(host, port, stall_s):
    """One client without a token: a create head announcing 65,536 bytes, 60,000 of them
    sent at once, then silence. Returns the answer's status line, or what happened
    instead (a reset, no answer before the stall ended)."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return f"connect: {e.strerror}"
    head = (f"POST /v1/orders HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"idempotency-key: anon-{uuid.uuid4().hex}\r\ncontent-length: 65536\r\n\r\n")
    try:
        writer.write(head.encode() + b" " * 60000)
        await writer.drain()
        # The whole answer, up to the server's close.
        received = await asyncio.wait_for(reader.read(), stall_s)
        return received.split(b"\r\n", 1)[0].decode(errors="replace") or "closed unanswered"
    except asyncio.TimeoutError:
        return "not closed within the stall"
    except (ConnectionError, OSError) as e:
        return f"reset ({type(e).__name__})"
    finally:
        writer.close()


async def anonymous_bodies(base, token, pid, connections):
    url = urlparse(base)
    host, port = url.hostname, url.port
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    process = Process(pid)
    # A warm process first: the baseline is what serving already costs.
    for _ in range(20):
        await create(host, port, token)
    await asyncio.sleep(0.5)
    process.sample()
    baseline = process.max_rss_kib
    process.max_rss_kib = 0
    stop = asyncio.Event()
    watcher = asyncio.create_task(process.watch(stop))
    started = time.monotonic()
    clients = [asyncio.create_task(anonymous_body(host, port, 15)) for _ in range(connections)]
    await asyncio.sleep(0.5)
    served = await create(host, port, token)
    results = await asyncio.gather(*clients)
    elapsed = time.monotonic() - started
    process.sample()
    stop.set()
    await watcher
    statuses = {}
    for status in results:
        statuses[status] = statuses.get(status, 0) + 1
    growth = (process.max_rss_kib - baseline) / 1024
    print(f"{connections} anonymous 60,000-byte bodies: RSS {baseline / 1024:.1f} MiB before, "
          f"peak {process.max_rss_kib / 1024:.1f} MiB (+{growth:.1f} MiB), "
          f"all answered in {elapsed:.1f} s: {statuses}")
    check(served == 201, f"an authenticated create was served during the flood ({served})")
    answered = statuses.get("HTTP/1.1 401 Unauthorized", 0)
    check(answered + sum(n for s, n in statuses.items() if s.startswith("reset")) == connections,
          f"every anonymous body was refused 401 (or its connection reset), none read: {statuses}")
    check(answered >= connections * 0.9, f"at least 90 % read the 401 itself ({answered} of {connections})")
    # 32 MiB at 1,500 connections: about 22 KiB each, what an open connection costs
    # with no body at all (the bodies are never read, so they add nothing per byte).
    per_connection = growth * 1024 / connections
    check(per_connection < 32 * 1024 / 1500,
          f"the anonymous bodies cost under 32 MiB per 1,500 connections "
          f"(+{growth:.1f} MiB, {per_connection:.1f} KiB a connection)")


def peak_rss_kib(pid):
    """The process's resident high-water mark (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def streamed_blocking(host, port, method, path, token, total):
    """A tenant's chunked body of `total` bytes to `path`, sent (from a thread of its
    own) until the server answers and closes: the status of the answer, 0 for none.
    Plain blocking sockets: asyncio would drop an answer already received when the
    server's close makes the next write fail."""
    sock = socket.create_connection((host, port))
    head = (f"{method} {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {token}\r\n"
            f"idempotency-key: stream-{uuid.uuid4().hex}\r\ncontent-type: application/json\r\n"
            "accept: application/json, text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"

    def send():
        try:
            sock.sendall(head.encode())
            sent = 0
            while sent < total:
                sock.sendall(chunk)
                sent += 65536
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sock.settimeout(60)
    received = b""
    try:
        while b"\r\n" not in received:
            data = sock.recv(4096)
            if not data:
                break
            received += data
    except OSError:
        pass
    sock.close()
    sender.join(5)
    parts = received.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def streamed(host, port, method, path, token, total):
    return await asyncio.to_thread(streamed_blocking, host, port, method, path, token, total)


async def every_path(base, token, pid, metrics_base):
    """What a 256 MiB body costs each path and method, from ready, with no walk first:
    every path the server at `base` mounts (from its OpenAPI document, plus the others,
    and the metrics listener's) is sent every method with an empty chunked body twice,
    then with a 256 MiB one; what the process's peak rose by while the last was answered
    is its cost. The empty ones pay for what the first answers of their kind need (each
    thread's allocator pages, the metrics page's new label sets, what a second answer
    still allocates), which a body does not change."""
    url = urlparse(base)
    host, port = url.hostname, url.port
    status, spec = await request(host, port, "GET", "/openapi.json")
    check(status == 200, "the OpenAPI document is served")
    order = str(uuid.uuid4())
    paths = {p.replace("{id}", order) for p in json.loads(spec)["paths"]}
    paths |= {"/mcp", "/docs", "/docs/", "/openapi.json", "/openapi.yaml", "/healthz", "/readyz",
              "/metrics", "/.well-known/oauth-protected-resource", "/no/such/path"}
    targets = [(host, port, path) for path in sorted(paths)]
    murl = urlparse(metrics_base)
    targets += [(murl.hostname, murl.port, p) for p in ("/metrics", "/healthz", "/readyz", "/console")]
    costs, unanswered = {}, []
    started = time.monotonic()
    for h, p, path in targets:
        for method in METHODS:
            for _ in range(2):
                empty = await streamed(h, p, method, path, token, 0)
            before = peak_rss_kib(pid)
            answered = await streamed(h, p, method, path, token, 256 << 20)
            costs[f"{method} {path}"] = peak_rss_kib(pid) - before
            if not (empty and answered):
                unanswered.append(f"{method} {path}")
    elapsed = time.monotonic() - started
    worst = max(costs, key=costs.get)
    print(f"256 MiB bodies to {len(targets)} paths x {len(METHODS)} methods, each after two empty ones, "
          f"in {elapsed:.1f} s: the peak rose +{sum(costs.values())} KiB in all, "
          f"+{costs[worst]} KiB at most ({worst})")
    check(not unanswered, f"every path and method was answered: {unanswered}")
    held = costs[worst] < 1024
    check(held, f"no 256 MiB body grew the process by 1 MiB (+{costs[worst]} KiB at most)"
          + ("" if held else f": {costs}"))


async def idle_slots(base, token, pid, slots):
    url = urlparse(base)
    host, port = url.hostname, url.port
    idle = []
    for _ in range(slots):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
        check(answer.startswith(b"HTTP/1.1 200"), "an anonymous client asked /healthz and went idle")
        idle.append((reader, writer))
        await asyncio.sleep(0.05)
    started = time.monotonic()
    try:
        served = await asyncio.wait_for(create(host, port, token), 30)
    except asyncio.TimeoutError:
        served = None
    took = time.monotonic() - started
    print(f"a create behind {slots} idle connections (all the slots) answered in {took * 1000:.1f} ms")
    check(served == 201, f"the tenant's create was served ({served})")
    closed = []
    for reader, writer in idle:
        try:
            data = await asyncio.wait_for(reader.read(1), 0.5)
            closed.append(data == b"")
        except asyncio.TimeoutError:
            closed.append(False)
        except (ConnectionError, OSError):
            closed.append(True)
    check(closed[0] and not any(closed[1:]),
          f"exactly the connection idle longest was closed ({closed})")
    status, _ = await request(host, port, "GET", "/readyz")
    check(status == 200, f"probes keep answering ({status})")
    for _, writer in idle:
        writer.close()


def main():
    probe, args = sys.argv[1], sys.argv[2:]
    if probe == "edge":
        base, token, noisy, pid, log = args
        asyncio.run(edge(base, token, noisy, int(pid), log))
    elif probe == "non-readers":
        base, token, pid, write_timeout_s, slots = args
        asyncio.run(non_readers(base, token, int(pid), float(write_timeout_s), int(slots)))
    elif probe == "every-path":
        base, token, pid, metrics_base = args
        asyncio.run(every_path(base, token, int(pid), metrics_base))
    elif probe == "idle-slots":
        base, token, pid, slots = args
        asyncio.run(idle_slots(base, token, int(pid), int(slots)))
    elif probe == "anonymous-bodies":
        base, token, pid, connections = args
        asyncio.run(anonymous_bodies(base, token, int(pid), int(connections)))
    elif probe == "descriptors":
        base, token, pid = args
        asyncio.run(descriptors(base, token, int(pid)))
    else:
        sys.exit(f"unknown probe {probe}")
    if FAILURES:
        sys.exit(f"{len(FAILURES)} hostile-client check(s) failed")


if __name__ == "__main__":
    main()
