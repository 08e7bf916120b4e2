"""End to end, the streaming read of issue 18: a collection packed by ONE global index (ffd over all its
members, so a pack mixes documents of several members), ``packfmt pack --shards s3://...`` rewriting those
packs in pack order as member shards, then the shards read through a real S3-protocol server (moto on
127.0.0.1) with ``stream=True`` (cache bounded to the fixed files and 10% of the shards), ``DistributedPackSampler(
window=2, nodes=2)`` and ``prefetch``, by a DataLoader with 0 and 2 workers, as 2 ranks read separately (each its own
cache: two nodes).

Asserted for every rank: every batch equals the SOURCE collection's packs read locally (``input_ids``,
``labels``, ``position_ids``; images too for the image-text case), the cache bound (the whole cache folder, as
``du`` counts it) holds after every batch; over the ranks, every pack is read exactly once (plus the deal's
padding), and the shards are fetched about once over both nodes (each node reads its own part of the deal).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.prefetch import prefetch

from limits import time_limit as limit
from s3_server import BUCKET, s3_server, time_limit  # noqa: F401  (fixtures)
from stream_bounds import disk_use, limit_for
from test_storage_stream_images import _member as image_member

MEMBERS, BATCH, RANKS = 200, 4, 2


def _shard_bytes(coll) -> int:
    """Bytes of the shards' member files and of their rows of the layout's index (what ``cache_limit`` bounds: a
    shard's rows count with it), manifests left out."""
    return sum(_shard_bytes_of(coll, m) for m in range(len(coll.members)))


def _shards(src: Path, url: str, shard_size: str, cache_root: Path) -> packfmt.Collection:
    """``packfmt pack SRC --capacity 64 --name g --shards URL``: the global ffd index, its packs as shards (written
    where ``cache_root`` mirrors URL, then uploaded); returns them opened there."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACKFMT_CACHE", str(cache_root))
        assert main(["pack", str(src), "--capacity", "64", "--name", "g", "--algorithm", "ffd", "--shards", url,
                     "--shard-size", shard_size]) == 0
    return packfmt.open(url, cache_dir=cache_root)


@pytest.fixture(scope="module")
def text(s3_server, tmp_path_factory):  # noqa: F811
    """(source collection, shards URL, shard bytes)."""
    root = tmp_path_factory.mktemp("e2e")
    rng = np.random.default_rng(7)
    paths = []
    for m in range(MEMBERS):
        paths.append(root / "members" / f"m{m:03d}")
        with packfmt.DatasetWriter(paths[-1], vocab_size=1000, loss_mask=True,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in rng.integers(1, 40, 12):
                w.add_document(rng.integers(0, 1000, int(n)), rng.integers(0, 2, int(n)))
    src = write_collection(root / "src", [(None, p) for p in paths])
    url = f"s3://{BUCKET}/e2e/shards"
    with limit(240, "packing 200 members and uploading their shards"):
        out = _shards(src.path, url, "1400", root / "writer-cache")
    return src, url, _shard_bytes(out), out


def _fetched(cache_root: Path, url: str) -> int:
    """Shard bytes a reader's cache downloaded (its ``downloads.log``; pack index files left out)."""
    log = (cache_root / "downloads.log").read_text().splitlines()
    return sum(e["bytes"] for e in map(json.loads, log) if e["url"].startswith(f"{url}/shards/"))


def _same(a: dict, b: dict, images: bool) -> None:
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "pack_ids"):
        assert torch.equal(a[key], b[key]), key
    if images:
        assert len(a["images"]) == len(b["images"])
        for x, y in zip(a["images"], b["images"], strict=True):
            assert torch.equal(x, y)
        for key in ("image_spans", "pixel_values"):
            assert (key in a) == (key in b) and (key not in a or torch.equal(a[key], b[key])), key


