"""A dataset at a URL: fetched whole, or a collection read member by member (README "Remote data").

The one room that knows both the dataset format and object storage (``packfmt.storage`` knows bytes only).

* ``mirror``: a dataset at a URL mirrored whole into the cache (``fetch_dataset``); a mirror re-opened locally
  checked again (``check_mirror``).
* ``pack_mirror``: a remote dataset's pack indexes, listed and mirrored one by one.
* ``merge``: a collection written where a source or the destination is a URL.
"""

from __future__ import annotations

from .mirror import check_mirror, fetch_dataset

__all__ = ["fetch_dataset", "check_mirror"]
