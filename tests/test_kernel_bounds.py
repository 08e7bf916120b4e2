"""The numba kernels do not check bounds: every index they make is guaranteed by a check before the call (or sized
from the same data). Each test here is a damaged input that reached a kernel unchecked, read or wrote outside an
array (found with ``NUMBA_BOUNDSCHECK=1``: an IndexError there is an access outside in production), and is now a
FormatError or ValueError naming the file or the argument, the field, what was expected and what was found."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from s3_server import s3_server  # noqa: F401  (a fixture: the last test's S3-protocol server)

import packfmt
from packfmt import checks
from packfmt.collection import write_collection
from packfmt.collection.shard_source import Source
from packfmt.collection.stats import distinct_documents
from packfmt.errors import FormatError
from packfmt.index_writer import write_segments
from packfmt.packing import Segmentation
from packfmt.packing.algorithms import PackResult
from packfmt.torch import PackedDataset, collate_varlen
from packfmt.torch.testing import (
    next_fit_segments,
    write_flat_dataset,
    write_pack_index,
)

LENGTHS = [50, 60, 70, 80]


def _store(path: Path, lengths, seed: int = 0) -> packfmt.Store:
    rng = np.random.default_rng(seed)
    off = np.concatenate([[0], np.cumsum(lengths)])
    return write_flat_dataset(path, rng.integers(0, 1000, int(off[-1])), off, vocab_size=1000)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A store of ``LENGTHS`` with a next-fit index "p" of capacity 64."""
    store = _store(tmp_path_factory.mktemp("kb") / "a", LENGTHS)
    segs, po = next_fit_segments(np.array(LENGTHS), 64)
    write_pack_index(store, segs, po, capacity=64, name="p")
    return packfmt.open(store.path)


def test_pack_index_of_another_dataset_is_refused(indexed, tmp_path):
    """``PackedDataset(B, index=<A's PackIndex>)``: A's segments, checked against A's documents, indexed B's
    document table and tokens (fill_item / fill_packs read past B's arrays). Now the binding is checked."""
    other = _store(tmp_path / "b", [5, 6], seed=1)
    idx = indexed.pack_index("p")
    with pytest.raises(FormatError) as exc:
        PackedDataset(other, index=idx)
    e = exc.value
    assert e.file == "packs/p/index.json" and e.field == "dataset.tokens.bin"
    assert str(other.path) in str(e)
    # the same dataset through another object (or its path) is the same documents: accepted
    same = PackedDataset(indexed.path, index=idx)
    assert same[0]["input_ids"].shape[0] == 64


@pytest.mark.parametrize("damage, field", [
    ("negative", "seq_lens[0]"),  # the kernel wrote the batch's doc_ids past the sum of the lengths
    ("longer", "seq_lens"),  # lengths summing past the item's tokens
    ("documents", "document_ids"),  # one document id per segment: read past the ids
])
def test_collate_varlen_refuses_items_whose_segments_lie(indexed, damage, field):
    ds = PackedDataset(indexed)
    items = [dict(ds[i]) for i in range(3)]  # plain dicts: the copying collate (finish_varlen)
    item = items[1]
    if damage == "negative":
        item["seq_lens"] = item["seq_lens"].clone()
        item["seq_lens"][0] = -item["seq_lens"][0]
    elif damage == "longer":
        item["seq_lens"] = item["seq_lens"].clone()
        item["seq_lens"][-1] += 7
    else:
        item["document_ids"] = item["document_ids"][:-1]
    with pytest.raises(ValueError, match="collate_varlen: item 1: " + re.escape(field)):
        collate_varlen(items)
    collate_varlen([dict(ds[i]) for i in range(3)])  # the items as read: fine


