"""What a new user meets first (issue 29): honest messages, names a user can predict, changed members refused.

- every ``validate`` message over crafted bad datasets says ``expected`` = what the spec (or the record the spec
  binds the file to) requires and ``found`` = what the file holds;
- ``pack`` refuses a collection whose member changed (C3), naming the member and the fix, as ``validate`` does;
- a missing Megatron prefix is one line naming the two files looked for;
- ``PackedDataset(path)`` / ``store.pack_index()`` take the only index, and list them when there are several;
- an index's default name follows from the command (``ffd-4096``, ``ffd-4096-weights``), ``pack`` prints it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt._io import checksum_file
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.errors import DatasetExistsError, FormatError
from packfmt.packindex import build_pack_index, default_index_name
from packfmt.validate import validate


def write_store(path: Path, docs: int = 6, vocab: int = 100) -> Path:
    with packfmt.DatasetWriter(path, vocab_size=vocab, tokenizer={"name": "t", "hash": None}) as w:
        for k in range(docs):
            w.add_document(np.arange(k, 2 * k + 5, dtype=np.int64) % vocab)
    return path


def edit_json(path: Path, change) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


def refresh_checksum(store: Path, name: str) -> None:
    """Record ``name``'s checksum as it is now (so that only the crafted rule fails)."""
    edit_json(store / F.MANIFEST, lambda m: m["files"][name].__setitem__("checksum", checksum_file(store / name)))


# -- expected is the spec's value, found the file's

def _tokens_bumped(d: Path) -> tuple:
    edit_json(d / F.MANIFEST, lambda m: m["counts"].__setitem__("tokens", m["counts"]["tokens"] + 3))
    return "doc_offsets.bin", "[6]", "48 (counts.tokens)", "45"  # the last offset must be counts.tokens


def _size_recorded_wrong(d: Path) -> tuple:
    edit_json(d / F.MANIFEST, lambda m: m["files"]["tokens.bin"].__setitem__("bytes", 92))
    return "tokens.bin", "size", "92 bytes (recorded in the manifest)", "90 bytes on disk"


def _byte_flipped(d: Path) -> tuple:
    raw = bytearray((d / F.TOKENS).read_bytes())
    want = json.loads((d / F.MANIFEST).read_text())["files"][F.TOKENS]["checksum"]
    raw[0] ^= 1
    (d / F.TOKENS).write_bytes(bytes(raw))
    return "tokens.bin", "checksum", want, checksum_file(d / F.TOKENS)


def _id_out_of_range(d: Path) -> tuple:
    tokens = np.fromfile(d / F.TOKENS, dtype=np.uint16)
    tokens[3] = 149
    tokens.tofile(d / F.TOKENS)
    refresh_checksum(d, F.TOKENS)
    return "tokens.bin", "vocab_size", "every token id < vocab_size 100", "1 ids >= 100 (max 149)"


def _last_offset_short(d: Path) -> tuple:
    offsets = np.fromfile(d / F.DOC_OFFSETS, dtype=np.int64)
    offsets[-1] -= 1
    offsets.tofile(d / F.DOC_OFFSETS)
    refresh_checksum(d, F.DOC_OFFSETS)
    return "doc_offsets.bin", "[6]", "45 (counts.tokens)", "44"


def _newer_major(d: Path) -> tuple:
    edit_json(d / F.MANIFEST, lambda m: m.__setitem__("format_version", "2.0"))
    return "manifest.json", "format_version", "1.x", "2.0"


def _dtype_for_vocab(d: Path) -> tuple:
    edit_json(d / F.MANIFEST, lambda m: m.__setitem__("token_dtype", "uint32"))
    return "manifest.json", "token_dtype", "'uint16' for vocab_size 100", "'uint32'"


def _index_of_another_store(d: Path) -> tuple:
    edit_json(d / "packs/p/index.json", lambda m: m["dataset"].__setitem__("tokens.bin", "xxh3_64:0000000000000000"))
    want = json.loads((d / F.MANIFEST).read_text())["files"][F.TOKENS]["checksum"]
    return "packs/p/index.json", "dataset.tokens.bin", want, "xxh3_64:0000000000000000"


def _index_capacity_lowered(d: Path) -> tuple:
    edit_json(d / "packs/p/index.json", lambda m: m.__setitem__("capacity", 4))
    return "packs/p/segments.bin", "pack 0", "<= capacity 4 tokens", "16 tokens"


CASES = {"counts.tokens": (_tokens_bumped, False), "recorded size": (_size_recorded_wrong, False),
         "checksum": (_byte_flipped, True), "token id": (_id_out_of_range, True),
         "last offset": (_last_offset_short, False), "format_version": (_newer_major, False),
         "token_dtype": (_dtype_for_vocab, False), "index binding": (_index_of_another_store, False),
         "capacity": (_index_capacity_lowered, False)}


@pytest.fixture(scope="module")
def packed_store(tmp_path_factory) -> Path:
    store = write_store(tmp_path_factory.mktemp("base") / "base")
    build_pack_index(store, capacity=16, name="p")
    return store


