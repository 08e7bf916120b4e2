"""Object-storage and cache mistakes as one-line errors that name the URL (or cache folder) and the fix.

fsspec back ends raise their own exceptions (botocore's ``NoCredentialsError``,
``EndpointConnectionError`` ...); they are recognised by class name so that nothing here imports a
back end. An ``OSError`` about the cache itself (a folder that cannot be created or written, a full
disk) names the cache folder and the ways to move or bound it.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import PackfmtError
from .uri import bucket_of, endpoint

__all__ = ["StorageError", "storage_errors", "describe", "missing_bucket", "require_bucket", "eviction_error",
           "evicting"]

#: errnos of a cache folder that cannot hold the files (not of the network).
_CACHE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EFBIG}
_CACHE_FIX = ("set $PACKFMT_CACHE (or pass cache_dir=) to a writable folder with room for the dataset, "
              "or bound it with cache_limit= / $PACKFMT_CACHE_LIMIT")


class StorageError(PackfmtError):
    """Object storage could not be reached or read (credentials, endpoint, bucket), or the cache cannot be written."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def missing_bucket(url: str, storage_options: dict | None = None) -> StorageError:
    ep = endpoint(storage_options) or "the default endpoint"
    return StorageError(f"{url}: the bucket {bucket_of(url)!r} does not exist on {ep}; check the URL (and AWS_ENDPOINT_URL "
                        "/ storage_options={'endpoint_url': ...}), or create the bucket", file=url, field="bucket",
                        expected="an existing bucket", found="missing")


def require_bucket(fs, url: str, storage_options: dict | None = None) -> None:
    """Raise ``missing_bucket`` when the bucket of ``url`` (an object store URL) is not there."""
    if url.startswith(("s3://", "s3a://", "gs://", "gcs://")) and not fs.exists(bucket_of(url)):
        raise missing_bucket(url, storage_options)


def _is_cache_error(exc: BaseException, cache: Path | None) -> bool:
    if cache is None or not isinstance(exc, OSError) or exc.errno not in _CACHE_ERRNOS:
        return False
    if exc.filename is None:  # a write to an open file (ENOSPC), or mkdir's own failure
        return True
    name, cache = os.path.abspath(exc.filename), os.path.abspath(cache)
    return os.path.commonpath([name, cache]) == cache


def describe(exc: BaseException, url: str, storage_options: dict | None = None, cache: Path | None = None):
    """The ``StorageError`` that ``exc`` (raised while reading or writing ``url``) means, or None if it is not ours."""
    names = {c.__name__ for c in type(exc).__mro__}
    if _is_cache_error(exc, cache):
        what = "full" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "not writable"
        return StorageError(f"{url}: the cache folder {cache} is {what} ({os.strerror(exc.errno)}"
                            f"{f': {exc.filename}' if exc.filename else ''}); {_CACHE_FIX}", file=str(cache),
                            field="cache", expected="a writable folder with room", found=os.strerror(exc.errno))
    if names & {"NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError"}:
        return StorageError(f"{url}: no credentials for object storage ({_first_line(exc)}); set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / ~/.aws/credentials), or pass "
                            "storage_options={'anon': True} for a public bucket", file=url, field="credentials",
                            expected="credentials", found="none")
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionRefusedError",
                "ServerTimeoutError"}:
        ep = endpoint(storage_options) or "the default endpoint"
        return StorageError(f"{url}: cannot connect to {ep} ({_first_line(exc)}); check AWS_ENDPOINT_URL (or "
                            "storage_options={'endpoint_url': ...}) and that the server is up", file=url,
                            field="endpoint", expected="a reachable endpoint", found=ep)
    if isinstance(exc, FileNotFoundError) and "bucket" in str(exc).lower():
        return missing_bucket(url, storage_options)
    if isinstance(exc, PermissionError):
        return StorageError(f"{url}: access denied ({_first_line(exc)}); check that these credentials may read "
                            "(and, to write, put) objects in this bucket", file=url, field="credentials",
                            expected="access", found="denied")
    if "ParamValidationError" in names:
        return StorageError(f"{url}: not a valid object-storage URL ({_first_line(exc)}); expected "
                            "s3://BUCKET/PATH with a valid bucket name", file=url, field="url",
                            expected="s3://BUCKET/PATH", found=url)
    return None


@contextmanager
def storage_errors(url: str, storage_options: dict | None = None, cache: Path | None = None):
    """Turn the back end's and the cache's failures inside the block into one-line ``StorageError``s."""
    try:
        yield
    except PackfmtError:
        raise
    except Exception as exc:
        err = describe(exc, url, storage_options, cache)
        if err is None:
            raise
        raise err from None


def eviction_error(exc: OSError, cache: Path, held: int | None = None, limit: int | None = None) -> StorageError:
    """The ``StorageError`` of an ``OSError`` met while evicting files from the cache folder ``cache`` (a folder turned
    read-only, a file another user owns): it names the folder, the file, what it holds against its limit when known,
    and the ways to move or bound the cache."""
    what = os.strerror(exc.errno) if exc.errno else type(exc).__name__
    where = f": {exc.filename}" if exc.filename else ""
    over = f"; it holds {held:,} bytes, over its limit of {limit:,}" if held is not None and limit is not None else ""
    return StorageError(f"{cache}: cannot evict files from the cache folder ({what}{where}){over}; {_CACHE_FIX}",
                        file=str(cache), field="cache", expected="a writable folder (to evict from)", found=what)


@contextmanager
def evicting(cache: Path):
    """An ``OSError`` inside the block (removing a cached file, taking a lock beside it) as ``eviction_error``."""
    try:
        yield
    except OSError as exc:
        raise eviction_error(exc, cache) from None
