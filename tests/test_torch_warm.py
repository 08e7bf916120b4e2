"""``packfmt.torch.warm``: the sampler's kernels loaded ahead, in the argument types the sampler then calls them with
(a load of other types would leave the sampler's own to load after the open: no head start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

import packfmt
from packfmt.collection.shards import write_shards
from packfmt.packindex import build_pack_index


def test_the_sampler_finds_its_kernels_loaded(tmp_path):
    with packfmt.DatasetWriter(tmp_path / "src", vocab_size=1000, tokenizer={"name": "t", "hash": None}) as w:
        w.add_documents(np.arange(64 * 48) % 1000, np.full(48, 64))
    build_pack_index(tmp_path / "src", capacity=64, algorithm="ffd", name="p")
    write_shards(tmp_path / "src", "p", tmp_path / "layout", shard_bytes=12 * 128)
    script = textwrap.dedent(f"""
        from packfmt.torch import DistributedPackSampler, PackedDataset, _deal, warm
        kernels = (_deal._runs_of, _deal._by_window_then_key, _deal._deal_rounds_balanced)
        warm._load()
        before = [set(k.signatures) for k in kernels]
        assert all(before), before
        ds = PackedDataset({str(tmp_path / "layout")!r}, "p")
        for nodes in (1, 2):
            s = DistributedPackSampler(ds, 2, 0, window=2, nodes=nodes, balance="tokens")
            s.set_epoch(1)
            assert len(s.epoch_indices())
        after = [set(k.signatures) for k in kernels]
        assert after == before, (before, after)  # nothing new compiled or loaded by the sampler
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
