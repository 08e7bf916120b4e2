"""A broken or hostile server never makes packfmt wait forever (packfmt/storage/transport.py; spec/SECURITY.md A22):
through a proxy in front of the S3-protocol server (tests/s3_proxy.py, moto on 127.0.0.1) that stalls a request (reads
it, never answers), resets its connection, or answers 503 SlowDown / 500, for a whole fetch (``packfmt.open``), a
streamed read (``PackedDataset(url, stream=True)``, a batch through a DataLoader) and an upload (``upload_tree``): a
fault that passes is retried and the read or write completes with the right bytes; one that persists is one
``StorageError`` naming the URL, the attempts and the settings, after about ``PACKFMT_TIMEOUT`` x attempts (set small
here: 1 s, 2 retries). A 4xx is never retried."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import limits
import packfmt
from packfmt.errors import FormatError
from packfmt.storage.errors import StorageError
from packfmt.storage.transport import RETRIES_ENV, TIMEOUT_ENV, policy_of
from packfmt.storage.upload import upload_tree

from s3_proxy import FaultProxy
from s3_server import BUCKET, cache, explicit_options, s3_server, time_limit, write_sample  # noqa: F401

os.environ["HF_HUB_OFFLINE"] = "1"
URL = f"s3://{BUCKET}/f"
STORE, OTHER, COLL, INDEX = f"{URL}/s", f"{URL}/t", f"{URL}/m", "ffd-128"
KINDS = ["stall", "reset", "503", "500"]
TIMEOUT, RETRIES = 1, 2  # a stalled request: refused after about 3 x 1 s (plus about 0.4 s of backoff)


@pytest.fixture(scope="module")
def data(s3_server, tmp_path_factory):
    """A store, and a collection of it and another store, each with pack index ffd-128 (straight to the server)."""
    write_sample(URL, tmp_path_factory.mktemp("writer-cache"))


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """The fault proxy in front of the server, and the small budget: 1 s a request, 2 retries."""
    monkeypatch.setenv(TIMEOUT_ENV, str(TIMEOUT))
    monkeypatch.setenv(RETRIES_ENV, str(RETRIES))
    p = FaultProxy(os.environ["AWS_ENDPOINT_URL"])
    yield p
    p.close()


def _so(proxy: FaultProxy) -> dict:
    return proxy.options(explicit_options())


def _whole(proxy, cache):
    ds = packfmt.open(STORE, storage_options=_so(proxy))
    return np.asarray(ds.tokens).copy()


def _streamed(proxy, cache):
    from torch.utils.data import DataLoader

    from packfmt.torch import PackedDataset, collate_varlen

    ds = PackedDataset(COLL, INDEX, stream=True, storage_options=_so(proxy))
    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate_varlen)))
    return batch["input_ids"].numpy().copy()


def _upload(proxy, cache):
    local = packfmt.open(STORE).path  # the store, mirrored once without faults
    upload_tree(local, f"{URL}/up", _so(proxy))
    return packfmt.open(f"{URL}/up", cache_dir=cache / "check").tokens[:].copy()


#: operation -> (run it, the requests that get the fault: those whose path holds this)
OPS = {"whole fetch": (_whole, "/f/s/tokens.bin"), "streamed batch": (_streamed, "/tokens.bin"),
       "upload": (_upload, "/f/up/tokens.bin")}


def _expected(op: str, cache) -> np.ndarray:
    """What the operation gives without faults (straight to the server, its own cache)."""
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    if op == "streamed batch":
        from torch.utils.data import DataLoader

        from packfmt.torch import PackedDataset, collate_varlen

        return next(iter(DataLoader(PackedDataset(COLL, INDEX), batch_size=4, collate_fn=collate_varlen)))[
            "input_ids"].numpy().copy()
    return np.asarray(packfmt.open(STORE).tokens).copy()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", list(OPS))
def test_a_fault_that_passes_is_retried_and_the_bytes_are_right(data, proxy, cache, op, kind):
    want = _expected(op, cache)
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    run, path = OPS[op]
    proxy.fail(kind, match=path, times=RETRIES)  # every retry but the last meets it
    got = run(proxy, cache)
    assert proxy.left() == 0, "the fault was never hit: the test reads nothing through the proxy"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", list(OPS))
def test_a_fault_that_persists_is_one_storage_error_naming_url_attempts_and_settings(data, proxy, cache, op, kind):
    run, path = OPS[op]
    proxy.fail(kind, match=path, times=1000)
    with limits.time_limit(60, "a persistent fault (expected: about 3 x 1 s)"), pytest.raises(StorageError) as exc:
        run(proxy, cache)
    msg = str(exc.value)
    print(msg)  # (shown with pytest -s: what a user reads)
    assert "\n" not in msg and re.search(rf"s3://{BUCKET}/f/[a-z]+/tokens\.bin", msg) and path in msg, msg
    assert f"{RETRIES + 1} attempts in" in msg, msg
    if kind != "reset":  # (a reset connection says what a refused one says: check the endpoint)
        assert "$PACKFMT_TIMEOUT" in msg and "$PACKFMT_RETRIES" in msg and "packfmt_timeout" in msg, msg
    served = 1000 - proxy.left()
    # one request an attempt (aiohttp sends a GET again, once, on a kept-alive connection the server reset)
    most = 2 * (RETRIES + 1) if kind == "reset" else RETRIES + 1
    assert RETRIES + 1 <= served <= most, f"{served} requests met the fault: {RETRIES + 1} attempts expected"
    if kind == "stall":
        assert exc.value.found == f"no answer within {TIMEOUT:g} s", exc.value.found


def test_a_4xx_is_not_retried(data, proxy, cache, s3_server):
    """A missing object (404) and a bad request answer at once: one request each, the usual message."""
    with pytest.raises(FormatError, match="not a packfmt dataset"):
        packfmt.open(f"{URL}/nothing-here", storage_options=_so(proxy))
    before = proxy.requests
    with pytest.raises(FileNotFoundError):
        from packfmt.storage.transport import remote

        fs, rpath = remote(f"{URL}/nothing-here/x", _so(proxy))
        fs.cat_file(rpath, start=0, end=10)
    assert proxy.requests - before <= 2  # the GET, and s3fs' own HEAD of a missing key: never tried again


def test_an_s3_back_end_keeps_enough_connections_for_the_requests_in_flight(s3_server):  # noqa: F811
    """botocore's pool of 10 connections queued a streamed read's requests (16 members in flight, 3-5 requests
    each) behind each other's round trips; packfmt asks for ``POOL_CONNECTIONS``, and a caller's own value wins."""
    from packfmt.storage.transport import POOL_CONNECTIONS, remote

    fs, _ = remote(f"s3://{BUCKET}/x", {})
    assert fs.fs.config_kwargs["max_pool_connections"] == POOL_CONNECTIONS
    fs, _ = remote(f"s3://{BUCKET}/x", {"config_kwargs": {"max_pool_connections": 3}})
    assert fs.fs.config_kwargs["max_pool_connections"] == 3


def test_settings_from_storage_options_win_and_bad_values_name_the_setting(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "5")
    monkeypatch.delenv(RETRIES_ENV, raising=False)
    p = policy_of({"packfmt_retries": 0})
    assert (p.timeout, p.retries) == (5.0, 0)
    assert policy_of({"packfmt_timeout": 0.5}).timeout == 0.5
    for so, env, name in [({}, "0", "$PACKFMT_TIMEOUT"), ({"packfmt_timeout": "soon"}, "", "packfmt_timeout"),
                          ({"packfmt_retries": -1}, "", "packfmt_retries")]:
        monkeypatch.setenv(TIMEOUT_ENV, env)
        with pytest.raises(ValueError, match=re.escape(name)):
            policy_of(so)
