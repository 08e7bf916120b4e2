"""Collections (spec/COLLECTION.md): manifest, members, merge without copying, binding of pack indexes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt.cli import main
from packfmt.collection import Collection, write_collection
from packfmt.errors import FormatError, UnsupportedVersionError, WriteError


def make_store(root: Path, lengths, *, vocab: int = 1000, seed: int = 0, tokenizer: str = "tok") -> Path:
    rng = np.random.default_rng(seed)
    with packfmt.DatasetWriter(root, vocab_size=vocab, tokenizer={"name": tokenizer, "hash": None}) as w:
        for n in lengths:
            w.add_document(rng.integers(0, vocab, n))
    return root


@pytest.fixture
def three(tmp_path):
    return [make_store(tmp_path / name, lengths, seed=i) for i, (name, lengths) in
            enumerate((("web", [3, 9, 1, 4]), ("code", [7, 2]), ("books", [12, 5, 6])))]


def test_collection_reads_members_in_order_without_copying(tmp_path, three):
    coll = write_collection(tmp_path / "mix", [(None, p) for p in three])
    assert isinstance(packfmt.open(tmp_path / "mix"), Collection)
    stores = [packfmt.open(p) for p in three]
    docs = [s.document(d) for s in stores for d in range(s.num_documents)]
    assert coll.num_documents == len(docs) == 9
    for g, want in enumerate(docs):
        got = coll.document(g)
        assert got.tolist() == want.tolist()
        assert isinstance(got.base, np.memmap) or isinstance(got, np.memmap)  # a view of the member's file
    assert coll.doc_lengths.tolist() == [len(d) for d in docs]
    assert [m.name for m in coll.members] == ["web", "code", "books"]
    assert [m.path for m in coll.members] == ["../web", "../code", "../books"]
    # nothing copied: the manifest and the record of the lengths (8 bytes a document)
    assert sorted(p.name for p in (tmp_path / "mix").iterdir()) == ["doc_lengths.bin", "manifest.json"]
    assert (tmp_path / "mix" / "doc_lengths.bin").stat().st_size == 8 * 9


def test_a_store_reader_refuses_a_collection_naming_its_version(tmp_path, three):
    write_collection(tmp_path / "mix", [(None, p) for p in three])
    with pytest.raises(UnsupportedVersionError, match=r"collection \(format 1\.3.*packfmt\.open"):
        packfmt.Store(tmp_path / "mix")


def test_mismatched_tokenizer_or_dtype_refused_naming_both_members(tmp_path, three):
    other = make_store(tmp_path / "other", [4, 4], tokenizer="another")
    with pytest.raises(WriteError, match=r"'web' .* and 'other' .* differ in tokenizer"):
        write_collection(tmp_path / "mix", [(None, three[0]), (None, other)])
    wide = make_store(tmp_path / "wide", [4], vocab=70000)
    with pytest.raises(WriteError, match=r"'web' .* and 'wide' .* differ in vocab_size"):
        write_collection(tmp_path / "mix", [(None, three[0]), (None, wide)])
    assert not (tmp_path / "mix").exists()


def test_duplicate_names_refused_and_name_equals_path_renames(tmp_path, three):
    with pytest.raises(WriteError, match=r"two members are named 'web'.*NAME=PATH"):
        write_collection(tmp_path / "mix", [(None, three[0]), (None, three[0])])
    coll = write_collection(tmp_path / "mix", [(None, three[0]), ("web2", three[0])])
    assert [m.name for m in coll.members] == ["web", "web2"]


def test_nested_collection_members_are_prefixed(tmp_path, three):
    write_collection(tmp_path / "inner", [(None, p) for p in three[:2]])
    outer = write_collection(tmp_path / "outer", [("mix", tmp_path / "inner"), (None, three[2])])
    assert [m.name for m in outer.members] == ["mix.web", "mix.code", "books"]
    assert outer.document(6).tolist() == packfmt.open(three[2]).document(0).tolist()


def test_changed_member_is_refused_naming_it(tmp_path, three):
    coll = write_collection(tmp_path / "mix", [(None, p) for p in three])
    import shutil

    shutil.rmtree(three[1])
    make_store(three[1], [7, 2], seed=99)  # same counts, other tokens
    fresh = Collection(coll.path)
    with pytest.raises(FormatError, match=r"members\[1\] \(code\).*changed after the collection was written"):
        fresh.document(4)


def test_cli_merge(tmp_path, three, capsys):
    assert main(["merge", *map(str, three), "-o", str(tmp_path / "mix")]) == 0
    assert "3 members (member array, format 1.3), 9 documents" in capsys.readouterr().out
    assert main(["merge", str(three[0]), "-o", str(tmp_path / "mix")]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_collection_manifest_counts_must_add_up(tmp_path, three):
    coll = write_collection(tmp_path / "mix", [(None, p) for p in three])
    doc = json.loads((coll.path / F.MANIFEST).read_text())
    doc["counts"]["documents"] += 1
    (coll.path / F.MANIFEST).write_bytes(F.canonical_json(doc))
    with pytest.raises(FormatError, match=r"counts\.documents: expected 9 \(the sum over members\)"):
        packfmt.open(coll.path)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=5))
def test_document_ids_map_to_members_at_every_edge(tmp_path_factory, counts):
    """Property: collection document g is local document g - doc_start[m] of member m, empty members included."""
    root = tmp_path_factory.mktemp("edges")
    paths = [make_store(root / f"m{i}", [i + 1] * n, seed=i) for i, n in enumerate(counts)]
    coll = write_collection(root / "c", [(None, p) for p in paths])
    expected = [(m, d) for m, n in enumerate(counts) for d in range(n)]
    assert coll.num_documents == len(expected)
    assert [coll.locate(g) for g in range(len(expected))] == expected
    assert coll.member_of(np.arange(len(expected))).tolist() == [m for m, _ in expected]
    for g, (m, d) in enumerate(expected):
        assert len(coll.document(g)) == m + 1  # member m's documents have m + 1 tokens
    with pytest.raises(IndexError):
        coll.locate(len(expected))
