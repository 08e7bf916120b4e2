"""A member whose fetch fails takes its index rows' readiness with it (``remote.members``, ``remote.shard_index``).

Fetching member ``k`` of a layout readies shard ``k``'s rows in this process (checked, in the sparse files); a fetch
that then failed (a file refused, a request that gave up) deleted the member and punched its rows out of the files,
but left the rows marked ready here. The next fetch of the member, which succeeded, did not check them again: its
packs read as zeros, empty packs with no error (test_storage_nodes_proof.py saw whole shards' packs missing from
batches; a prefetch thread's failed fetch is silent, so the batch that came next was the first sign).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packfmt.errors import FormatError
from packfmt.remote import members as M
from packfmt.torch import PackedDataset, collate_varlen

from test_storage_batch_room import layout  # noqa: F401  (fixture)


def test_a_member_fetched_again_after_a_failed_fetch_reads_its_own_rows(layout, tmp_path, monkeypatch):  # noqa: F811
    out, url = layout
    ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30, cache_dir=tmp_path / "node")
    packs = np.flatnonzero(ds.pack_groups() == 1)[:3].tolist()  # packs of shard 1
    real, calls = M.Store, []

    def refused_once(path):
        calls.append(path)
        if len(calls) == 1:  # after its files and rows were fetched: what a bad file or a lost file would raise
            raise FormatError("injected: refused once")
        return real(path)

    monkeypatch.setattr(M, "Store", refused_once)
    with pytest.raises(FormatError, match="refused once"):
        ds.__getitems__(packs)
    rows = np.fromfile(ds.index.path / "pack_offsets.bin", dtype=np.int64)
    if rows[packs[-1] + 1] != 0:
        pytest.skip("this file system cannot punch holes: the failed member's rows stayed in the file")
    got = collate_varlen(ds.__getitems__(packs))
    want = collate_varlen(PackedDataset(str(out.path), "p").__getitems__(packs))
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "pack_ids"):
        assert torch.equal(got[key], want[key]), key