def _rank_epoch(src, url, cache_root: Path, limit: int, rank: int, workers: int, images: bool = False):
    """One rank's epoch streamed from the shards, batch by batch against the source read locally: (packs read,
    member bytes fetched)."""
    reference = PackedDataset(src.path, "g")
    ds = PackedDataset(url, "g", stream=True, cache_limit=limit, cache_dir=cache_root)
    assert len(ds) == len(reference)
    sampler = DistributedPackSampler(ds, num_replicas=RANKS, rank=rank, shuffle=True, seed=5, window=2, nodes=RANKS)
    sampler.set_epoch(1)
    order = sampler.epoch_indices()
    prefetch(ds, order, batch_size=BATCH)
    got = DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen, num_workers=workers)
    want = DataLoader(reference, batch_size=BATCH, sampler=order.tolist(), collate_fn=collate_varlen)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the reads follow the plan (a dropped plan warns)
        for a, b in zip(got, want, strict=True):
            _same(a, b, images)
            seen += a["pack_ids"].tolist()
            assert disk_use(cache_root) <= limit  # the bound holds after every batch
    assert seen == order.tolist()
    return seen, _fetched(cache_root, url)


def _global_pack_mix(src) -> float:
    """The fraction of the global index's packs whose segments come from more than one source member."""
    idx = src.pack_index("g")
    segs, po = np.asarray(idx.segments), np.asarray(idx.pack_offsets)
    member = src.member_of(segs[:, 0])
    change = np.concatenate([[False], member[1:] != member[:-1]])
    return float(np.mean(np.add.reduceat(change.astype(np.int64), po[:-1])
                         - change[po[:-1]].astype(np.int64) > 0))


@pytest.mark.parametrize("workers", [0, 2])
def test_global_index_shards_streamed_with_window(text, tmp_path, workers):
    src, url, total, out = text
    assert _global_pack_mix(src) > 0.3  # the realistic case: packs mix members (ffd over the whole collection)
    assert 80 <= len(out.members) <= 130, len(out.members)
    with pytest.raises(packfmt.PackfmtError, match="write pack-ordered shards"):  # why shards: the source's own index
        DistributedPackSampler(PackedDataset(src.path, "g"), num_replicas=RANKS, rank=0, window=2)  # mixes members
    cap = limit_for(url, "g", len(out.members) // 10, tmp_path / "probe")
    with limit(300, "two ranks streaming ~100 shards each"):
        per_rank = [_rank_epoch(src, url, tmp_path / f"rank{r}", cap, r, workers) for r in range(RANKS)]
    n = len(PackedDataset(src.path, "g"))
    counts = Counter(p for seen, _ in per_rank for p in seen)
    deal = DistributedPackSampler(PackedDataset(url, "g", stream=True, cache_dir=tmp_path / "order"),
                                  num_replicas=RANKS, rank=0, shuffle=True, seed=5, window=2, nodes=RANKS)
    deal.set_epoch(1)  # the deal (opening fetches no shard)
    assert counts == Counter(deal.assignment().ravel().tolist())
    assert set(counts) == set(range(n)) and sum(counts.values()) == n + (-n) % RANKS  # each pack once, + padding
    fetched = sum(f for _, f in per_rank)
    assert fetched <= 1.1 * total, (fetched, total)  # each shard fetched about once over both nodes


def test_image_text_global_index_shards_streamed_with_window(s3_server, tmp_path):  # noqa: F811
    """Image-text members (real PNGs) and text members, one ffd index over all, as shards, streamed with window=2:
    images equal the source's too."""
    rng = np.random.default_rng(3)
    kinds = [True] * 12 + [False] * 6
    rng.shuffle(kinds)
    paths = [image_member(tmp_path / "members" / f"m{m:02d}", rng, images) for m, images in enumerate(kinds)]
    src = write_collection(tmp_path / "src", [(None, p) for p in paths])
    url = f"s3://{BUCKET}/e2e/image-shards"
    with limit(120, "image shards written, uploaded and streamed"):
        out = _shards(src.path, url, "3KiB", tmp_path / "writer-cache")
        assert len(out.members) >= 8 and sum(1 for m in out.members if m.images) >= 4
        cap = limit_for(url, "g", max(len(out.members) // 3, 4), tmp_path / "probe")
        for r in range(RANKS):
            _rank_epoch(src, url, tmp_path / f"rank{r}", cap, r, 0, images=True)


def _shard_bytes_of(coll, m: int) -> int:
    """Member ``m``'s files, manifest left out, and its rows of the layout's index (``pack_offsets.bin`` and
    ``segments.bin``: ``ShardedIndex.rows_bytes``)."""
    packs = coll.manifest.raw["layout"]["member_packs"][m]
    return (sum(f.stat().st_size for f in Path(coll.member_path(m)).iterdir() if f.is_file() and f.name != "manifest.json")
            + 8 * (packs + 1) + 24 * int(coll.members[m].documents))
