"""A remote collection opened with ``stream=True`` (README "Remote data"; spec/SECURITY.md A16).

``open_streamed`` fetches the collection's manifest and member table, checks that every member path stays inside
the collection's bucket (spec/SECURITY.md A17: all at once, before the manifest reaches the mirror, so nothing
resolves a member path on the local disk unchecked), lists its pack indexes, and returns a ``StreamedCollection``:
the ``Collection`` over the mirror whose members (its ``members.StreamedMembers``, made by its constructor), pack
indexes and ``doc_lengths.bin`` are fetched, verified, only when something first reads them.
"""

from __future__ import annotations

import numpy as np

from .. import format as F
from ..collection.lengths import LENGTHS_FILE
from ..collection.manifest import is_collection
from ..collection.reader import Collection
from ..storage import uri
from ..storage.cache import Fetcher, Origin, Pin, parse_limit
from ..storage.errors import storage_errors
from ..storage.in_flight import together
from ..storage.transport import remote
from .members import StreamedMembers
from .mirror import mirror_collection_manifest
from .pack_mirror import drop_gone, remote_pack_manifests
from .shard_index import ShardedIndex, sharded

__all__ = ["open_streamed", "StreamedCollection"]


def open_streamed(url: str, storage_options=None, cache_dir=None, cache_limit=None, verify=None):
    """The collection at ``url`` with lazy members (see the module doc); None when ``url`` holds a store."""
    url = url.rstrip("/")
    f = Fetcher(storage_options, cache_dir, None, verify)  # no LRU pass: this object evicts its own members
    try:
        with storage_errors(url, storage_options, f.root):
            fs, rpath = remote(url, storage_options)
            local = f.mirror(url)
            raw, obj = f.manifest_json(fs, f"{rpath}/{F.MANIFEST}", url)
            if not is_collection(obj):  # a store: the door fetches it whole (opening.open_url)
                return None
            f.result.pins.append(Pin(f.root, local))
            # its own files (a member table) mirrored; not doc_lengths.bin (8 bytes a document: 8 GB at 10^9), which
            # a streamed read never reads (StreamedCollection.doc_lengths fetches it if something asks)
            # and the pack indexes listed (each mirrored when pack_index first opens it): at once, two round trips
            cm, packs = together([lambda: mirror_collection_manifest(f, fs, rpath, url, local, obj,
                                                                     leave=(LENGTHS_FILE,)),
                                  lambda: remote_pack_manifests(fs, rpath)])
            uri.check_member_paths(url, cm.members.paths, file=f"{url}/{F.MANIFEST}",
                                   name_of=lambda i: cm.members[i].name)
            drop_gone(f.root, local, set(packs))
            f.write_atomic(local / F.MANIFEST, raw)
    except BaseException:
        for pin in f.result.pins:
            pin.close()
        raise
    return StreamedCollection(local, Origin(url, storage_options, f.root, f.result.pins), f, parse_limit(cache_limit),
                              packs)


class StreamedCollection(Collection):
    """A ``Collection`` whose members are fetched as reads need them (``resident_members()``)."""

    streamed = True

    def __init__(self, path, origin: Origin, fetcher: Fetcher, limit: int | None, packs: dict[str, bytes]) -> None:
        """The collection mirrored at ``path`` from ``origin``; ``fetcher`` fetches its members (at most ``limit``
        bytes of them at once) and the pack indexes ``packs`` (name -> ``index.json`` bytes in the bucket) when
        first read."""
        super().__init__(path, origin=origin)
        self._members = StreamedMembers(self, origin.url, fetcher, limit, packs)

    def cache_limit_for(self, members: int) -> int:
        """A ``cache_limit`` that holds this collection's own files as now on this node's disk and ``members`` of its
        largest members (by what the record says they take: ``node_cache.NodeCache.estimate``; image files not
        counted): what a reader of ``members`` members at a time needs at least."""
        node = self._members.node
        with node.budget.transaction() as tx:
            fixed = tx.fixed
        sizes = sorted((node.estimate(m) for m in range(len(self.members))), reverse=True)
        return fixed + sum(sizes[:members])

    def resident_members(self) -> StreamedMembers:
        """Its members: fetched, checked and mapped as batches need them, kept within ``cache_limit``."""
        return self._members

    @property
    def doc_offsets(self) -> np.ndarray:
        """int64 ``(num_documents + 1,)`` BOUNDS for opening a pack index (V27) without fetching every member: each
        document counts as long as its whole member. The reader checks each segment against the real length when its
        member arrives (``StreamedMembers.hold``), before any token of it is read."""
        m = self.members
        per_doc = np.repeat(m.tokens, m.documents)  # the columns: no Member object per member (10^5 members)
        out = np.zeros(self.num_documents + 1, dtype=np.int64)
        np.cumsum(per_doc, out=out[1:])
        return out

    @property
    def doc_lengths(self) -> np.ndarray:
        """``Collection.doc_lengths``, with ``doc_lengths.bin`` fetched and verified first (the open leaves it in the
        bucket: a streamed read bounds segments by member and checks each member's own lengths when it arrives, so
        only ``inspect``-like uses of every length need it)."""
        if self._lengths is None:
            self._members.fetch_own(LENGTHS_FILE)
        return Collection.doc_lengths.fget(self)

    def segment_bounds(self) -> tuple[np.ndarray, bool, np.ndarray]:
        """One bound per member, its tokens (each document at most as long as its member), not the real lengths
        (members not fetched), and nothing of 8 bytes a document (10^9 documents: 16 GB of ``doc_offsets``
        above, in every process that opens the index)."""
        return np.asarray(self.members.tokens, dtype=np.int64), False, np.asarray(self.doc_start, dtype=np.int64)

    def pack_index_names(self) -> list[str]:
        """The pack indexes in the bucket (listed at open; none fetched yet but those opened)."""
        return sorted(self._members.packs)

    def pack_index(self, name: str | None = None):
        """Open pack index ``name`` (default: the only one), its files fetched and verified first if this process has
        not yet: only the index trained from is fetched before the first batch, not every index of the collection."""
        from ..index import open_pack_index

        names = self.pack_index_names()
        want = name if name is not None else (names[0] if len(names) == 1 else None)
        packs = self._members.packs
        if want in packs and sharded(self, want, packs[want]):
            index = ShardedIndex(self, self._members, want, packs[want])  # a layout's: its rows a shard at a time
            self._members.node.update_fixed()
            return index
        if want in packs:
            self._members.mirror_pack(want)
        return open_pack_index(self, name, names=names)

    def __getstate__(self) -> dict:
        raise TypeError(f"{self.path}: a streamed collection is not pickled; PackedDataset(url, stream=True) "
                        "re-opens it in each DataLoader worker")
