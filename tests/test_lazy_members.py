"""A local collection with more members than one process may map at once (packfmt/collection/lazy_members.py):
read through PackedDataset exactly as when every member is mapped, in any order and in DataLoader workers, with
at most ``max_mapped`` members mapped at once (counted in /proc/self/maps), and each member opened and checked
only when a batch first touches it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt.collection import lazy_members as L
from packfmt.collection import Collection, write_collection
from packfmt.errors import FormatError
from packfmt.torch import PackedDataset, collate_varlen
from packfmt.torch.testing import next_fit_segments, write_pack_index

MEMBERS, BUDGET = 60, 30  # 60 members x 3 mappings > 30: mapped as batches need them, at most 10 at once
OPEN = 4  # member stores a collection keeps open (each maps its own files)
KEYS = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids")


def _collection(root: Path) -> Path:
    rng = np.random.default_rng(0)
    paths = []
    for m in range(MEMBERS):
        with packfmt.DatasetWriter(root / "members" / f"m{m:03d}", vocab_size=1000, loss_mask=True,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in rng.integers(1, 40, 5):
                w.add_document(rng.integers(0, 1000, int(n)), rng.integers(0, 2, int(n)))
        paths.append(root / "members" / f"m{m:03d}")
    coll = write_collection(root / "c", [(None, p) for p in paths])
    segs, po = next_fit_segments(coll.doc_lengths, 48)  # packs across member boundaries
    write_pack_index(coll, segs, po, capacity=48, name="p")
    return coll.path


@pytest.fixture(scope="module")
def coll(tmp_path_factory) -> Path:
    return _collection(tmp_path_factory.mktemp("lazy"))


def _member_maps(root: Path) -> int:
    """This process's kernel mappings of files under ``root`` (the members' tokens, masks, offsets)."""
    text = Path("/proc/self/maps").read_text()
    return sum(1 for line in text.splitlines() if str(root.parent) in line and "/members/" in line)


def test_lazily_mapped_members_read_exactly_as_all_mapped(coll, monkeypatch):
    reference = PackedDataset(coll, "p")
    want = {int(x["pack_id"]): x for x in reference.__getitems__(np.arange(len(reference)))}
    assert reference._views()["members"] is None  # 180 mappings fit the default budget: all mapped at once
    del reference
    monkeypatch.setattr(L, "MAP_BUDGET", BUDGET)
    monkeypatch.setattr(L, "MAX_MAPPED", BUDGET // 3)
    ds = PackedDataset(Collection(coll, max_open_members=OPEN), "p")
    members = ds._views()["members"]
    assert isinstance(members, L.LocalMembers) and members.max_mapped == BUDGET // 3
    assert not members.mapped and _member_maps(coll) == 0  # nothing opened or mapped before a batch
    order = np.random.default_rng(1).permutation(len(ds))
    for j in range(0, len(order), 4):
        for got in ds.__getitems__(order[j:j + 4]):
            for key in KEYS:
                assert torch.equal(got[key], want[int(got["pack_id"])][key]), key
        assert len(members.mapped) <= members.max_mapped
        # the kernel's count, not ours: the spans mapped, and the member stores the collection keeps open (checked)
        assert _member_maps(coll) <= 3 * (members.max_mapped + OPEN) < 3 * MEMBERS
    assert len(members.mapped) == members.max_mapped  # the shuffled epoch touched more than fit: some were unmapped


def test_lazily_mapped_members_in_dataloader_workers(coll, monkeypatch):
    reference = PackedDataset(coll, "p")
    order = np.random.default_rng(2).permutation(len(reference)).tolist()
    want = [collate_varlen(reference.__getitems__(np.array(order[j:j + 4]))) for j in range(0, len(order), 4)]
    del reference
    monkeypatch.setattr(L, "MAP_BUDGET", BUDGET)
    monkeypatch.setattr(L, "MAX_MAPPED", BUDGET // 3)  # forked workers inherit it: each maps its own members lazily
    ds = PackedDataset(coll, "p")
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_varlen, sampler=order,
                        multiprocessing_context="fork")
    got = list(loader)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["pack_ids"].tolist() == w["pack_ids"].tolist()
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(g[key], w[key]), key


def test_a_bad_member_is_refused_when_a_batch_first_touches_it(tmp_path, monkeypatch):
    root = _collection(tmp_path)
    manifest = root.parent / "members" / "m007" / "manifest.json"
    obj = json.loads(manifest.read_text())
    obj["tokenizer"]["name"] = "other"  # C3: not the manifest the collection recorded
    manifest.write_text(json.dumps(obj))
    monkeypatch.setattr(L, "MAP_BUDGET", BUDGET)
    monkeypatch.setattr(L, "MAX_MAPPED", BUDGET // 3)
    ds = PackedDataset(root, "p")  # opens: the member is not read yet
    coll = packfmt.open(root)
    touches = [p for p in range(len(ds)) if 7 in coll.member_of(ds.index.segments[ds.index.pack_offsets[p]:
                                                                                   ds.index.pack_offsets[p + 1], 0])]
    clean = [p for p in range(len(ds)) if p not in touches]
    assert len(ds.__getitems__(np.array(clean[:3]))) == 3
    with pytest.raises(FormatError, match="m007") as exc:
        ds.__getitems__(np.array(touches[:1]))
    assert "manifest" in str(exc.value)
    assert 7 not in ds._views()["members"].mapped


def test_many_members_open_only_what_the_first_batch_needs(coll, monkeypatch):
    """Past ``EAGER_MOST`` members (the mapping budget far away) the first batch opens only its own members, not all
    of them (a pack-ordered layout of 10^4 small shards took 4-6 s to its first batch): same items either way."""
    reference = PackedDataset(coll, "p")
    want = reference.__getitems__([0])
    monkeypatch.setattr(L, "EAGER_MOST", MEMBERS - 1)
    opened = []
    real = Collection.member
    monkeypatch.setattr(Collection, "member", lambda self, m: opened.append(m) or real(self, m))
    ds = PackedDataset(coll, "p")
    got = ds.__getitems__([0])
    assert ds._views()["members"] is not None  # mapped as batches need them
    first = set(opened)
    assert 0 < len(first) <= 3  # pack 0's members (packs cross member boundaries), not 60
    for k in KEYS:
        assert torch.equal(torch.as_tensor(np.asarray(got[0][k])), torch.as_tensor(np.asarray(want[0][k]))), k


def _bump_offset(shard: Path) -> None:
    path = shard / "doc_offsets.bin"
    offsets = np.fromfile(path, dtype=np.int64)
    offsets[1] += 1  # its first document one token longer than doc_lengths.bin records (C7), V13 still holding
    offsets.tofile(path)


def _rename_tokenizer(shard: Path) -> None:
    obj = json.loads((shard / "manifest.json").read_text())
    obj["tokenizer"]["name"] = "other"  # C3: not the manifest the layout recorded
    (shard / "manifest.json").write_text(json.dumps(obj))


@pytest.mark.parametrize("damage,file,field", [(_bump_offset, "doc_lengths.bin", "[{d}]"),
                                                (_rename_tokenizer, "manifest.json", "members[5].manifest")])
def test_a_damaged_shard_of_a_lazily_opened_layout_is_refused_when_touched(tmp_path, monkeypatch, damage, file, field):
    """A pack-ordered layout (spec/COLLECTION.md §9) opened lazily (more than ``EAGER_MOST`` shards) opens without
    reading its shards; a damaged one is refused, naming file, field, expected and found, when a batch first
    touches it, and never mapped; the others read."""
    from packfmt.collection.shards import write_shards
    from packfmt.packindex import build_pack_index

    rng = np.random.default_rng(0)
    with packfmt.DatasetWriter(tmp_path / "src", vocab_size=1000, tokenizer={"name": "t", "hash": None}) as w:
        for n in rng.integers(1, 40, 200):
            w.add_document(rng.integers(0, 1000, int(n)))
    build_pack_index(packfmt.open(tmp_path / "src"), capacity=64, algorithm="ffd", name="p")
    layout = write_shards(tmp_path / "src", "p", tmp_path / "layout", shard_bytes=256)
    assert layout.num_members > 8
    damage(tmp_path / "layout" / "shards" / "00005")
    monkeypatch.setattr(L, "EAGER_MOST", 4)
    ds = PackedDataset(tmp_path / "layout", "p")  # no shard read
    first = int(np.sum(layout.manifest.raw["layout"]["member_packs"][:5]))  # shard 5's first pack
    assert len(ds.__getitems__(np.array([0, first - 1]))) == 2
    with pytest.raises(FormatError) as exc:
        ds.__getitems__(np.array([first]))
    err = exc.value
    assert (err.file, err.field) == (file, field.format(d=int(layout.doc_start[5]))), str(err)
    assert err.expected is not None and err.found is not None and "00005" in str(err)
    assert 5 not in ds._views()["members"].mapped