@pytest.mark.parametrize("case", list(CASES))
def test_validate_says_expected_the_spec_and_found_the_file(tmp_path, packed_store, case):
    crafted, deep = CASES[case]
    d = tmp_path / "d"
    shutil.copytree(packed_store, d)
    file, field, expected, found = crafted(d)
    report = validate(d, deep=deep)
    hits = [p for p in report.problems if p.file == file and p.field == field]
    assert hits, [(p.file, p.field, p.message) for p in report.problems]
    p = hits[0]
    assert str(p.expected).startswith(expected) and str(p.found).startswith(found), (p.expected, p.found)
    at = p.message.index("expected") if "expected" in p.message else None
    if at is not None:  # the words say it in the same order
        assert p.message.index(expected, at) < p.message.index(found, at), p.message


def test_a_replaced_member_is_reported_and_refused_by_pack_naming_it(tmp_path, capsys):
    """The issue's case: a member store replaced by another after the merge. ``validate`` reports the record as
    expected and the member as found; ``pack`` refuses before writing anything, as ``validate`` does (C3)."""
    web, code = write_store(tmp_path / "web"), write_store(tmp_path / "code", docs=4)
    write_collection(tmp_path / "mix", [(None, web), (None, code)])
    recorded = json.loads((tmp_path / "mix" / F.MANIFEST).read_text())["members"][1]
    shutil.rmtree(code)
    write_store(code, docs=5)
    problems = {p.field: p for p in validate(tmp_path / "mix").problems}
    assert problems["members[1].documents"].expected == "4" and problems["members[1].documents"].found == "5"
    assert problems["members[1].tokens"].expected == str(recorded["tokens"])
    assert problems["members[1].manifest"].expected == recorded["manifest"]
    assert problems["members[1].manifest"].found == checksum_file(code / F.MANIFEST)
    assert "documents: expected 4 (recorded in the collection), found 5" in problems["members[1].documents"].message
    capsys.readouterr()
    assert main(["pack", str(tmp_path / "mix"), "--capacity", "16"]) == 1
    err = capsys.readouterr().err
    assert "members[1] (code): manifest: expected " + recorded["manifest"] in err and "`packfmt merge`" in err
    assert err.count("\n") == 1 and not (tmp_path / "mix" / F.PACKS_DIR).exists()
    with pytest.raises(FormatError, match=r"members\[1\] \(code\).*changed after the collection was written"):
        build_pack_index(tmp_path / "mix", capacity=16)
    shutil.rmtree(code)
    assert main(["pack", str(tmp_path / "mix"), "--capacity", "16"]) == 1
    assert "no readable manifest.json" in capsys.readouterr().err


def test_a_missing_megatron_prefix_is_one_line_naming_both_files(tmp_path, capsys):
    assert main(["build", "megatron", str(tmp_path / "corpus"), "-o", str(tmp_path / "out"), "--vocab-size", "100"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"neither {tmp_path / 'corpus.bin'} nor {tmp_path / 'corpus.idx'} exists" in err
    (tmp_path / "corpus.idx").write_bytes(b"")
    assert main(["build", "megatron", str(tmp_path / "corpus.idx"), "-o", str(tmp_path / "out"), "--vocab-size",
                 "100"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"give the prefix without its suffix: {tmp_path / 'corpus'}" in err


def test_the_only_index_is_taken_and_several_are_listed(tmp_path):
    torch_ds = pytest.importorskip("packfmt.torch")
    store = write_store(tmp_path / "s")
    build_pack_index(store, capacity=16)
    assert packfmt.open(store).pack_index().name == "ffd-16"
    assert len(torch_ds.PackedDataset(store)) == len(torch_ds.PackedDataset(store, "ffd-16"))
    build_pack_index(store, capacity=32)
    with pytest.raises(FormatError, match=r"2 pack indexes \['ffd-16', 'ffd-32'\]: pass one of them"):
        torch_ds.PackedDataset(store)
    with pytest.raises(FormatError, match=r"2 pack indexes \['ffd-16', 'ffd-32'\]"):
        packfmt.open(store).pack_index()


def test_index_names_follow_from_the_command_and_pack_prints_them(tmp_path, capsys):
    write_collection(tmp_path / "mix", [("web", write_store(tmp_path / "web")), ("code", write_store(tmp_path / "code"))])
    mix = str(tmp_path / "mix")
    assert default_index_name("ffd", 4096, 0) == "ffd-4096"
    assert default_index_name("shuffle_and_pack", 4096, 3) == "shuffle_and_pack-4096-s3"
    assert default_index_name("ffd", 4096, 0, weights={"web": 2}) == "ffd-4096-weights"
    assert default_index_name("bfd", 64, 0, proportions={"web": 1}, tokens=9) == "bfd-64-proportions"
    capsys.readouterr()
    assert main(["pack", mix, "--capacity", "16", "--weights", "web=2"]) == 0
    out = capsys.readouterr().out
    assert "wrote pack index 'ffd-16-weights'" in out and f"PackedDataset({mix!r}, 'ffd-16-weights')" in out
    assert main(["pack", mix, "--capacity", "16", "--weights", "web=3"]) == 1  # another mixture of one kind
    err = capsys.readouterr().err
    assert "'ffd-16-weights' already exists (capacity 16, ffd, seed 0, weights {'web': 2.0})" in err
    assert "--overwrite" in err and "--name NAME" in err
    assert main(["pack", mix, "--capacity", "16", "--weights", "web=3", "--name", "web3"]) == 0
    assert "wrote pack index 'web3'" in capsys.readouterr().out
    assert main(["pack", mix, "--capacity", "16", "--proportions", "web=0.5,code=0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "ffd-16-proportions"
    with pytest.raises(DatasetExistsError, match="name this one with name="):
        build_pack_index(mix, capacity=16, weights={"web": 3})
