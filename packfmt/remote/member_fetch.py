"""One member of a streamed collection brought onto the node's disk: its manifest checked against the collection's
record before anything it lists is fetched, then its files and its rows of each layout index requested together
(README "Remote data"; spec/SECURITY.md A16).

Order: the member's ``manifest.json`` is read from the node's copy when one is there, else from the bucket (a
bounded read), and its bytes must hash to the checksum the collection recorded for the member (C3) before it is
parsed: a manifest replaced in the bucket is refused before any file it lists is requested. Then every file and
the member's rows of each index read shard by shard (``shard_index``) are fetched at once (``Fetcher.file``:
verified while they stream, or served from the cache when their markers are current), and the manifest is written
last: a member folder whose manifest is there holds every file it lists.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from .. import format as F
from ..collection.member_checks import changed_member, manifest_checksum
from ..storage.cache import Fetcher
from ..storage.errors import storage_errors
from ..storage.transport import remote

__all__ = ["member_manifest", "fetch_member"]

#: Requests of one member in flight at once (its files and its index rows): a member of a few files is one round trip.
FILES_IN_FLIGHT = 8


def member_manifest(members, m: int, local: Path) -> tuple[bytes, dict]:
    """``(raw, files)``: member ``m``'s manifest bytes (the node's copy at ``local`` when it is the recorded one, else
    the bucket's) checked against the collection's record (C3), and its files table."""
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
    if raw is None or xxhash.xxh3_64_intdigest(raw) != recorded:
        f = members.fetcher
        with storage_errors(url, f.so, f.root):
            fs, rpath = remote(url, f.so)
            raw = f.manifest(fs, f"{rpath}/{F.MANIFEST}", url)
        if xxhash.xxh3_64_intdigest(raw) != recorded:
            raise changed_member(coll.manifest, m, manifest_checksum(raw), f"{url}/{F.MANIFEST}")
    label = f"{url}/{F.MANIFEST}"
    return raw, F.parse_manifest(F.parse_json(raw, file=label), file=label).files


def fetch_member(members, m: int, local: Path, raw: bytes, files: dict) -> None:
    """Member ``m``'s files (``files``, from its checked manifest ``raw``) at ``local`` and its rows of each index read
    shard by shard, requested together; then its manifest, last."""
    url, f = members.member_url(m), members.fetcher
    label = f"{url}/{F.MANIFEST}"
    fetcher = Fetcher(f.so, f.root, None, f.mode)  # one per member: its counts and pins are its own
    local.mkdir(parents=True, exist_ok=True)
    with storage_errors(url, f.so, f.root):
        fs, rpath = remote(url, f.so)
        jobs = [lambda name=name, entry=entry: fetcher.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name,
                                                             entry, label)
                for name, entry in files.items()]
        jobs += [lambda index=index: index.ensure_shard(m) for index in members.sharded]
        if len(jobs) == 1:
            jobs[0]()
        else:
            with ThreadPoolExecutor(min(len(jobs), FILES_IN_FLIGHT), thread_name_prefix="packfmt-member") as pool:
                for done in [pool.submit(job) for job in jobs]:
                    done.result()  # the first failure, once every request in flight ended
        fetcher.write_atomic(local / F.MANIFEST, raw)
