"""A remote collection WITH IMAGES read member by member (``stream=True``) through a real S3-protocol server (moto on
127.0.0.1): image-text members (real PNGs) and text members, the cache bounded below the collection's size; every
item (tokens, labels, decoded images, their spans and ids) equals the same collection read locally, the bound holds
after every batch, and image files are verified as every cached file is."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt.collection import write_collection
from packfmt.packindex import build_pack_index
from packfmt.storage.upload import upload_tree
from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.prefetch import prefetch

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures)
from stream_bounds import disk_use, ledger

IMG, BATCH = 999, 4
IMAGE_MEMBERS, TEXT_MEMBERS = 8, 4


def _png(rng) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _member(path: Path, rng, images: bool) -> Path:
    """Sixteen documents (a batch of 4 packs touches at most two members); in an image-text member most carry one or
    two 8x6 PNGs on runs of the image token."""
    with packfmt.DatasetWriter(path, vocab_size=1000, loss_mask=True, tokenizer={"name": "t", "hash": None},
                               special_tokens={"image": IMG}) as w:
        for _ in range(16):
            n = int(rng.integers(12, 40))
            doc, recs = rng.integers(0, IMG, n), []
            for b in ([] if not images else sorted(rng.choice([1, 7], int(rng.integers(0, 3)), replace=False))):
                doc[b:b + 4] = IMG
                recs.append(packfmt.ImageRecord(_png(rng), 8, 6, "png", int(b), int(b) + 4))
            w.add_document(doc, rng.integers(0, 2, n), images=recs)
    return path


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """(local collection, its URL, bytes of its member files): greedy packs (data order), capacity 64."""
    root = tmp_path_factory.mktemp("stream_images")
    rng = np.random.default_rng(1)
    kinds = [True] * IMAGE_MEMBERS + [False] * TEXT_MEMBERS
    rng.shuffle(kinds)
    paths = [_member(root / "coll" / "members" / f"m{m:02d}", rng, images) for m, images in enumerate(kinds)]
    coll = write_collection(root / "coll" / "c", [(None, p) for p in paths])
    assert coll.num_images > 0 and sum(1 for m in coll.members if m.images) == IMAGE_MEMBERS
    build_pack_index(coll, capacity=64, algorithm="greedy", name="p")
    url = f"s3://{BUCKET}/stream_images"
    upload_tree(root / "coll", url)
    total = sum(f.stat().st_size for p in paths for f in p.iterdir() if f.is_file() and f.name != "manifest.json")
    probe = PackedDataset(f"{url}/c", "p", stream=True, cache_dir=root / "probe")  # every member, counted
    probe.__getitems__(list(range(len(probe))))
    b = ledger(probe)
    with b.transaction() as tx:
        fixed = tx.fixed
    return root / "coll" / "c", f"{url}/c", total, (fixed, b.nbytes.copy())


def _limit(sizes, members: int) -> int:
    """A cache_limit of the collection's fixed files and room for ``members`` of its largest members."""
    fixed, each = sizes
    return fixed + members * int(each.max())


def _log(cache_root: Path) -> list[dict]:
    return [json.loads(line) for line in (cache_root / "downloads.log").read_text().splitlines()]


def _same_item(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids", "image_spans",
                "image_ids", "pack_id"):
        assert torch.equal(a[key], b[key]), key
    assert len(a["images"]) == len(b["images"])
    for x, y in zip(a["images"], b["images"]):
        assert torch.equal(x, y)


def test_streamed_images_exact_bounded_and_lazy(remote, cache):
    local, url, total, sizes = remote
    limit = _limit(sizes, 4)
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    assert len(ds) == len(reference) and ds.store.num_images == reference.store.num_images
    assert not list(cache.rglob("image_blobs.bin")) and not list(cache.rglob("tokens.bin"))  # opening fetched no member
    order = DistributedPackSampler(ds, num_replicas=1, rank=0, shuffle=False).epoch_indices()
    prefetch(ds, order)
    images = 0
    for j in range(0, len(order), BATCH):
        packs = order[j:j + BATCH]
        for a, b in zip(ds.__getitems__(packs), reference.__getitems__(packs), strict=True):
            _same_item(a, b)
            images += len(a["images"])
        assert disk_use(cache) <= limit  # the bound holds after every batch, image files counted
    assert images == reference.store.num_images  # every image read once (greedy packs never cut one)
    log = [e for e in _log(cache) if "/members/" in e["url"]]
    assert any(e["url"].endswith("image_blobs.bin") for e in log)
    assert sum(e["bytes"] for e in log) <= 1.2 * total  # packs in data order: each member fetched about once
    p = int(order[-1])
    with pytest.warns(UserWarning, match="not the planned order's next"):  # the plan is done: on demand
        _same_item(ds[p], reference[p])  # single items read their images while the member is held too
    with pytest.raises(ValueError, match="balance='tokens'"):
        DistributedPackSampler(ds, num_replicas=1, rank=0, balance="images")  # would fetch every member: refused


