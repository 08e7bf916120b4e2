"""Every member's lengths read and checked without opening it as a Store (packfmt.collection.member_checks):
the same lengths as each member's own ``Store``, and a broken member refused (or reported by ``validate``)
with the words ``Store`` and ``Collection.member`` use, first broken member first. The collections here have
no ``doc_lengths.bin`` (as written before 1.3, ``old_collections``): that record is tests/test_collection_lengths.py's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt import format as F
from packfmt.collection import Collection, member_checks
from packfmt.collection.manifest import Member, member_list_checksum, members_json
from packfmt.errors import FormatError
from packfmt.reader import Store
from packfmt.torch.testing import write_random_collection
from packfmt.validate import validate

from old_collections import without_lengths_record


def _members(root, counts, seed=0):
    """A collection of members holding ``counts[m]`` documents each (1-39 tokens) as written before
    ``doc_lengths.bin``, its member paths and lengths."""
    path, paths, lengths = write_random_collection(root, counts, seed)
    return without_lengths_record(path), paths, lengths


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(1, 9), min_size=1, max_size=12), group=st.integers(2, 40))
def test_lengths_are_each_members_own_whatever_the_grouping(tmp_path_factory, monkeypatch, counts, group):
    root, paths, lengths = _members(tmp_path_factory.mktemp("c"), counts)
    monkeypatch.setattr(member_checks, "GROUP_OFFSETS", group)  # members split across groups, some alone
    coll = Collection(root)
    got = coll.doc_lengths
    np.testing.assert_array_equal(got, np.concatenate([np.diff(Store(p).doc_offsets) for p in paths]))
    np.testing.assert_array_equal(got, lengths)
    assert sorted(coll._open) == [m for m, n in enumerate(counts) if n + 1 > group]  # only those larger than a group
    assert validate(root).ok


def _break_offsets(path, at: int) -> None:
    """Member at ``path``: document ``at`` empty (offsets not strictly increasing), same size, same manifest."""
    off = np.fromfile(path / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)
    off[at + 1] = off[at]
    off.tofile(path / F.DOC_OFFSETS)


def test_a_broken_member_raises_what_its_store_raises_first_one_first(tmp_path):
    root, paths, _ = _members(tmp_path, [3] * 20)
    _break_offsets(paths[13], 1)
    _break_offsets(paths[7], 0)
    with pytest.raises(FormatError) as own:
        Store(paths[7])
    with pytest.raises(FormatError) as got:
        Collection(root).doc_lengths
    # the store's error, naming the member and the file as the collection reaches it (as validate does, below)
    assert str(got.value) == f"member 'm000007' (../stores/m000007): {own.value}" and "V13" in str(got.value)
    assert got.value.file == f"../stores/m000007/{own.value.file}" and got.value.field == own.value.field
    report = validate(root)
    bad = sorted({p.file for p in report.errors})
    assert bad == [f"../stores/m{m:06d}/{F.DOC_OFFSETS}" for m in (7, 13)], bad
    assert report.checked["members"] == 20


def test_a_changed_member_manifest_is_refused_as_changed(tmp_path):
    root, paths, _ = _members(tmp_path, [2] * 6)
    obj = json.loads((paths[4] / F.MANIFEST).read_text())
    obj["producer"]["version"] = "other"  # valid, and no longer the bytes the collection recorded (C3)
    (paths[4] / F.MANIFEST).write_text(json.dumps(obj))
    with pytest.raises(FormatError, match=r"members\[4\] \(m000004\).*changed after the collection was written"):
        Collection(root).doc_lengths
    assert [p.field for p in validate(root).errors] == ["members[4].manifest"]


def test_what_a_member_holds_besides_its_files_is_warned_of_by_deep_validate(tmp_path):
    # structural validate reads a member's manifest and offsets and sizes its tokens (C2, C3: seven system calls),
    # and lists no member's directory; --deep checks each member whole (C4), its stray entries included
    root, paths, _ = _members(tmp_path, [2] * 5)
    (paths[2] / "notes.txt").write_text("x")
    report = validate(root)
    assert report.ok and report.warnings == []
    report = validate(root, deep=True)
    assert report.ok
    assert [p.file for p in report.warnings] == ["../stores/m000002/notes.txt"]
    np.testing.assert_array_equal(Collection(root).doc_lengths,
                                  np.concatenate([np.diff(Store(p).doc_offsets) for p in paths]))


_text = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(Member, _text, _text, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                          st.integers(0, 2**63 - 1), _text), max_size=5))
def test_the_member_list_is_written_as_canonical_json_byte_for_byte(members):
    assert members_json(members) == F.canonical_json([m.to_json() for m in members])
    assert member_list_checksum(members) == member_list_checksum([m.to_json() for m in members])


_names = st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,5}", fullmatch=True), _text)
_paths = st.one_of(st.lists(st.sampled_from(["a", "..", ".", "", "b c", "x\\y", "/"]), min_size=1, max_size=4)
                   .map("/".join), _text)
_counts = st.one_of(st.integers(0, 3), st.sampled_from([-1, 2**63 - 1, 2**63, True, False, None, "1", 1.0]))
_digests = st.one_of(st.just("xxh3_64:0123456789abcdef"), st.sampled_from(["xxh3_64:0123", "xxh3_64:0123456789ABCDEF"]),
                     _text)


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.fixed_dictionaries({"name": _names, "path": _paths, "documents": _counts, "tokens": _counts,
                                                "images": _counts, "manifest": _digests}), min_size=1, max_size=3))
def test_the_inlined_member_checks_accept_exactly_what_the_long_ones_do(entries):
    from packfmt.collection import manifest as M

    def parse():
        obj = json.loads((Path(__file__).parent / "data" / "golden_v1_0" / F.MANIFEST).read_text())
        obj = {k: obj[k] for k in ("vocab_size", "token_dtype", "tokenizer", "special_tokens", "loss_mask")}
        ints = [e for e in entries if all(type(e[k]) is int for k in ("documents", "tokens", "images"))]
        obj.update(format="packfmt-collection", format_version="1.2", producer={"name": "t", "version": "0"},
                   members=entries, counts={"members": len(entries), **{k: sum(e[k] for e in ints)
                                                                       for k in ("documents", "tokens", "images")}})
        try:
            return M.parse_collection_manifest(obj).members
        except FormatError as exc:
            return (exc.field, exc.expected, exc.found)

    fast = parse()
    inlined, M._well_formed_member = M._well_formed_member, lambda entry, names: None
    try:
        assert parse() == fast
    finally:
        M._well_formed_member = inlined


def test_a_well_formed_entry_takes_the_inlined_checks():
    from packfmt.collection.manifest import _well_formed_member

    entry = {"name": "web.0", "path": "../a/b", "documents": 2, "tokens": 9, "images": 0,
             "manifest": "xxh3_64:0123456789abcdef"}
    assert _well_formed_member(entry, set()) == Member("web.0", "../a/b", 2, 9, 0, "xxh3_64:0123456789abcdef")
    for bad in ({"path": "a/./b"}, {"path": "a//b"}, {"path": "a/"}, {"documents": True}, {"name": "web.0"}):
        assert _well_formed_member({**entry, **bad}, {"web.0"} if "name" in bad else set()) is None