def test_distinct_documents_refuses_unchecked_pack_offsets():
    segs = np.array([[0, 0, 1], [0, 1, 2], [1, 0, 1]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"distinct_documents: pack offsets must rise from 0 to the 3 segments"):
        distinct_documents(segs, np.array([0, 50, 3]), 2)  # _repeats walked rows 3..49 of 3
    assert distinct_documents(segs, np.array([0, 2, 3]), 2).tolist() == [1, 1]


def test_segment_scan_refuses_pack_offsets_past_the_segments():
    """``checks.segments`` needs V25 checked first; pack offsets past the segments were read as rows."""
    segs = np.array([[0, 0, 1], [0, 1, 2], [1, 0, 1]], dtype=np.int64)
    off = np.array([0, 2, 3], dtype=np.int64)
    with pytest.raises(ValueError, match=r"packs/x/segments.bin: pack 1: expected segments in \[0, 3\).*found \[2, 50\)"):
        checks.segments(segs, off, np.array([0, 2, 50]), file="packs/x/segments.bin")
    found, lengths = checks.segments(segs, off, np.array([0, 2, 3]), file="packs/x/segments.bin")
    assert found == [] and lengths.tolist() == [2, 1]


def test_segment_scan_refuses_fewer_member_bounds_than_members():
    """With ``doc_start`` (a streamed collection), ``bounds[m]`` is read for member ``m``: one bound per member."""
    segs = np.array([[0, 0, 1], [3, 1, 2]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"x: checks.segments needs .* 3 doc_start entries and 1 bounds"):
        checks.segments(segs, np.array([9]), np.array([0, 2]), file="x", doc_start=np.array([0, 2, 5]))
    with pytest.raises(ValueError, match=r"0 doc_start entries"):
        checks.segments(segs, np.array([9]), np.array([0, 2]), file="x", doc_start=np.zeros(0, dtype=np.int64))
    found, _ = checks.segments(segs, np.array([9, 9]), np.array([0, 2]), file="x", doc_start=np.array([0, 2, 5]))
    assert found == []


@pytest.mark.parametrize("row, what", [
    ((3, 70, 275), "end <= the length of its document, 80"),  # the copy kernel read past the member's tokens
    ((4, 0, 5), "a document id in [0, 4)"),
    ((2, 9, 9), "0 <= begin < end"),
])
def test_shard_source_refuses_a_segment_outside_its_document(indexed, row, what):
    segs = np.array([[0, 10, 50], [1, 0, 60], row], dtype=np.int64)
    with pytest.raises(FormatError) as exc:
        Source(indexed).chunk(segs)
    e = exc.value
    assert (e.file, e.field, e.expected, e.found) == ("segments.bin", "[2]", what, str(row))
    with pytest.raises(FormatError, match=r"^packs/p/segments.bin: \[102\]: expected"):  # rows 100.. of the file
        Source(indexed).chunk(segs, 100, "packs/p/segments.bin")
    assert len(Source(indexed).chunk(segs[:2])) == 2


def test_write_segments_refuses_pack_offsets_short_of_the_segments(tmp_path):
    """``_add_pack_tokens`` walked the packing's pack offsets past their end for a segment after the last pack."""
    # rows kept as rows, and whole documents (rows and their packs' tokens in one pass): the same refusal, the same rows
    for k, seg in enumerate([Segmentation(np.array([[0, 0, 4], [1, 0, 4], [2, 0, 4]], dtype=np.int64), None),
                             Segmentation.whole_documents(np.array([4, 4, 4], dtype=np.int32))]):
        short = PackResult(pack_offsets=np.array([0, 1, 2], dtype=np.int64), order=np.arange(3, dtype=np.int64))
        with pytest.raises(ValueError, match=r"write_segments: segment 2 lies past the last pack .* found 2"):
            write_segments(tmp_path / f"segments{k}.bin", seg, short, direct=False)
        ok = PackResult(pack_offsets=np.array([0, 1, 3], dtype=np.int64), order=np.arange(3, dtype=np.int64))
        assert write_segments(tmp_path / f"ok{k}.bin", seg, ok, direct=False)[1].tolist() == [4, 8]
        assert np.fromfile(tmp_path / f"ok{k}.bin", dtype=np.int64).tolist() == [0, 0, 4, 1, 0, 4, 2, 0, 4]


def test_write_segments_refuses_item_lengths_that_do_not_fit_the_packing(tmp_path):
    """Whole documents with the packing's lengths in pack order (``item_lengths``: no length gathered per row): pack
    offsets short of the segments refused as without them, lengths not one a segment refused before any row."""
    seg = Segmentation.whole_documents(np.array([4, 4, 4], dtype=np.int32))
    order, lengths = np.arange(3, dtype=np.int64), np.full(3, 4, dtype=np.int64)
    short = PackResult(np.array([0, 1, 2], dtype=np.int64), order, lengths)
    with pytest.raises(ValueError, match=r"write_segments: segment 2 lies past the last pack .* found 2"):
        write_segments(tmp_path / "short.bin", seg, short, direct=False)
    few = PackResult(np.array([0, 1, 3], dtype=np.int64), order, lengths[:2])
    with pytest.raises(ValueError, match=r"item_lengths hold 2 lengths for its 3 segments"):
        write_segments(tmp_path / "few.bin", seg, few, direct=False)
    ok = PackResult(np.array([0, 1, 3], dtype=np.int64), order, lengths)
    assert write_segments(tmp_path / "ok.bin", seg, ok, direct=False)[1].tolist() == [4, 8]
    assert np.fromfile(tmp_path / "ok.bin", dtype=np.int64).tolist() == [0, 0, 4, 1, 0, 4, 2, 0, 4]


def test_pack_index_with_wrong_item_lengths_is_not_published(tmp_path, monkeypatch):
    """The rows' lengths of whole documents come from the packing (``item_lengths``), not from the store: a packing
    whose lengths do not add up to the store's tokens is an internal error, and no index appears."""
    import packfmt.packing
    from packfmt.errors import WriteError
    from packfmt.packindex import build_pack_index

    store = _store(tmp_path / "s", [3, 5, 2, 7])
    pack_items = packfmt.packing.pack_items

    def one_token_short(*args, **kwargs):
        r = pack_items(*args, **kwargs)
        assert r.item_lengths is not None  # ffd of a counting sort
        wrong = r.item_lengths.copy()
        wrong[0] -= 1
        return PackResult(r.pack_offsets, r.order, wrong)

    monkeypatch.setattr(packfmt.packing, "pack_items", one_token_short)
    with pytest.raises(WriteError, match=r"internal error: the packs computed break spec §4.2"):
        build_pack_index(store, capacity=8, algorithm="ffd", name="w")
    assert not (store.path / "packs" / "w").exists()
    monkeypatch.setattr(packfmt.packing, "pack_items", pack_items)
    assert build_pack_index(store, capacity=8, algorithm="ffd", name="w").stats["tokens"] == 17


def test_pack_index_opened_streamed_is_not_read_locally(s3_server, tmp_path, monkeypatch):  # noqa: F811
    """A streamed collection's open bounds each segment by its member only (its batches check each against its
    document when the member arrives); the same PackIndex given to a local read of the collection had the kernels
    read a segment past its document, past the member's tokens (garbage, or past the mapping)."""
    from packfmt.storage.upload import upload_tree

    monkeypatch.setenv("PACKFMT_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    paths = []
    for m in range(2):
        with packfmt.DatasetWriter(tmp_path / "coll" / "members" / f"m{m}", vocab_size=1000,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in (30, 40, 50):
                w.add_document(rng.integers(0, 1000, n))
        paths.append(tmp_path / "coll" / "members" / f"m{m}")
    coll = write_collection(tmp_path / "coll" / "c", [(None, p) for p in paths])
    segs = np.array([[0, 0, 30], [1, 0, 40], [2, 0, 50], [3, 0, 30], [4, 0, 40], [5, 10, 110]], dtype=np.int64)
    with pytest.raises(FormatError, match=r"\[5\]: expected 0 <= begin < end <= length of document 5 \(50\)"):
        write_pack_index(coll, segs, np.array([0, 2, 3, 4, 5, 6]), capacity=120, name="p")  # written, then refused
    upload_tree(tmp_path / "coll", "s3://bkt/kb")
    idx = packfmt.open("s3://bkt/kb/c", stream=True).pack_index("p")  # bounded by member: opens
    with pytest.raises(ValueError, match=r"packs/p/segments.bin: this PackIndex was opened on a streamed collection.*"
                                         r"index='p'"):
        PackedDataset(coll.path, index=idx)

