"""The member table (spec/COLLECTION.md §2.5, format 2.0): the member list of a large collection in two files.

A table reads exactly as the JSON array it replaces (same entries, lengths, packs and items); its vectorised
checks accept exactly what the per-entry checks of the array accept (a property test over random entries and
random byte edits); every malformed or lying table is refused naming the file and the record or line; and the
writers switch to it at 256 members (``DEFAULT_TABLE_MIN``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt.collection import write_collection
from packfmt.collection.manifest import Member, check_member_name, check_member_path
from packfmt.collection.member_table import (
    DEFAULT_TABLE_MIN,
    NAMES_FILE,
    TABLE_FILE,
    parse_table,
    table_record,
)
from packfmt.collection.reader import Collection
from packfmt.errors import ChecksumError, FormatError, UnsupportedVersionError
from packfmt.packindex import build_pack_index
from packfmt.torch.testing import write_split_stores
from packfmt.validate import validate


def _stores(root, members: int, per_member: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = members * per_member
    lengths = rng.integers(1, 40, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 5000, int(offsets[-1]), dtype=np.uint16)
    return write_split_stores(root / "stores", tokens, offsets, np.arange(0, n + 1, per_member), vocab_size=5000)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same 12 stores as a collection with a table and one with the JSON array."""
    root = tmp_path_factory.mktemp("pair")
    paths = _stores(root, 12)
    table = write_collection(root / "table", [(None, p) for p in paths], member_table=True)
    array = write_collection(root / "array", [(None, p) for p in paths], member_table=False)
    return table.path, array.path


def _rewrite(root, name: str, data: bytes) -> None:
    """Replace one of the table's files and fix its size and checksum in the manifest (a table that lies)."""
    (root / name).write_bytes(data)
    obj = json.loads((root / F.MANIFEST).read_text())
    obj["files"][name] = {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)}
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))


def test_a_table_reads_exactly_as_the_array(pair):
    t, a = Collection(pair[0]), Collection(pair[1])
    raw = json.loads((pair[0] / F.MANIFEST).read_text())
    assert raw["format_version"] == "2.0" and raw["members"] == "table"
    assert json.loads((pair[1] / F.MANIFEST).read_text())["format_version"] == "1.3"
    assert set(raw["files"]) == {"doc_lengths.bin", TABLE_FILE, NAMES_FILE}
    assert list(t.members) == list(a.members) and len(t.members) == 12
    assert t.members[-1] == a.members[11] and t.members[2:5] == list(a.members)[2:5]
    for col in ("documents", "tokens", "images"):
        assert np.array_equal(getattr(t.members, col), getattr(a.members, col))
    assert t.members.names == [m.name for m in a.members]
    assert np.array_equal(t.doc_lengths, a.doc_lengths)
    assert all(np.array_equal(t.document(g), a.document(g)) for g in range(t.num_documents))
    segs = []
    for root in pair:
        idx = build_pack_index(root, capacity=64, algorithm="ffd", name="p", overwrite=True)
        segs.append(np.asarray(idx.segments))
    assert np.array_equal(segs[0], segs[1])
    bound = json.loads((pair[0] / F.PACKS_DIR / "p" / F.PACK_INDEX_JSON).read_text())["collection"]
    both = (pair[0] / TABLE_FILE).read_bytes() + (pair[0] / NAMES_FILE).read_bytes()
    assert bound == "xxh3_64:" + xxhash.xxh3_64_hexdigest(both)  # §4: the two files end to end
    for root in pair:
        report = validate(root, deep=True)
        assert report.ok, report.problems
    ds = packfmt.open(pair[0])
    assert ds.pack_index("p").num_packs == packfmt.open(pair[1]).pack_index("p").num_packs


