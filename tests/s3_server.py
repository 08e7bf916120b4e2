"""A real S3-protocol server for the object-storage tests: moto in server mode on 127.0.0.1.

``s3_server`` (module scope) starts ``python -m moto.server`` on a free port of 127.0.0.1, points the
AWS environment at it (``AWS_ENDPOINT_URL``, dummy credentials, instance metadata off: nothing
leaves the machine), creates the bucket ``bkt`` and stops the server afterwards. ``time_limit``
fails a test that runs longer than ``LIMIT_S`` (pytest-timeout is not installed; SIGALRM instead).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

import limits

LIMIT_S = 120
BUCKET = "bkt"
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def explicit_options() -> dict:
    """fsspec ``storage_options`` naming the running server and its credentials outright: for processes that
    do not inherit this test's environment (the workers of a Ray session started before the server)."""
    return {"key": ENV["AWS_ACCESS_KEY_ID"], "secret": ENV["AWS_SECRET_ACCESS_KEY"],
            "endpoint_url": os.environ["AWS_ENDPOINT_URL"], "client_kwargs": {"region_name": "us-east-1"}}


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
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)
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
