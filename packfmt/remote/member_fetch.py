"""One member of a streamed collection brought onto the node's disk: its manifest checked against the collection's
record before anything it lists is fetched, then its files and its rows of each layout index requested together
(README "Remote data"; spec/SECURITY.md A16).

Order: the member's ``manifest.json`` is read from the node's copy when one is there, else from the bucket (a
bounded read), at once with the member's rows of each index read shard by shard (``shard_index``: ranged reads the
layout's own record bounds and checks, into memory), and its bytes must hash to the checksum the collection
recorded for the member (C3) before it is parsed: a manifest replaced in the bucket is refused before any file it
lists is requested. Then every file is fetched at once (``Fetcher.file``: verified while it streams, or served
from the cache when its markers are current) with the rows written (checked first), and the manifest is written
last: a member folder whose manifest is there holds every file it lists. A member costs two round trips.
"""

from __future__ import annotations

from pathlib import Path

import xxhash

from .. import format as F
from ..collection.member_checks import changed_member, manifest_checksum
from ..storage.cache import Fetcher
from ..storage.errors import storage_errors
from ..storage.in_flight import together
from ..storage.transport import remote

__all__ = ["member_manifest", "fetch_member"]


def member_manifest(members, m: int, local: Path) -> tuple[bytes, dict, dict]:
    """``(raw, files, rows)``: member ``m``'s manifest bytes (the node's copy at ``local`` when it is the recorded one,
    else the bucket's) checked against the collection's record (C3), its files table, and the member's rows of each
    index read shard by shard that neither this process nor the file holds (requested with the manifest; position in
    ``members.sharded`` -> ``read_rows``'s, not checked yet)."""
    coll, url = members.coll, members.member_url(m)
    recorded = members.digests[m]
    with members.cond:  # read and checked before by a prefetch that then found no room: no second request
        known = members.manifests.pop(m, None)
    if known is not None:
        return known
    try:
        raw = (local / F.MANIFEST).read_bytes()
    except OSError:
        raw = None
    rows = {}
    if raw is None or xxhash.xxh3_64_intdigest(raw) != recorded:
        f = members.fetcher
        missing = [i for i, index in enumerate(members.sharded) if index.rows_missing(m)]

        def get_manifest() -> bytes:
            with storage_errors(url, f.so, f.root):
                fs, rpath = remote(url, f.so)
                return f.manifest(fs, f"{rpath}/{F.MANIFEST}", url)

        raw, *got = together([get_manifest, *(lambda i=i: members.sharded[i].read_rows(m) for i in missing)])
        rows = dict(zip(missing, got))
        if xxhash.xxh3_64_intdigest(raw) != recorded:
            raise changed_member(coll.manifest, m, manifest_checksum(raw), f"{url}/{F.MANIFEST}")
    label = f"{url}/{F.MANIFEST}"
    return raw, F.parse_manifest(F.parse_json(raw, file=label), file=label).files, rows


def fetch_member(members, m: int, local: Path, raw: bytes, files: dict, rows: dict) -> None:
    """Member ``m``'s files (``files``, from its checked manifest ``raw``) at ``local`` and its rows of each index read
    shard by shard (``rows``: those read with the manifest), requested together; then its manifest, last."""
    url, f = members.member_url(m), members.fetcher
    label = f"{url}/{F.MANIFEST}"
    fetcher = Fetcher(f.so, f.root, None, f.mode)  # one per member: its counts and pins are its own
    local.mkdir(parents=True, exist_ok=True)
    with storage_errors(url, f.so, f.root):
        fs, rpath = remote(url, f.so)
        jobs = [lambda name=name, entry=entry: fetcher.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name,
                                                             entry, label)
                for name, entry in files.items()]
        jobs += [lambda i=i, index=index: index.ensure_shard(m, rows.get(i)) for i, index in enumerate(members.sharded)]
        together(jobs)  # the first failure, once every request in flight ended
        fetcher.write_atomic(local / F.MANIFEST, raw)