def test_writers_switch_to_the_table_at_the_threshold(tmp_path):
    paths = _stores(tmp_path, DEFAULT_TABLE_MIN, per_member=1)
    big = write_collection(tmp_path / "big", [(None, p) for p in paths])
    assert big.manifest.raw["members"] == "table" and len(big.members) == DEFAULT_TABLE_MIN
    small = write_collection(tmp_path / "small", [(None, p) for p in paths[:-1]])
    assert isinstance(small.manifest.raw["members"], list) and small.manifest.raw["format_version"] == "1.3"
    assert np.array_equal(big.doc_lengths[:-1], small.doc_lengths)
    merged = write_collection(tmp_path / "again", [(None, big.path)])  # members of a table collection, renamed
    assert merged.members[0].name == f"big.{big.members[0].name}" and merged.manifest.raw["members"] == "table"


@pytest.mark.parametrize("name,edit,field", [
    (TABLE_FILE, lambda b: b[:-32], "size"),
    (TABLE_FILE, lambda b: b[:8] + np.int64(-1).tobytes() + b[16:], "[0].tokens"),
    (NAMES_FILE, lambda b: b.replace(b"m000001\t", b"m000000\t", 1), "line 2 name"),
    (NAMES_FILE, lambda b: b.replace(b"m000003\t", b".m3\t", 1), "line 4 name"),
    (NAMES_FILE, lambda b: b.replace(b"m000003\t", b"x" * 129 + b"\t", 1), "line 4 name"),
    (NAMES_FILE, lambda b: b.replace(b"/m000002\n", b"//m000002\n", 1), "line 3 path"),
    (NAMES_FILE, lambda b: b.replace(b"\t../", b"\t/", 1), "line 1 path"),
    (NAMES_FILE, lambda b: b.replace(b"\t../", b"\t./", 1), "line 1 path"),
    (NAMES_FILE, lambda b: b.replace(b"/m000005\n", b"/m000005/.\n", 1), "line 6 path"),
    (NAMES_FILE, lambda b: b.replace(b"/m000005\n", b"/m000005/\n", 1), "line 6 path"),
    (NAMES_FILE, lambda b: b.replace(b"/m000005\n", b"/m0\\00005\n", 1), "line 6 path"),
    (NAMES_FILE, lambda b: b.replace(b"/m000005\n", b"/m000005\r\n", 1), "line 6 path"),
    (NAMES_FILE, lambda b: b.replace(b"m000004\t", b"m000004\tx\t", 1), "line 5"),
    (NAMES_FILE, lambda b: b[:-1], "line 12"),
    (NAMES_FILE, lambda b: b + b"extra\tx\n", "lines"),
    (NAMES_FILE, lambda b: b.replace(b"m000004", b"m\xff00004", 1), "line 5"),
])
def test_a_table_that_lies_is_refused_naming_file_and_line(tmp_path, pair, name, edit, field):
    import shutil

    root = tmp_path / "c"
    shutil.copytree(pair[0], root)
    _rewrite(root, name, edit((root / name).read_bytes()))
    with pytest.raises(FormatError) as exc:
        Collection(root)
    assert (exc.value.file, exc.value.field) == (name, field), str(exc.value)
    assert not validate(root).ok


