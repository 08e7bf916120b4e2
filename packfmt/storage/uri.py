"""Local path or URL: the one place that tells them apart and turns a URL into an fsspec file system.

A path is a URL when it starts with ``SCHEME://`` (``s3://``, ``gs://``, ``az://``, ``file://`` ...).
``file://`` URLs are plain local paths and need nothing installed; every other scheme is handed to
fsspec, configured the way fsspec and its back ends are (environment such as ``AWS_ENDPOINT_URL``
and ``AWS_ACCESS_KEY_ID``, credential files such as ``~/.aws/credentials``) plus ``storage_options``
(less packfmt's own keys, ``PACKFMT_OPTIONS``: ``transport``'s settings). fsspec is imported here only, and only
when a URL is given; ``filesystem`` is the back end itself, and packfmt's requests go through
``transport.remote`` (its deadlines and retries).

A collection's member paths are resolved here, lexically, before any local path is touched (``member_url``,
``check_member_paths``; spec/SECURITY.md A17).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from pathlib import Path

from ..errors import FormatError, PackfmtError

__all__ = ["is_url", "local_file", "filesystem", "fsspec_options", "PACKFMT_OPTIONS", "bucket_of", "member_url",
           "check_member_paths", "escapes", "endpoint", "root_key", "MissingExtraError"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: The optional extra that installs fsspec and the S3 back end.
EXTRA = "packfmt[s3]"
#: ``storage_options`` keys that are packfmt's (``transport.policy_of``), taken out before fsspec sees the options.
PACKFMT_OPTIONS = ("packfmt_timeout", "packfmt_retries")


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


def fsspec_options(storage_options: dict | None) -> dict:
    """``storage_options`` without packfmt's own keys (``PACKFMT_OPTIONS``): what fsspec is given."""
    return {k: v for k, v in (storage_options or {}).items() if k not in PACKFMT_OPTIONS}


def filesystem(url: str, storage_options: dict | None = None):
    """``(fs, path)`` for ``url``: the fsspec file system and the path inside it (no trailing slash). The back end
    itself: its requests have no packfmt deadline or retry (``transport.remote`` wraps it)."""
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError(f"{url}: reading or writing a URL needs fsspec and its back end; "
                                f"install them with pip install '{EXTRA}'", field="url", expected="fsspec installed",
                                found="not installed") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **fsspec_options(storage_options))
    except ImportError as exc:  # the back end of this scheme (s3fs, gcsfs, adlfs, ...) is missing
        raise MissingExtraError(f"{url}: {exc}; for s3:// install pip install '{EXTRA}'", field="url",
                                expected="the back end of this scheme", found="not installed") from None
    return fs, path.rstrip("/")


def bucket_of(url: str) -> str:
    """``s3://bkt/a/b`` -> ``bkt`` (the first component after the scheme)."""
    return url.partition("://")[2].split("/", 1)[0]


def member_url(url: str, rel: str, *, file: str | None = None, field: str = "path", name: str | None = None) -> str:
    """The URL of a collection member at relative path ``rel`` (may hold ``..``) from the collection at ``url``.

    Refused (``FormatError``) when it resolves outside the collection's bucket: a member path of a
    hostile manifest must not reach another bucket, nor climb out of the cache's mirror of this one
    (spec/SECURITY.md A17). ``name``: the member's, for the message.
    """
    scheme, _, rest = url.partition("://")
    bucket = bucket_of(url)
    joined = posixpath.normpath(posixpath.join(rest.rstrip("/"), rel))
    if not _in_bucket(joined, bucket):
        where = file or f"{url}/manifest.json"
        who = f" (member {name!r})" if name is not None else ""
        raise FormatError(f"{where}: {field}{who}: expected a member inside {scheme}://{bucket}/ (a collection in "
                          f"object storage lists members in its own bucket), found {rel!r} (resolves to "
                          f"{scheme}://{joined}); "
                          "nothing of it was read. Write the collection in the members' bucket with member paths "
                          "relative to it (packfmt merge ... -o s3://BUCKET/...)", file=where, field=field,
                          expected=f"a path inside {scheme}://{bucket}/", found=rel)
    return f"{scheme}://{joined}"


def _in_bucket(joined: str, bucket: str) -> bool:
    return joined == bucket or joined.startswith(bucket + "/")


def escapes(base: str, paths) -> int | None:
    """The index of the first of ``paths`` (a collection's member paths) that, joined to ``base`` (``bucket/path``:
    where the collection lives) and normalised, leaves ``base``'s bucket (its first component); None when none does.

    Lexical (no file system is asked) and once per folder: a path without a ``..`` component stays where it is
    joined, and a path stays inside exactly when its folder does (unless it ends in ``..``), so 10^5 members under
    a few folders cost a few ``normpath`` calls and a string test each."""
    base = base.strip("/")
    bucket = base.split("/", 1)[0]
    seen: dict[str, bool] = {}
    for i, rel in enumerate(paths):
        if rel.startswith("/"):
            return i
        if ".." not in rel:
            continue
        head, _, last = rel.rpartition("/")
        key = rel if last == ".." else head
        inside = seen.get(key)
        if inside is None:
            inside = seen[key] = _in_bucket(posixpath.normpath(posixpath.join(base, key)), bucket)
        if not inside:
            return i
    return None


def check_member_paths(url: str, paths, *, file: str, name_of=None) -> None:
    """Refuse the first member path of the collection at ``url`` that resolves outside its bucket (``member_url``'s
    error, naming the member, ``name_of(i)`` when given, and ``file``), checked for every member at once before
    anything of them is read."""
    i = escapes(url.partition("://")[2], paths)
    if i is not None:
        member_url(url, paths[i], file=file, field=f"members[{i}].path", name=None if name_of is None else name_of(i))


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
