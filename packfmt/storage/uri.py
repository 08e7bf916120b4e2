"""Local path or URL: the one place that tells them apart and turns a URL into an fsspec file system.

A path is a URL when it starts with ``SCHEME://`` (``s3://``, ``gs://``, ``az://``, ``file://`` ...).
``file://`` URLs are plain local paths and need nothing installed; every other scheme is handed to
fsspec, configured the way fsspec and its back ends are (environment such as ``AWS_ENDPOINT_URL``
and ``AWS_ACCESS_KEY_ID``, credential files such as ``~/.aws/credentials``) plus ``storage_options``.
fsspec is imported here only, and only when a URL is given.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from pathlib import Path

from ..errors import FormatError, PackfmtError

__all__ = ["is_url", "local_file", "filesystem", "bucket_of", "member_url", "endpoint", "root_key", "MissingExtraError"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: The optional extra that installs fsspec and the S3 back end.
EXTRA = "packfmt[s3]"


class MissingExtraError(PackfmtError):
    """A URL was given but fsspec (or its back end for the scheme) is not installed."""


def is_url(path) -> bool:
    """True for ``SCHEME://...`` strings (``file://`` included)."""
    return isinstance(path, str) and bool(_SCHEME.match(path))


def is_remote(path) -> bool:
    """A URL that is not ``file://`` (one that needs fsspec and the cache)."""
    return is_url(path) and not path.startswith("file://")


def local_file(path):
    """``file:///x/y`` -> ``Path('/x/y')``; anything else unchanged."""
    if is_url(path) and path.startswith("file://"):
        return Path(path[len("file://"):])
    return path


def filesystem(url: str, storage_options: dict | None = None):
    """``(fs, path)`` for ``url``: the fsspec file system and the path inside it (no trailing slash)."""
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError(f"{url}: reading or writing a URL needs fsspec and its back end; "
                                f"install them with pip install '{EXTRA}'", field="url", expected="fsspec installed",
                                found="not installed") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:  # the back end of this scheme (s3fs, gcsfs, adlfs, ...) is missing
        raise MissingExtraError(f"{url}: {exc}; for s3:// install pip install '{EXTRA}'", field="url",
                                expected="the back end of this scheme", found="not installed") from None
    return fs, path.rstrip("/")


def bucket_of(url: str) -> str:
    """``s3://bkt/a/b`` -> ``bkt`` (the first component after the scheme)."""
    return url.partition("://")[2].split("/", 1)[0]


def member_url(url: str, rel: str, *, file: str | None = None, field: str = "path") -> str:
    """The URL of a collection member at relative path ``rel`` (may hold ``..``) from the collection at ``url``.

    Refused (``FormatError``) when it resolves outside the collection's bucket: a member path of a
    hostile manifest must not reach another bucket, nor climb out of the cache's mirror of this one
    (spec/SECURITY.md A17).
    """
    scheme, _, rest = url.partition("://")
    bucket = bucket_of(url)
    joined = posixpath.normpath(posixpath.join(rest.rstrip("/"), rel))
    if joined.split("/", 1)[0] != bucket:
        where = file or f"{url}/manifest.json"
        raise FormatError(f"{where}: {field}: expected a member inside {scheme}://{bucket}/ (a collection in object storage "
                          f"lists members in its own bucket), found {rel!r} (resolves to {scheme}://{joined}); "
                          "write the collection in the members' bucket", file=where, field=field,
                          expected=f"a path inside {scheme}://{bucket}/", found=rel)
    return f"{scheme}://{joined}"


def endpoint(storage_options: dict | None = None) -> str:
    """The endpoint URL fsspec's S3 back end will use ("" for its default)."""
    so = storage_options or {}
    return (so.get("endpoint_url") or (so.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "")


def root_key(url: str, storage_options: dict | None = None) -> str:
    """Cache key of the file system ``url`` lives on: a hash of its scheme and endpoint.

    The bucket and path stay readable below it (``<cache>/<key>/<bucket>/<path>``), so the relative
    member paths of a collection resolve in the cache exactly as they do in the bucket.
    """
    scheme = url.partition("://")[0].lower()
    digest = hashlib.sha256(f"{scheme}://|{endpoint(storage_options)}".encode()).hexdigest()[:16]
    return f"{scheme}-{digest}"