@pytest.mark.parametrize("workers", [0, 2])
def test_streamed_images_through_a_dataloader(remote, cache, workers):
    local, url, total, sizes = remote
    limit = _limit(sizes, 6)  # the main process and two workers: two members each (a batch touches at most two)
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    order = np.arange(len(ds))
    prefetch(ds, order, batch_size=BATCH)
    got = DataLoader(ds, batch_size=BATCH, sampler=order.tolist(), num_workers=workers, collate_fn=collate_varlen)
    want = DataLoader(reference, batch_size=BATCH, sampler=order.tolist(), collate_fn=collate_varlen)
    n = images = 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and ("pixel_values" in a) == bool(len(a["images"]))  # every image 8x6: stacked
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "image_spans", "image_ids", "pixel_values"):
            assert key not in b or torch.equal(a[key], b[key]), key
        images += len(a["images"])
        assert disk_use(cache) <= limit
        n += 1
    assert n == -(-len(ds) // BATCH) and images == reference.store.num_images


def _image_member(ds) -> int:
    """The last member with images, and the first pack that touches it."""
    return max(m for m, x in enumerate(ds.store.members) if x.images)


def _pack_of(ds, m: int) -> int:
    segs, po = np.asarray(ds.index.segments), np.asarray(ds.index.pack_offsets)
    s = int(np.flatnonzero(ds.store.member_of(segs[:, 0]) == m)[0])
    return int(np.searchsorted(po, s, side="right") - 1)


def test_changed_image_file_is_refetched_and_a_changed_object_refused(remote, cache, s3_server):
    """A flipped byte in a cached image_blobs.bin is seen (its stat changed: hashed again, refetched) when a new
    reader needs the member; one flipped in the bucket is refused when a batch first needs it, nothing of it kept."""
    from packfmt.errors import ChecksumError

    local, url, total, sizes = remote
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True)  # no limit: the member stays in the cache
    m = _image_member(ds)
    p = _pack_of(ds, m)
    _same_item(ds[p], reference[p])
    blobs = next(cache.rglob(f"m{m:02d}/image_blobs.bin"))
    del ds
    gc.collect()  # its pins released
    with open(blobs, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    ds = PackedDataset(url, "p", stream=True, cache_limit=_limit(sizes, 4))
    _same_item(ds[p], reference[p])
    assert [e["why"] for e in _log(cache) if e["url"].endswith(f"m{m:02d}/image_blobs.bin")][-1] == \
        "changed in the cache"
    del ds
    gc.collect()

    key = f"{BUCKET}/stream_images/members/m{m:02d}/image_blobs.bin"
    good = s3_server.cat_file(key)
    s3_server.pipe_file(key, bytes([good[0] ^ 1]) + good[1:])  # same size, one bit flipped
    try:
        for path in cache.rglob(f"m{m:02d}/*.bin"):
            path.unlink()  # as if evicted: the next read fetches it from the bucket
        ds = PackedDataset(url, "p", stream=True, cache_limit=_limit(sizes, 4))
        with pytest.raises(ChecksumError, match=f"m{m:02d}/image_blobs.bin: checksum"):
            ds.__getitems__([p])
        assert not list(cache.rglob(f"m{m:02d}/*.bin"))  # nothing of the refused member stays
    finally:
        s3_server.pipe_file(key, good)
    _same_item(ds.__getitems__([p])[0], reference[p])  # the object restored: read


def test_a_batchs_images_are_read_before_its_members_can_go(remote, cache):
    """A streamed batch's images are decoded while the batch holds its members: a later batch that evicts them
    (the limit holds one member) does not make the first batch's images fetch their member again."""
    local, url, total, (fixed, each) = remote
    reference = PackedDataset(local, "p")
    segs, po = np.asarray(reference.index.segments), np.asarray(reference.index.pack_offsets)
    member = reference.store.member_of(segs[:, 0])
    alone = {}  # image member -> a pack of its documents only
    for p in range(len(reference)):
        ms = np.unique(member[po[p]:po[p + 1]])
        if ms.size == 1 and reference.store.members[int(ms[0])].images and reference[p]["images"]:
            alone.setdefault(int(ms[0]), p)
    (a, p), (b, q) = list(alone.items())[:2]
    ds = PackedDataset(url, "p", stream=True, cache_limit=fixed + max(each[a], each[b]))  # one member at a time
    first = ds.__getitems__([p])
    second = ds.__getitems__([q])  # evicts member a
    assert not list(cache.rglob(f"m{a:02d}/image_blobs.bin"))
    _same_item(first[0], reference[p])
    _same_item(second[0], reference[q])
    assert [e["url"].endswith(f"m{a:02d}/image_blobs.bin") for e in _log(cache)].count(True) == 1
