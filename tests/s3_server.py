"""A real S3-protocol server for the object-storage tests: moto in server mode on 127.0.0.1.

``s3_server`` (module scope) starts ``python -m moto.server`` on a free port of 127.0.0.1, points the
AWS environment at it (``AWS_ENDPOINT_URL``, dummy credentials, instance metadata off: nothing
leaves the machine), creates the bucket ``bkt`` and stops the server afterwards; it waits for the server
``READY_S`` seconds times the machine's load factor (``limits``). ``time_limit`` fails a test that runs longer
than ``LIMIT_S`` (scaled the same way; pytest-timeout is not installed; SIGALRM instead).
``GetCounter`` is an HTTP relay in front of that server that counts the bytes each object's GETs
returned, whichever process sent them (a Ray actor included): what a test asserts about reads.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

import limits

LIMIT_S = 120
#: Seconds the server gets to accept connections on an idle machine (scaled by the load: ``limits.wait_until``).
READY_S = 30
BUCKET = "bkt"
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def explicit_options() -> dict:
    """fsspec ``storage_options`` naming the running server and its credentials outright: for processes that
    do not inherit this test's environment (the workers of a Ray session started before the server)."""
    return {"key": ENV["AWS_ACCESS_KEY_ID"], "secret": ENV["AWS_SECRET_ACCESS_KEY"],
            "endpoint_url": os.environ["AWS_ENDPOINT_URL"], "client_kwargs": {"region_name": "us-east-1"}}


class GetCounter:
    """An HTTP relay on 127.0.0.1 in front of the S3-protocol server at ``upstream``: every request goes through
    unchanged (headers, the signed ``Host`` included); ``got[path]`` adds up the body bytes of the GET responses
    for each path (``/bucket/key``, path-style as s3fs sends it to an ``endpoint_url``). Point a process at it
    with ``options()`` (``storage_options``). ``close()`` stops it."""

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self.got: Counter = Counter()
        self._lock = lock = threading.Lock()
        counter = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the S3 clients expect

            def log_message(self, *args) -> None:
                pass

            def _relay(self) -> None:
                assert "chunked" not in (self.headers.get("Transfer-Encoding") or ""), "a chunked upload: not relayed"
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                if self.command == "GET":
                    with lock:
                        counter.got[unquote(urlsplit(self.path).path)] += len(data)
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def options(self) -> dict:
        """``explicit_options()`` through this relay."""
        return {**explicit_options(), "endpoint_url": self.endpoint}

    def take(self) -> Counter:
        """The counts so far, and start again from zero."""
        with self._lock:
            got, self.got = self.got, Counter()
        return got

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def s3_key(url: str) -> str:
    """``s3://bkt/a/b`` -> ``bkt/a/b``: the path the server's fixture (an s3fs file system) takes."""
    return url.removeprefix("s3://")


def write_sample(root: str, writer_cache) -> None:
    """The sample datasets, written straight to the server under ``root`` (``s3://bkt/...``): stores ``s`` (the sample
    text) and ``t`` (its first 20 records), collections ``m`` (of both, a JSON member list) and ``mt`` (the same, a
    member table), each with pack index ``ffd-128``; ``writer_cache``: the cache folder the writes go through."""
    import packfmt
    from packfmt.build import build_text
    from packfmt.collection import write_collection
    from packfmt.packindex import build_pack_index

    sample = os.path.join(os.path.dirname(packfmt.__file__), "sample_data")
    text, tok = os.path.join(sample, "text.jsonl"), os.path.join(sample, "tokenizer")
    os.environ["PACKFMT_CACHE"] = str(writer_cache)
    try:
        build_text([text], f"{root}/s", tok)
        build_text([text], f"{root}/t", tok, limit=20)
        build_pack_index(f"{root}/s", capacity=128)
        for name, table in (("m", False), ("mt", True)):
            write_collection(f"{root}/{name}", [(None, f"{root}/s"), (None, f"{root}/t")], member_table=table)
            build_pack_index(f"{root}/{name}", capacity=128)
    finally:
        del os.environ["PACKFMT_CACHE"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in [*ENV, "AWS_ENDPOINT_URL"]}
    try:
        limits.wait_until(lambda: _accepts(port), f"the moto S3 server on 127.0.0.1:{port}", READY_S,
                          alive=lambda: proc.poll() is None)
        os.environ.update(ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        yield fs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def time_limit():
    with limits.time_limit(LIMIT_S, "an object storage test"):
        yield


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache for this test (``$PACKFMT_CACHE``)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PACKFMT_CACHE", str(root))
    return root
