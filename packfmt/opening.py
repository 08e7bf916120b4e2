"""The one door: a path or URL becomes a dataset (``packfmt.open``).

It decides what ``path`` is (a local store, a local collection, or a URL mirrored through
``packfmt.storage``) and returns a ``Store`` or a ``Collection``, both read through the same
``Dataset`` interface. Storage only ever returns local paths and pins; opening them happens here.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import format as F
from .collection.manifest import is_collection
from .collection.reader import Collection
from .dataset import Dataset
from .reader import Store

__all__ = ["open_dataset", "open_url", "as_dataset", "whole_dataset"]


def open_dataset(path: str | os.PathLike, *, storage_options: dict | None = None, cache_dir=None, cache_limit=None,
                 cache_verify: str | None = None, stream: bool = False):
    """Open a packfmt store (a ``Store``) or collection (a ``Collection``): manifest, sizes and offsets checked.

    ``path`` may be a URL (``s3://``, ``gs://``, ``file://`` ...; ``packfmt.storage``): its files are
    fetched whole into the node-local cache (``cache_dir=``, else ``$PACKFMT_CACHE``; at most
    ``cache_limit`` bytes), verified against the manifest's sizes and checksums, and mapped from there.
    ``storage_options`` go to fsspec (credentials, ``endpoint_url`` ...). A cached file is hashed again when its
    stat changed since it was verified; ``cache_verify="full"`` (or ``$PACKFMT_CACHE_VERIFY=full``) on every open.
    ``stream=True`` (a remote collection): fetch its manifest and pack indexes only, and each member when a read
    first needs it, at most ``cache_limit`` bytes of members at once (``packfmt.remote``).
    """
    from .storage import is_remote, local_file

    if is_remote(path) and stream:
        from .remote.streamed import open_streamed

        streamed = open_streamed(path, storage_options, cache_dir, cache_limit, cache_verify)
        if streamed is not None:
            return streamed  # else a store: fetched whole, as without stream
    if is_remote(path):
        return open_url(path, storage_options, cache_dir, cache_limit, cache_verify)
    return _open_local(local_file(path), cache_verify)


def _open_local(path, cache_verify: str | None, origin=None):
    """The store or collection at local ``path`` (a mirror in the remote cache: its changed files hashed again first,
    ``remote.check_mirror``); ``origin``: where it was fetched from (``storage.cache.Origin``), for a URL's mirror."""
    from .remote.mirror import check_mirror

    path = Path(path)
    check_mirror(path, cache_verify)
    if (path / F.MANIFEST).is_file() and is_collection(F.read_json(path / F.MANIFEST, file=F.MANIFEST)):
        return Collection(path, origin=origin)
    return Store(path, origin=origin)


def open_url(url, storage_options=None, cache_dir=None, cache_limit=None, verify=None):
    """``packfmt.open`` of a URL: mirror it into the cache, open the mirror, keep it pinned while the object lives.

    ``verify``: ``"stat"`` (default) or ``"full"`` (hash every cached file on every open); ``$PACKFMT_CACHE_VERIFY``.
    """
    from .remote.mirror import fetch_dataset
    from .storage.cache import Origin
    from .storage.verify import FETCHED

    fetched = fetch_dataset(url, storage_options, cache_dir, cache_limit, verify)
    origin = Origin(url.rstrip("/"), storage_options, fetched.root, fetched.pins)
    return _open_local(fetched.path, FETCHED, origin)  # its files were just checked as `verify` says


def as_dataset(dataset, *, storage_options: dict | None = None, **open_options) -> Dataset:
    """``dataset`` itself when it is already open (a ``Store`` or a ``Collection``), else ``open_dataset`` of it
    (``open_options``: ``cache_dir``, ``cache_limit``, ``cache_verify``, ``stream``)."""
    return dataset if isinstance(dataset, Dataset) else open_dataset(dataset, storage_options=storage_options,
                                                                    **open_options)


def whole_dataset(dataset, what: str, instead: str, *, storage_options: dict | None = None) -> Dataset:
    """``as_dataset(dataset)`` for a command that reads every member (an export, shards): a collection opened with
    ``stream=True`` fetches members one batch at a time (``remote.members``), so it is refused with a
    ``WriteError`` that says ``what`` could not be done and the way that works, ``instead`` (its URL, fetched
    whole first)."""
    from .errors import WriteError

    ds = as_dataset(dataset, storage_options=storage_options)
    if ds.streamed:
        raise WriteError(f"{ds.url}: a collection opened with stream=True cannot be {what}: its members are fetched "
                         f"one batch at a time, and this reads every member; pass the URL instead ({instead}), which "
                         "fetches it whole first", field="dataset", expected="a store, or a collection opened without "
                         "stream=True", found="a streamed collection")
    return ds