def test_a_missing_or_changed_table_file_is_an_error_never_a_fallback(tmp_path, pair):
    import shutil

    for name in (TABLE_FILE, NAMES_FILE):
        root = tmp_path / name
        shutil.copytree(pair[0], root)
        data = bytearray((root / name).read_bytes())
        data[len(data) // 2] ^= 1
        (root / name).write_bytes(bytes(data))
        with pytest.raises(ChecksumError) as exc:
            Collection(root)
        assert exc.value.file == name and "merge" in str(exc.value)
        (root / name).unlink()
        with pytest.raises(FormatError, match=f"{name}: missing") as exc:
            packfmt.open(root)
        assert validate(root).errors[0].file == name


@pytest.mark.parametrize("change,field", [
    (lambda o: o.update(format_version="1.3"), "members"),  # a table in a 1.3 collection
    (lambda o: o.update(members="tables"), "members"),
    (lambda o: o["files"].pop(NAMES_FILE), "files"),
])
def test_the_manifest_side_of_a_table_is_c1(tmp_path, pair, change, field):
    import shutil

    root = tmp_path / "c"
    shutil.copytree(pair[0], root)
    obj = json.loads((root / F.MANIFEST).read_text())
    change(obj)
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    with pytest.raises(FormatError) as exc:
        Collection(root)
    assert exc.value.field == field, str(exc.value)


def test_table_files_listed_beside_an_array_are_refused(tmp_path, pair):
    import shutil

    root = tmp_path / "c"
    shutil.copytree(pair[1], root)
    obj = json.loads((root / F.MANIFEST).read_text())
    obj["format_version"] = "2.0"
    obj["files"][TABLE_FILE] = dict(obj["files"]["doc_lengths.bin"])
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    with pytest.raises(FormatError) as exc:
        Collection(root)
    assert exc.value.field == f"files.{TABLE_FILE}"



def _with_manifest(tmp_path, src, change):
    """A copy of the collection ``src`` whose manifest ``change(obj)`` edited, beside ``src`` (its member paths hold)."""
    import shutil

    root = src.parent / tmp_path.name
    shutil.copytree(src, root)
    obj = json.loads((root / F.MANIFEST).read_text())
    change(obj)
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    return root


def test_a_table_is_a_new_major_that_a_1x_reader_refuses_by_its_number(pair):
    """spec/README.md "Versioning": the table is not something a 1.3 reader may ignore, so it is major 2. What a
    deployed 1.x reader checks first (``F.parse_version`` with its one major, the check of every packfmt before this
    one) refuses it by the number, naming the file and both versions; the array stays 1.3, read by every 1.3 reader."""
    raw = json.loads((pair[0] / F.MANIFEST).read_text())
    with pytest.raises(UnsupportedVersionError) as exc:
        F.parse_version(raw["format_version"], file="manifest.json")
    assert exc.value.found == "2.0" and "Upgrade packfmt" in str(exc.value)
    assert F.parse_version(json.loads((pair[1] / F.MANIFEST).read_text())["format_version"], file="m") == (1, 3)


def test_a_withdrawn_1_4_table_collection_still_reads(tmp_path, pair):
    """Collections written as "1.4" (the table's first, withdrawn, version) read as before: same entries, and the
    pack indexes bound to them still open (the binding hashes the table's files, not the manifest)."""
    build_pack_index(pair[0], capacity=64, algorithm="ffd", name="p", overwrite=True)
    root = _with_manifest(tmp_path, pair[0], lambda o: o.update(format_version="1.4"))
    old, new = Collection(root), Collection(pair[0])
    assert old.manifest.version == (1, 4) and list(old.members) == list(new.members)
    assert np.array_equal(np.asarray(old.pack_index("p").segments), np.asarray(new.pack_index("p").segments))
    assert validate(root, deep=True).ok


@pytest.mark.parametrize("version", ["3.0", "0.9"])
def test_a_collection_of_another_major_is_refused_by_its_number(tmp_path, pair, version):
    root = _with_manifest(tmp_path, pair[1], lambda o: o.update(format_version=version))
    with pytest.raises(UnsupportedVersionError) as exc:
        Collection(root)
    assert exc.value.field == "format_version" and exc.value.found == version
    assert "1.1-1.4 and 2.x" in str(exc.value)
    problems = validate(root).errors
    assert problems and problems[0].field == "format_version"
    if version == "3.0":
        assert "Upgrade packfmt" in problems[0].message and "1.x or 2.x" in problems[0].message


@pytest.mark.parametrize("version,reads", [("1.5", True), ("2.1", True), ("1.4", False), ("2.0", False)])
def test_an_unknown_file_is_ignored_only_in_a_newer_minor_of_its_major(tmp_path, pair, version, reads):
    """A minor only adds what an older reader of its major may ignore (spec/README.md "Versioning"): a file listed in
    ``files`` that this reader does not know is ignored in 1.5 and 2.1, an error in 1.4 and 2.0, which it knows."""
    def change(obj):
        obj["format_version"] = version
        obj["files"]["later.bin"] = dict(obj["files"]["doc_lengths.bin"])

    root = _with_manifest(tmp_path, pair[0], change)
    if reads:
        assert list(Collection(root).members) == list(Collection(pair[0]).members)
    else:
        with pytest.raises(FormatError) as exc:
            Collection(root)
        assert exc.value.field == "files"


# -- the vectorised checks accept exactly what the per-entry checks accept

_names = st.text(st.sampled_from("ab9Z_.-"), min_size=1, max_size=5)
_paths = st.lists(st.sampled_from(["a", "..", ".", "", "b c", "é", "x.y"]), min_size=1, max_size=3).map("/".join)


def _slow_ok(text: bytes, n: int) -> bool:
    """The per-line rules of §2.5, written the long way."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if not s.endswith("\n") and n:
        return False
    lines = s.split("\n")[:-1] if n else ([] if s == "" else ["x"])
    if len(lines) != n:
        return False
    names = set()
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 2 or parts[0] in names or any(c in parts[1] for c in "\r\n"):
            return False
        try:
            check_member_name(parts[0])
            check_member_path(parts[1])
        except FormatError:
            return False
        names.add(parts[0])
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_names, _paths), min_size=1, max_size=6), st.integers(0, 200), st.sampled_from(
    [None, b"\t", b"\n", b"/", b".", b"\r", b"\0", b"\\", b"\xff", b"a", b"-", b"//"]))
def test_vectorised_checks_agree_with_the_per_line_rules(entries, where, insert):
    members = [Member(name, path, 1, 2, 0, "xxh3_64:0123456789abcdef") for name, path in entries]
    record = table_record(members) if not any("\t" in p for _, p in entries) else None
    if record is None:
        return
    text = record[NAMES_FILE]
    if insert is not None:
        at = where % (len(text) + 1)
        text = text[:at] + insert + text[at:]
    expected = _slow_ok(text, len(members))
    try:
        table = parse_table(record[TABLE_FILE], text, len(members))
    except FormatError as exc:
        assert not expected, f"refused {text!r}: {exc}"
        assert exc.file == NAMES_FILE
        return
    assert expected, f"accepted {text!r}"
    lines = text.decode("utf-8").split("\n")[:-1]
    assert [(m.name, m.path) for m in table] == [tuple(line.split("\t")) for line in lines]
    assert table.names == [line.split("\t")[0] for line in lines]


def test_a_table_listing_its_own_collection_names_the_cycle(tmp_path, pair):
    """SECURITY A18 through a member table: a path leading back to the collection is refused as a collection
    (never opened as one), and the error names the cycle."""
    import shutil

    root = tmp_path / "c"
    shutil.copytree(pair[0], root)
    _rewrite(root, NAMES_FILE, (root / NAMES_FILE).read_bytes().replace(b"\t../stores/m000004\n", b"\t../c\n", 1))
    coll = Collection(root)
    with pytest.raises(FormatError, match=r"a collection \(this collection itself: a cycle\)"):
        coll.member(4)
    assert any("cycle" in p.message for p in validate(root).errors)


def test_cli_merge_member_table_flag(tmp_path, capsys):
    """`packfmt merge --member-table yes|no|auto`: the listing asked for, said in the output; refused with --physical."""
    from packfmt.cli import main

    paths = _stores(tmp_path, 3)
    for flag, members, version in (("yes", "table", "2.0"), ("no", None, "1.3"), ("auto", None, "1.3")):
        out = tmp_path / f"c-{flag}"
        assert main(["merge", *map(str, paths), "-o", str(out), "--member-table", flag]) == 0
        raw = json.loads((out / F.MANIFEST).read_text())
        assert raw["format_version"] == version and (raw["members"] == "table") == (members == "table")
        said = capsys.readouterr().out
        assert f"({'member table' if members else 'member array'}, format {version})" in said
    assert main(["merge", "--physical", *map(str, paths), "-o", str(tmp_path / "one"), "--member-table", "yes"]) == 1
    assert "--member-table lists the members of a collection" in capsys.readouterr().err
    assert not (tmp_path / "one").exists()
