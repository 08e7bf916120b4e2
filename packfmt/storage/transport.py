"""Every request packfmt makes to object storage: a deadline, bounded retries, one error when the budget is spent.

``remote(url, storage_options)`` is the file system of a URL as packfmt uses it: a ``Remote`` over fsspec's, whose
methods (GET, ranged GET, HEAD, LIST, PUT, DELETE; an upload of a large file is its multipart requests) each run
under packfmt's rules (README "Remote data"; spec/SECURITY.md A22):

* **A deadline.** A request must finish within ``timeout`` seconds for each 8 MiB it moves (``CHUNK_BYTES``: one
  for a HEAD, a LIST, a DELETE or a ranged GET of the cache, which never asks for more; ``n`` for a PUT or a GET
  of ``n`` chunks). An async back end (s3fs, gcsfs, adlfs, http) runs the request as a coroutine on its own loop,
  waited for with ``.result(deadline)`` and cancelled when the deadline passes, so a stalled connection is
  closed, not left waiting. A sync one (sftp ...) runs in a thread joined with the deadline (a thread stuck in
  its call is left to end on its own); a local or in-memory one is called as it is. For ``s3://`` the back end
  itself also gets ``connect_timeout`` and ``read_timeout`` of ``timeout`` seconds and no retries of its own
  (botocore's and s3fs'): the retries are packfmt's, counted here. A listing of many pages (``find``, a recursive
  ``rm``) gets ``LIST_UNITS`` deadlines (each page is one request that the back end's own read timeout bounds).
* **Retries, for what may pass.** A request that stalls, whose connection is reset or refused, or that is
  answered 5xx or throttled (503 SlowDown, 429) is tried again after an exponential backoff with jitter
  (``BACKOFF_S`` doubling, at most ``BACKOFF_CAP_S``, each wait between half and all of it), at most ``retries``
  times. Anything else (a 4xx: a missing object, access denied, a bad range) is the caller's at once: the
  ``FileNotFoundError`` or ``PermissionError`` that ``errors.describe`` turns into the usual one-line message.
* **One error after the budget**: a ``StorageError`` naming the URL, the attempts, the time they took, the last
  failure and the settings to change.

Settings (README "Remote data"): ``$PACKFMT_TIMEOUT`` (seconds a request, per 8 MiB; default ``TIMEOUT_S``) and
``$PACKFMT_RETRIES`` (retries after the first attempt; default ``RETRIES``), or the ``storage_options`` keys
``packfmt_timeout`` / ``packfmt_retries`` (``uri.PACKFMT_OPTIONS``), which win over the environment and are taken
out before fsspec sees the options. Worst case for a server that never answers: about
``timeout x (retries + 1)`` plus the backoffs (30 s x 5 + about 3 s by default).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from .._io import CHUNK_BYTES
from .errors import StorageError, describe
from .uri import PACKFMT_OPTIONS, filesystem, fsspec_options

__all__ = ["TIMEOUT_ENV", "RETRIES_ENV", "TIMEOUT_S", "RETRIES", "Policy", "Remote", "policy_of", "remote",
           "as_remote", "transient"]

TIMEOUT_ENV, RETRIES_ENV = "PACKFMT_TIMEOUT", "PACKFMT_RETRIES"
#: Seconds a request may take for each 8 MiB it moves (a HEAD or a small GET: one). A healthy object store answers a
#: ranged GET of 8 MiB in well under a second to a few seconds; 30 s is a stall, or a link below ~280 KB/s.
TIMEOUT_S = 30.0
#: Retries after the first attempt.
RETRIES = 4
BACKOFF_S, BACKOFF_CAP_S = 0.25, 8.0
#: Connections one process keeps open to an S3 endpoint (botocore's ``max_pool_connections``, default 10). A streamed
#: read keeps up to 16 members in flight, each 3-5 requests at once (``remote.plan``, ``remote.member_fetch``): with
#: 10 connections the requests queued behind each other's round trips (100 KiB shards at 75 ms: a third of the rate).
POOL_CONNECTIONS = 64
#: Deadlines a listing of many pages gets (``find``: 1,000 keys a page on S3).
LIST_UNITS = 100
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
              "ServiceUnavailable", "InternalError", "RequestTimeout"}
#: Failures of the connection or of the wait, not of the request: tried again (exception class names, so that
#: nothing here imports a back end).
_NETWORK = {"ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError",
            "HTTPClientError", "ResponseParserError", "IncompleteRead", "ClientPayloadError", "ServerDisconnectedError",
            "ClientOSError", "ClientConnectionError", "ServerTimeoutError", "FSTimeoutError", "ConnectionError",
            "TimeoutError"}


@dataclass(frozen=True)
class Policy:
    """How long a request may take and how often it is tried (see the module doc)."""

    timeout: float  # seconds a request, per CHUNK_BYTES it moves
    retries: int  # retries after the first attempt

    def deadline(self, nbytes: int = 0) -> float:
        """Seconds a request moving ``nbytes`` may take."""
        return self.timeout * max(1, math.ceil(nbytes / CHUNK_BYTES))

    def backoff(self, k: int) -> float:
        """Seconds to wait before retry ``k`` (0-based): exponential, capped, with jitter (half to all of it), so that
        many processes throttled at once do not come back at once."""
        top = min(BACKOFF_CAP_S, BACKOFF_S * 2 ** k)
        return top / 2 + random.uniform(0, top / 2)

    def settings(self) -> str:
        """The settings to change, as a user types them."""
        return (f"${TIMEOUT_ENV} (now {self.timeout:g} s a request) / ${RETRIES_ENV} (now {self.retries}), or "
                f"storage_options={{'packfmt_timeout': ..., 'packfmt_retries': ...}}")


def _setting(options: dict, key: str, env: str, default, kind, low, what: str):
    raw = options.get(key, os.environ.get(env, ""))
    if isinstance(raw, str) and not raw.strip():
        return default
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not low <= value < float("inf") or value != value:
        where = f"storage_options[{key!r}]" if key in options else f"${env}"
        raise ValueError(f"{where}: expected {what}, found {raw!r}; unset it for the default {default}")
    return value


def policy_of(storage_options: dict | None = None) -> Policy:
    """The ``Policy`` of these options (``packfmt_timeout`` / ``packfmt_retries``), else of the environment."""
    so = storage_options or {}
    timeout = _setting(so, PACKFMT_OPTIONS[0], TIMEOUT_ENV, TIMEOUT_S, float, 0.001, "seconds > 0 a request may take")
    retries = _setting(so, PACKFMT_OPTIONS[1], RETRIES_ENV, RETRIES, int, 0, "an integer >= 0 of retries")
    return Policy(float(timeout), min(int(retries), 100))


def _backend_options(url: str, so: dict, policy: Policy) -> dict:
    """fsspec's options for ``url``: the caller's, and for ``s3://`` botocore's timeouts set to the policy's, its own
    retries off (packfmt's count) and ``POOL_CONNECTIONS`` connections; a value the caller set is kept (an instance made with these options is
    packfmt's: fsspec caches one per distinct set of options)."""
    out = fsspec_options(so)
    if _is_s3(url):
        config = dict(out.get("config_kwargs") or {})
        config.setdefault("connect_timeout", policy.timeout)
        config.setdefault("read_timeout", policy.timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        config.setdefault("max_pool_connections", POOL_CONNECTIONS)
        out["config_kwargs"] = config
    return out


def remote(url: str, storage_options: dict | None = None) -> tuple["Remote", str]:
    """``(Remote, path)`` for ``url``: its file system under packfmt's request rules, and the path inside it."""
    so = storage_options or {}
    policy = policy_of(so)
    fs, path = filesystem(url, _backend_options(url, so, policy))
    if _is_s3(url):
        fs.retries = 1  # s3fs's own loop (5 tries of a timeout or a SlowDown) off too: the retries counted are ours
    return Remote(fs, policy, so), path


def _is_s3(url: str) -> bool:
    return url.partition("://")[0].lower() in ("s3", "s3a")


def as_remote(fs, storage_options: dict | None = None) -> "Remote":
    """``fs`` itself when it is a ``Remote``, else fsspec's file system ``fs`` under the rules of ``storage_options``
    (a caller that made it with ``uri.filesystem``)."""
    return fs if isinstance(fs, Remote) else Remote(fs, policy_of(storage_options), storage_options or {})


def transient(exc: BaseException) -> str | None:
    """What ``exc`` says went wrong when another attempt may succeed (a stall, a dropped connection, a 5xx or a
    throttled answer), in a few words; None when it may not (a 4xx: a missing object, access denied; a local
    error). The back end's exception and the ones it was raised from (``__cause__``: s3fs turns botocore's
    ``ClientError`` of a 503 into an ``OSError``) are looked at."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return None
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        status, code = _status(e)
        if status == 429 or (status or 0) >= 500 or code in _THROTTLED:
            return f"{status or ''} {code or 'server error'}".strip()
        if status is not None:
            return None  # another answer of the server (a 4xx): not a failure of the link
        if {c.__name__ for c in type(e).__mro__} & _NETWORK:
            return f"{type(e).__name__}: {_first_line(e)}"
        e = e.__cause__
    return None


def _status(e: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and error code an exception carries (botocore's ``response``; gcsfs' / aiohttp's ``code`` /
    ``status``)."""
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return (status if isinstance(status, int) else None), (resp.get("Error") or {}).get("Code")
    for attr in ("status", "code"):
        v = getattr(e, attr, None)
        if isinstance(v, int) and 100 <= v < 600:
            return v, None
    return None, None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


class _Stalled(Exception):
    """A request that did not finish within its deadline (cancelled)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s")


class Remote:
    """An fsspec file system whose requests run under a ``Policy`` (see the module doc). The methods are fsspec's,
    each one request (``find``, ``rm(recursive=True)``: a few); ``fs``: the back end itself."""

    def __init__(self, fs, policy: Policy, storage_options: dict | None = None) -> None:
        self.fs, self.policy, self.so = fs, policy, storage_options or {}
        protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self.local = bool({"file", "local", "memory"} & set(protocol))
        self.async_impl = bool(getattr(fs, "async_impl", False))

    # -- the requests
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes ``[start, end)`` (all without a range). A range that starts at or past the object's end
        is ``b""`` (S3 answers 416 where a file answers nothing)."""
        n = (end - (start or 0)) if end is not None else 0
        try:
            return self._call("cat_file", path, nbytes=n, start=start, end=end)
        except (FileNotFoundError, StorageError):
            raise
        except Exception:
            if start is not None and end is not None and start < end:
                size = self._size_or_none(path)
                if size is not None and size <= start:
                    return b""
            raise

    def info(self, path: str) -> dict:
        return self._call("info", path)

    def size(self, path: str) -> int:
        return int(self._call("info", path)["size"])

    def exists(self, path: str) -> bool:
        return self._call("exists", path)

    def isdir(self, path: str) -> bool:
        return self._call("isdir", path)

    def ls(self, path: str, detail: bool = False):
        return self._call("ls", path, detail=detail)

    def find(self, path: str, detail: bool = False):
        return self._call("find", path, units=LIST_UNITS, detail=detail)

    def get_file(self, rpath: str, lpath: str, size: int = 0) -> None:
        """Download ``rpath`` to ``lpath`` (``size``: its bytes, when known: its deadline)."""
        self._call("get_file", rpath, str(lpath), nbytes=size)

    def put_file(self, lpath: str, rpath: str) -> None:
        self._call("put_file", str(lpath), rpath, url_of=rpath, nbytes=os.path.getsize(lpath))

    def pipe_file(self, path: str, data: bytes) -> None:
        self._call("pipe_file", path, data, nbytes=len(data))

    def rm_file(self, path: str) -> None:
        self._call("rm_file", path)

    def rm(self, path: str, recursive: bool = False) -> None:
        self._call("rm", path, units=LIST_UNITS if recursive else 1, recursive=recursive)

    def invalidate_cache(self, path: str | None = None) -> None:
        """fsspec's listing cache dropped (no request)."""
        self.fs.invalidate_cache(path)

    def url(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    # -- the rules
    def _size_or_none(self, path: str) -> int | None:
        try:
            return self.size(path)
        except Exception:  # noqa: BLE001 - the caller reports its own error
            return None

    def _call(self, method: str, *args, url_of: str | None = None, nbytes: int = 0, units: int = 1, **kw):
        """``fs.<method>(*args, **kw)`` under the policy: each attempt within its deadline (``nbytes`` it moves,
        ``units`` deadlines), transient failures tried again after a backoff, one ``StorageError`` (naming
        ``url_of``, else the first argument) once the retries are spent."""
        policy = self.policy
        deadline = policy.deadline(nbytes) * units
        began, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                return self._once(method, args, kw, deadline)
            except Exception as exc:  # noqa: BLE001 - sorted here; what may not pass is raised unchanged
                why = str(exc) if isinstance(exc, _Stalled) else transient(exc)
                if why is None:
                    raise
                if attempts > policy.retries:
                    raise self._spent(url_of or args[0], exc, why, attempts, time.monotonic() - began) from None
            time.sleep(policy.backoff(attempts - 1))

    def _once(self, method: str, args: tuple, kw: dict, deadline: float):
        if self.local:
            return getattr(self.fs, method)(*args, **kw)
        if self.async_impl:  # the coroutine on the back end's loop, cancelled at the deadline
            import asyncio  # here: a local open imports this module (check_mirror), asyncio and ssl cost it 0.02 s

            fut = asyncio.run_coroutine_threadsafe(getattr(self.fs, "_" + method)(*args, **kw), self.fs.loop)
            try:
                return fut.result(deadline)
            except FutureTimeout:
                if fut.done():  # the request's own timeout (asyncio's TimeoutError is this one)
                    raise
                fut.cancel()  # the task is cancelled on the loop: its connection is closed, not left waiting
                raise _Stalled(deadline) from None
        box: dict = {}

        def run() -> None:
            try:
                box["out"] = getattr(self.fs, method)(*args, **kw)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["exc"] = exc

        t = threading.Thread(target=run, daemon=True, name="packfmt-request")
        t.start()
        t.join(deadline)
        if t.is_alive():  # a sync call cannot be cancelled: left to end on its own
            raise _Stalled(deadline)
        if "exc" in box:
            raise box["exc"]
        return box.get("out")

    def _spent(self, path: str, exc: BaseException, why: str, attempts: int, seconds: float) -> StorageError:
        url = self.url(path)
        tried = f"{attempts} attempt{'s' if attempts > 1 else ''} in {seconds:.1f} s"
        known = describe(exc, url, self.so)
        if known is not None:  # e.g. an endpoint that refuses every connection: the usual message, and what was tried
            return StorageError(f"{known} ({tried})", file=url, field=known.field, expected=known.expected,
                                found=known.found)
        return StorageError(f"{url}: gave up after {tried} (last: {why}); the server stalls, drops connections or "
                            f"is overloaded: try again later, or give it more time with {self.policy.settings()}",
                            file=url, field="request", expected=f"an answer within {self.policy.timeout:g} s a "
                            f"request, {self.policy.retries} retries", found=why)
