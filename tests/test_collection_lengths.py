"""A collection's own record of its documents' lengths, ``doc_lengths.bin`` (spec/COLLECTION.md §2.4, C7;
SECURITY.md A20): every writer writes the members' lengths; opening and packing read the record, not the
members; a record that lies (checksum fixed up) is refused at the file, or at the member it lies about when
that member opens, and by ``validate``, naming both files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from old_collections import without_lengths_record

from packfmt import format as F
from packfmt.collection import Collection, write_collection
from packfmt.collection.lengths import LENGTHS_FILE, _c7_scan
from packfmt.collection.shards import write_shards
from packfmt.errors import ChecksumError, FormatError
from packfmt.packindex import build_pack_index
from packfmt.reader import Store
from packfmt.torch.testing import write_random_collection, write_split_stores
from packfmt.validate import validate


def _rewrite_record(root: Path, lengths: np.ndarray) -> None:
    """Replace ``doc_lengths.bin`` with ``lengths`` and fix up its size and checksum in the manifest."""
    data = np.asarray(lengths, dtype="<i8").tobytes()
    (root / LENGTHS_FILE).write_bytes(data)
    obj = json.loads((root / F.MANIFEST).read_bytes())
    obj["files"][LENGTHS_FILE] = {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)}
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 7), min_size=1, max_size=10).filter(any), seed=st.integers(0, 99))
def test_the_record_is_the_members_lengths_and_opening_reads_no_member(tmp_path_factory, counts, seed):
    root, paths, lengths = write_random_collection(tmp_path_factory.mktemp("c"), counts, seed)
    record = np.fromfile(root / LENGTHS_FILE, dtype="<i8")
    np.testing.assert_array_equal(record, np.concatenate([np.diff(Store(p).doc_offsets) for p in paths]))
    np.testing.assert_array_equal(record, lengths)
    obj = json.loads((root / F.MANIFEST).read_bytes())
    assert obj["format_version"] == "1.3"
    assert obj["files"] == {LENGTHS_FILE: {"bytes": 8 * len(lengths),
                                           "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(record.tobytes())}}
    coll = Collection(root)
    np.testing.assert_array_equal(coll.doc_lengths, lengths)
    assert not coll._open  # no member opened for its lengths
    assert validate(root).ok


def test_a_merge_of_a_collection_and_a_store_records_every_member(tmp_path):
    root, paths, lengths = write_random_collection(tmp_path, [3, 1, 4])
    extra = Path(write_split_stores(tmp_path / "more", np.arange(5, dtype=np.uint16), np.array([0, 2, 5]),
                                    np.array([0, 2]), vocab_size=1000)[0])
    big = write_collection(tmp_path / "big", [("a", root), ("b", extra)])
    np.testing.assert_array_equal(np.fromfile(big.path / LENGTHS_FILE, dtype="<i8"), np.concatenate([lengths, [2, 3]]))
    assert validate(big.path).ok


def test_packing_reads_the_record_not_thewrite_random_collection(tmp_path):
    root, paths, _ = write_random_collection(tmp_path, [5, 2, 6])
    want = build_pack_index(root, capacity=64, algorithm="ffd", name="a")
    for p in paths:  # no member can give its lengths now: only the record can
        os.rename(p / F.DOC_OFFSETS, p / "moved")
    got = build_pack_index(root, capacity=64, algorithm="ffd", name="b")
    np.testing.assert_array_equal(np.asarray(got.segments), np.asarray(want.segments))
    np.testing.assert_array_equal(np.asarray(got.pack_offsets), np.asarray(want.pack_offsets))


def test_shards_record_their_documents(tmp_path):
    root, _, _ = write_random_collection(tmp_path, [6, 5, 7])
    build_pack_index(root, capacity=48, algorithm="ffd", name="p")
    out = write_shards(root, "p", tmp_path / "out", shard_bytes=64)
    members = [Store(out.member_path(m)) for m in range(len(out.members))]
    np.testing.assert_array_equal(np.fromfile(out.path / LENGTHS_FILE, dtype="<i8"),
                                  np.concatenate([np.diff(s.doc_offsets) for s in members]))
    assert validate(out.path, deep=True).ok


def _lie_about(root: Path, lengths: np.ndarray, g: int) -> np.ndarray:
    """The record with documents ``g`` and ``g + 1`` (one member's) one token longer and shorter: sums kept."""
    lie = lengths.copy()
    lie[g] += 1
    lie[g + 1] -= 1
    assert lie[g + 1] >= 1
    _rewrite_record(root, lie)
    return lie


def test_a_record_that_lies_about_a_member_is_refused_when_it_opens(tmp_path):
    root, paths, lengths = write_random_collection(tmp_path, [3, 4, 3], seed=3)
    g = 3 + int(np.flatnonzero(lengths[4:7] >= 2)[0])  # member 1 holds documents 3..6
    lie = _lie_about(root, lengths, g)
    coll = Collection(root)
    np.testing.assert_array_equal(coll.doc_lengths, lie)  # C7 of the file alone holds: sums and signs are right
    coll.document(0)  # member 0 agrees with the record
    with pytest.raises(FormatError) as e:
        coll.member(1)
    msg = str(e.value)
    assert e.value.file == LENGTHS_FILE and e.value.field == f"[{g}]"
    assert e.value.expected == lengths[g] and e.value.found == lie[g]
    assert "members[1]" in msg and f"stores/{paths[1].name}/{F.DOC_OFFSETS}" in msg
    with pytest.raises(FormatError, match=LENGTHS_FILE):
        coll.document(g)
    # a pack index bounded by the lie is built, and read by no reader: the member is refused first
    build_pack_index(root, capacity=64, algorithm="ffd", name="p")
    with pytest.raises(FormatError, match=LENGTHS_FILE):
        _read_all(root)
    report = validate(root)
    errors = [p for p in report.errors if p.file == LENGTHS_FILE]
    assert len(errors) == 1 and errors[0].field == f"[{g}]" and F.DOC_OFFSETS in errors[0].message
    assert "members[1]" in errors[0].message
    assert [p for p in validate(root, deep=True).errors if p.file == LENGTHS_FILE][0].field == f"[{g}]"


def _read_all(root: Path) -> None:
    """Every document of the collection, after its lengths (the record) were read, as a reader of an index does."""
    coll = Collection(root)
    coll.doc_offsets
    for g in range(coll.num_documents):
        coll.document(g)


def test_members_open_before_the_record_is_read_are_compared_then(tmp_path):
    root, _, lengths = write_random_collection(tmp_path, [4, 4], seed=5)
    g = int(np.flatnonzero(lengths[1:4] >= 2)[0])
    _lie_about(root, lengths, g)
    coll = Collection(root)
    coll.member(0)
    with pytest.raises(FormatError, match=rf"{LENGTHS_FILE}: \[{g}\] \(members\[0\]"):
        coll.doc_lengths
    with pytest.raises(FormatError):  # and stays refused
        coll.doc_lengths


@pytest.mark.parametrize("lie,match", [
    (lambda x: np.concatenate([[x[0] + x[1]], [0], x[2:]]), r"\[1\]: expected a length >= 1"),
    (lambda x: np.concatenate([[x[0] + 1], x[1:]]), r"members\[0\].*summing to"),
    (lambda x: np.concatenate([[-(2**62)], [2**62 + x[0] + x[1]], x[2:]]), r"\[0\]: expected a length >= 1"),
    (lambda x: np.concatenate([x[:-1], [2**63 - 1 - int(x[:-1].sum())]]), r"summing to"),
    (lambda x: np.concatenate([[2**62, 2**62], x[2:]]), r"\[1\]: expected a length >= 1"),  # the sum passes 2^63
])
def test_a_record_whose_contents_break_c7_is_refused_as_it_is_read(tmp_path, lie, match):
    root, _, lengths = write_random_collection(tmp_path, [3, 3])
    _rewrite_record(root, lie(lengths))
    with pytest.raises(FormatError, match=match) as e:
        Collection(root).doc_lengths
    assert e.value.file == LENGTHS_FILE
    assert any(p.file == LENGTHS_FILE for p in validate(root).errors)


def test_a_changed_or_resized_record_is_refused(tmp_path):
    root, _, lengths = write_random_collection(tmp_path, [3, 3])
    flipped = lengths.copy()
    flipped[[0, 1]] = flipped[[1, 0]]  # valid contents, not the recorded bytes
    (root / LENGTHS_FILE).write_bytes(flipped.astype("<i8").tobytes())
    if not np.array_equal(flipped, lengths):
        with pytest.raises(ChecksumError, match=r"doc_lengths.bin: checksum: expected xxh3_64:"):
            Collection(root).doc_lengths
    (root / LENGTHS_FILE).write_bytes(lengths.astype("<i8").tobytes()[:-8])
    with pytest.raises(FormatError, match=r"doc_lengths.bin: size: expected 48 bytes"):
        Collection(root).doc_lengths
    assert [p.field for p in validate(root).errors] == ["size"]
    obj = json.loads((root / F.MANIFEST).read_bytes())
    obj["files"][LENGTHS_FILE]["bytes"] = 40
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    with pytest.raises(FormatError, match=r"files.doc_lengths.bin.bytes: expected 48"):
        Collection(root)


def test_files_is_checked_as_c1(tmp_path):
    root, _, _ = write_random_collection(tmp_path, [2, 2])
    raw = json.loads((root / F.MANIFEST).read_bytes())
    for change, field in [(lambda o: o.update(format_version="1.2"), "files"),
                          (lambda o: o["files"].update({"other.bin": dict(o["files"][LENGTHS_FILE])}), "files"),
                          (lambda o: o["files"].update({"../x": dict(o["files"][LENGTHS_FILE])}), "files"),
                          (lambda o: o["files"][LENGTHS_FILE].update(checksum="md5:0"), "files.doc_lengths.bin.checksum")]:
        obj = json.loads(json.dumps(raw))
        change(obj)
        (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
        with pytest.raises(FormatError) as e:
            Collection(root)
        assert e.value.field == field
    obj = json.loads(json.dumps(raw))  # a newer minor may list other files: ignored
    obj.update(format_version="1.5")
    obj["files"]["other.bin"] = dict(obj["files"][LENGTHS_FILE])
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    assert set(Collection(root).manifest.files) == {LENGTHS_FILE}


def test_without_the_file_the_members_give_the_lengths(tmp_path):
    root, _, lengths = write_random_collection(tmp_path, [3, 2, 4])
    os.remove(root / LENGTHS_FILE)  # listed, absent: a reader reads the members; validate reports it
    coll = Collection(root)
    np.testing.assert_array_equal(coll.doc_lengths, lengths)
    report = validate(root)  # a warning: the collection reads the same, the long way (a mirror may lack it)
    assert report.ok and [(p.file, p.found) for p in report.warnings] == [(LENGTHS_FILE, "missing")]
    without_lengths_record(root)  # a 1.2 collection: valid, read from its members
    np.testing.assert_array_equal(Collection(root).doc_lengths, lengths)
    assert validate(root).ok


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(0, 2**32),
       st.sampled_from(["ok", "short", "sum", "both", "overflow"]))
def test_c7_scan_finds_what_the_rule_finds(documents, seed, damage):
    """C7's one-pass kernel against the rule written out (per-member slices, a Python running sum), members of no
    document included (first, last, in a row): the same first short or overflowing document, the same first member
    whose lengths do not sum to its tokens (before that document), and that sum."""
    documents = np.array(documents, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n = int(documents.sum())
    lengths = rng.integers(1, 1000, n).astype(np.int64)
    starts = np.cumsum(documents) - documents
    tokens = np.array([int(lengths[a:a + k].sum()) for a, k in zip(starts, documents)], dtype=np.int64)
    if n and damage in ("short", "both"):
        lengths[int(rng.integers(0, n))] = int(rng.integers(-3, 1))
    if n and damage == "overflow":
        lengths[int(rng.integers(0, n))] = 2**63 - 1 - int(rng.integers(0, 3))
    if damage in ("sum", "both"):
        tokens[int(rng.integers(0, len(documents)))] += 1
    want_d, total = -1, 0
    for d, x in enumerate(lengths.tolist()):
        if x < 1 or total + x > 2**63 - 1:
            want_d = d
            break
        total += x
    sums = [sum(lengths[a:a + k].tolist()) for a, k in zip(starts, documents)]
    bad = [m for m in range(len(documents))
           if sums[m] != tokens[m] and (want_d < 0 or starts[m] + documents[m] <= want_d)]
    d, m, found = _c7_scan(lengths, documents, tokens)
    assert int(d) == want_d
    assert int(m) == (bad[0] if bad else -1)
    if bad:
        assert int(found) == sums[bad[0]]
