"""An HTTP proxy in front of the S3-protocol server that a test (or a benchmark) controls: a link's bandwidth, a
round trip's latency, and faults (a stalled server, a reset connection, a 5xx answer), with every byte counted.

``FaultProxy(upstream)`` listens on 127.0.0.1 and relays each HTTP/1.1 request of a keep-alive connection to
``upstream`` over a connection of its own, parsed one request at a time (so a fault hits one request, not a whole
connection):

- ``latency`` (seconds): every request waits this long before it is relayed (a round trip to a distant store);
- ``rate`` (bytes/s): response and request bodies share one token bucket, the link of one node;
- ``fail(kind, match=, times=)``: the next ``times`` requests whose path contains ``match`` get ``kind``:
  ``"stall"`` (the request is read and never answered: the connection stays open), ``"reset"`` (the connection is
  closed with an RST), ``"503"`` / ``"500"`` (an S3 error answer, the upstream never asked);
- ``got[path]``: body bytes of GET responses per path (``/bucket/key``); ``requests``: requests relayed, and
  ``asked[(method, path)]`` of them per method and path; ``take()`` returns ``got`` and starts it again.

It runs an asyncio loop in a thread of the process that makes it; ``close()`` stops it. Point a process at it with
``options()`` (fsspec ``storage_options``) or ``AWS_ENDPOINT_URL=proxy.endpoint``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections import Counter
from urllib.parse import unquote, urlsplit

__all__ = ["FaultProxy"]

_ERROR = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the test's "
          "proxy</Message></Error>")


class _Bucket:
    """A token bucket of ``rate`` bytes/s (None: no cap) shared by every connection of the proxy."""

    def __init__(self, rate: float | None) -> None:
        self.rate, self.level, self.stamp = rate, 0.0, time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if not self.rate or n <= 0:
            return
        async with self.lock:
            now = time.monotonic()
            self.level = min(self.rate * 0.05, self.level + (now - self.stamp) * self.rate)  # 50 ms of burst at most
            self.stamp = now
            self.level -= n
            if self.level < 0:
                await asyncio.sleep(-self.level / self.rate)


class FaultProxy:
    """See the module doc."""

    CHUNK = 64 << 10

    def __init__(self, upstream: str, *, latency: float = 0.0, rate: float | None = None) -> None:
        up = urlsplit(upstream)
        self.up_host, self.up_port = up.hostname, up.port
        self.latency, self.rate = latency, rate
        self.got: Counter = Counter()
        self.requests = 0
        self.asked: Counter = Counter()
        self._faults: list[list] = []  # [kind, match, times left]
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="s3-proxy")
        self._thread.start()
        self._ready.wait(10)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    # -- control (any thread)
    def fail(self, kind: str, match: str = "", times: int = 1) -> None:
        assert kind in ("stall", "reset", "503", "500"), kind
        with self._lock:
            self._faults.append([kind, match, times])

    def left(self) -> int:
        """Faults asked for and not yet served (0: every one hit a request)."""
        with self._lock:
            return sum(f[2] for f in self._faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def set(self, *, latency: float | None = None, rate: float | None = None) -> None:
        if latency is not None:
            self.latency = latency
        if rate is not None:
            self.rate = rate
            self._bucket.rate = rate

    def take(self) -> Counter:
        with self._lock:
            got, self.got = self.got, Counter()
        return got

    def options(self, base: dict | None = None) -> dict:
        """fsspec ``storage_options`` (``base``, e.g. ``s3_server.explicit_options()``) pointed at this proxy."""
        return {**(base or {}), "endpoint_url": self.endpoint}

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- the loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._bucket = _Bucket(self.rate)
        server = await asyncio.start_server(self._client, "127.0.0.1", 0, limit=1 << 20)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
        self._stalled = None

    def _fault_for(self, path: str) -> str | None:
        with self._lock:
            for f in self._faults:
                if f[1] in path and f[2] > 0:
                    f[2] -= 1
                    return f[0]
        return None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, target, headers, raw = head
                if headers.get("expect", "").lower() == "100-continue":  # (botocore's PUT): answered here, so that
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body comes; not relayed (not signed)
                    await writer.drain()
                    raw = b"".join(line for line in raw.splitlines(keepends=True)
                                   if not line.lower().startswith(b"expect:"))
                body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
                path = unquote(urlsplit(target).path)
                with self._lock:
                    self.requests += 1
                    self.asked[(method, path)] += 1
                if self.latency:
                    await asyncio.sleep(self.latency)
                fault = self._fault_for(path)
                if fault == "stall":
                    await self._stop.wait()  # never answered while the proxy lives
                    return
                if fault == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if fault in ("503", "500"):
                    text = _ERROR.format(code="SlowDown" if fault == "503" else "InternalError").encode()
                    reason = "Slow Down" if fault == "503" else "Internal Server Error"
                    writer.write(f"HTTP/1.1 {fault} {reason}\r\nContent-Type: application/xml\r\nContent-Length: "
                                 f"{len(text)}\r\n\r\n".encode() + text)
                    await writer.drain()
                    continue
                if upstream is None:
                    upstream = await asyncio.open_connection(self.up_host, self.up_port, limit=1 << 20)
                up_r, up_w = upstream
                await self._bucket.take(len(body))
                up_w.write(raw + body)
                await up_w.drain()
                n = await self._relay_response(up_r, writer, method)
                if method == "GET":
                    with self._lock:
                        self.got[path] += n
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    try:
                        w.close()
                    except Exception:  # noqa: BLE001 - already gone
                        pass

    async def _relay_response(self, up_r, writer, method: str) -> int:
        """Relay one response from upstream, its body through the bucket; returns the body's bytes."""
        head = await _read_head(up_r)
        if head is None:
            raise ConnectionError("upstream closed")
        _, _, headers, raw = head
        writer.write(raw)
        if method == "HEAD" or raw.split(b" ", 2)[1] in (b"204", b"304"):
            await writer.drain()
            return 0
        n = 0
        if "chunked" in headers.get("transfer-encoding", ""):
            while True:
                line = await up_r.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                data = await up_r.readexactly(size + 2)
                await self._bucket.take(size)
                writer.write(line + data)
                await writer.drain()
                n += size
                if size == 0:
                    return n
        left = int(headers.get("content-length", 0) or 0)
        while left:
            data = await up_r.read(min(left, self.CHUNK))
            if not data:
                raise ConnectionError("upstream closed mid-body")
            await self._bucket.take(len(data))
            writer.write(data)
            await writer.drain()
            left -= len(data)
            n += len(data)
        return n


async def _read_head(reader: asyncio.StreamReader):
    """``(method or status, target, headers lowercased, raw bytes)`` of one HTTP message head; None at EOF."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("truncated head") from None
        return None
    lines = raw.decode("latin-1").split("\r\n")
    first = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return first[0], first[1] if len(first) > 1 else "", headers, raw
