"""Every member's path and recorded checksum as columns (``members.paths``, ``members.digests``): the same as the
entries' own, for a member table and a JSON array, whatever the paths hold; a checksum not of the recorded form is
never equal to one a manifest has (``member_entry.digest_int``)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xxhash

from packfmt import format as F
from packfmt.collection import write_collection
from packfmt.collection.manifest import collection_reader, parse_collection_manifest
from packfmt.collection.member_entry import digest_int
from packfmt.collection.member_table import NAMES_FILE, MemberTable, table_paths
from packfmt.collection.reader import Collection
from packfmt.reader import Store
from packfmt.torch.testing import write_split_stores
from packfmt.validate import validate

#: Directory names a member table holds as written (§2.5 forbids only TAB, CR, NUL, backslash in a path) that a
#: split into lines would cut: form feed, vertical tab, U+0085, U+2028, U+2029, and a non-ASCII name.
ODD = ["a\x0cb", "c\x0bd", "e\x85f", "g\u2028h", "i\u2029j", "é k", "plain"]


def _parsed(root):
    return parse_collection_manifest(json.loads((root / F.MANIFEST).read_bytes()), read=collection_reader(root))


def _entries(cm) -> tuple[list, list]:
    return [x.path for x in cm.members], [int(x.manifest.split(":")[1], 16) for x in cm.members]


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """Stores whose directories have the names ``ODD``, as a collection with a table and one with the array."""
    root = tmp_path_factory.mktemp("odd")
    n = len(ODD)
    lengths = np.arange(1, 2 * n + 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = (np.arange(int(offsets[-1])) % 900).astype(np.uint16)
    stores = []
    for p, name in zip(write_split_stores(root / "stores", tokens, offsets, np.arange(0, 2 * n + 1, 2),
                                          vocab_size=1000), ODD):
        stores.append(shutil.move(str(p), str(root / "stores" / name)))
    sources = [(f"m{k}", p) for k, p in enumerate(stores)]  # a name is of [A-Za-z0-9_.-]; a path need not be
    table = write_collection(root / "table", sources, member_table=True).path
    array = write_collection(root / "array", sources, member_table=False).path
    return table, array, stores, np.diff(offsets)


@pytest.mark.parametrize("form", ["table", "array"])
def test_a_member_manifest_changed_is_reported_with_both_checksums(odd, tmp_path, form):
    root = tmp_path / "copy"
    shutil.copytree(odd[0].parent, root, symlinks=True)
    coll = root / form
    cm = _parsed(coll)
    m = next(k for k, x in enumerate(cm.members) if x.path.endswith("/plain"))
    where = coll / cm.members[m].path / F.MANIFEST
    obj = json.loads(where.read_bytes())
    obj["producer"]["version"] = "other"  # valid, and no longer the bytes the collection recorded (C3)
    where.write_bytes(F.canonical_json(obj))
    found = "xxh3_64:" + xxhash.xxh3_64_hexdigest(where.read_bytes())
    report = validate(coll)
    assert [(p.file, p.field, p.expected, p.found) for p in report.errors] == [
        (F.MANIFEST, f"members[{m}].manifest", cm.members[m].manifest, found)]
    assert "changed after the collection was written" in report.errors[0].message


def test_the_columns_are_the_entries_own_for_a_table_and_an_array(odd):
    table, array, stores, lengths = odd
    for root, kind in ((table, MemberTable), (array, None)):
        cm = _parsed(root)
        assert kind is None or isinstance(cm.members, kind)
        paths, digests = cm.members.paths, cm.members.digests
        assert (paths, digests) == _entries(cm)
        if kind is not None:  # the lenient reading of the cycle check and the Ray driver: the same paths
            assert table_paths((root / NAMES_FILE).read_bytes()) == paths
        assert sorted(p.rsplit("/", 1)[1] for p in paths) == sorted(ODD)
        report = validate(root)  # the members read at these paths (a wrong one is a missing member)
        assert report.ok and not report.warnings, report.problems
        np.testing.assert_array_equal(Collection(root).doc_lengths, lengths)
        for path, digest, store in zip(paths, digests, stores):
            assert (root / path).resolve() == Store(store).path.resolve()
            assert digest == xxhash.xxh3_64_intdigest((root / path / F.MANIFEST).read_bytes())


@pytest.mark.parametrize("text", ["xxh3_64:0123456789ABCDEF", "xxh3_64:0123456789abcdef\n", "xxh3_64:0123456789abcde",
                                  "xxh3_64:+123456789abcdef", "xxh3_64:0_23456789abcdef", "xxh3_64: 123456789abcdef",
                                  "xxh3:0123456789abcdef0000", "", "xxh3_64:0123456789abcdef0"])
def test_a_checksum_not_of_the_recorded_form_equals_no_manifests(text):
    assert digest_int(text) == -1


def test_a_recorded_checksum_is_the_integer_xxh3_gives():
    raw = b'{"format": "packfmt"}'
    assert digest_int("xxh3_64:" + xxhash.xxh3_64_hexdigest(raw)) == xxhash.xxh3_64_intdigest(raw)
    assert digest_int("xxh3_64:0000000000000000") == 0
    assert digest_int("xxh3_64:ffffffffffffffff") == 2**64 - 1
