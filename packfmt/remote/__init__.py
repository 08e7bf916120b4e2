"""A dataset at a URL: fetched whole, or a collection read member by member (README "Remote data").

The one room that knows both the dataset format and object storage (``packfmt.storage`` knows bytes only).

* ``mirror``: a dataset at a URL mirrored whole into the cache (``fetch_dataset``); a mirror re-opened locally
  checked again (``check_mirror``).
* ``pack_mirror``: a remote dataset's pack indexes, listed and mirrored one by one.
* ``merge``: a collection written where a source or the destination is a URL.
* ``streamed``: a remote collection opened with ``stream=True`` (``open_streamed``, ``StreamedCollection``).
* ``members``: its members fetched, checked and mapped as reads need them (``StreamedMembers``).
* ``eviction``: which resident member leaves to make room (Belady from the plan, else least recently used).
* ``shard_index``: a layout's pack index, its rows fetched a shard at a time (``ShardedIndex``).
* ``plan``: the sampler's order as the members' next uses, and the threads that fetch ahead (``Plan``).
"""

from __future__ import annotations

from .mirror import check_mirror, fetch_dataset

__all__ = ["fetch_dataset", "check_mirror", "open_streamed", "StreamedCollection"]


def __getattr__(name: str):
    """``open_streamed`` and ``StreamedCollection`` on first use: every local open imports this package
    (``check_mirror``), and the streamed reader's modules cost it 0.05 s of CPU."""
    if name in ("open_streamed", "StreamedCollection"):
        from . import streamed

        return getattr(streamed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
