"""``packfmt cp`` between local paths: byte-identical copies, members where the collection finds them, refusals,
and a copy stopped midway or fed a damaged file leaves nothing at DST (object storage: ``test_copy.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import packfmt
from packfmt import format as F
from packfmt.cli import main
from packfmt.copying import copy_dataset
from packfmt.errors import ChecksumError, DatasetExistsError, FormatError, WriteError
from packfmt.validate import validate

from copy_helpers import Stopped, files_of, make_datasets, packs_of, stop_after


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return make_datasets(tmp_path_factory.mktemp("src"))


def test_a_store_and_its_indexes_copy_byte_for_byte(data, tmp_path, capsys):
    assert main(["cp", str(data["store"]), str(tmp_path / "copy")]) == 0
    out = capsys.readouterr().out
    n = len(files_of(data["store"]))
    assert f"copied store {data['store']} to {tmp_path / 'copy'}: {n} files" in out
    assert "pack indexes: bfd-128, ffd-64" in out
    assert files_of(tmp_path / "copy") == files_of(data["store"])
    assert validate(tmp_path / "copy", deep=True).ok


def test_a_layout_copies_with_its_shards_inside_it(data, tmp_path):
    done = copy_dataset(data["layout"], tmp_path / "layout")
    assert done.kind == "collection" and done.members > 1 and not done.outside
    assert files_of(tmp_path / "layout") == files_of(data["layout"])
    assert packs_of(tmp_path / "layout") == packs_of(data["layout"])


def test_members_outside_are_refused_naming_where_they_would_go_or_copied_there(data, tmp_path, capsys):
    dst = tmp_path / "deep" / "mix"
    assert main(["cp", str(data["mix"]), str(dst)]) == 1
    err = capsys.readouterr().err
    assert f"'web' (../web -> {tmp_path / 'deep' / 'web'})" in err and "--outside-members copy" in err
    assert f"`packfmt merge --physical {data['mix']} -o STORE`" in err and not (tmp_path / "deep").exists()
    assert main(["cp", str(data["mix"]), str(dst), "--outside-members", "copy"]) == 0
    assert "2 member(s): 0 inside" in capsys.readouterr().out
    assert files_of(dst) == files_of(data["mix"])  # the manifest and the index unchanged: the paths still hold
    for name in ("web", "code"):
        assert files_of(tmp_path / "deep" / name) == {k: v for k, v in files_of(data[name]).items()
                                                      if not k.startswith("packs/")}
    assert packs_of(dst) == packs_of(data["mix"]) and validate(dst, deep=True).ok
    again = copy_dataset(data["mix"], tmp_path / "deep" / "mix2", outside_members="copy")  # members there: kept
    assert sorted(again.kept) == sorted(str(tmp_path / "deep" / n) for n in ("web", "code"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "web").mkdir()  # something else where a member would go: refused before any copy
    with pytest.raises(DatasetExistsError, match="already exists"):
        copy_dataset(data["mix"], tmp_path / "other" / "mix", outside_members="copy")
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["web"]


def test_an_occupied_destination_is_refused_unless_overwrite(data, tmp_path, capsys):
    dst = tmp_path / "d"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    assert main(["cp", str(data["store"]), str(dst)]) == 1
    assert "already exists (pass --overwrite to replace it)" in capsys.readouterr().err
    assert (dst / "notes.txt").read_text() == "mine"
    assert main(["cp", str(data["store"]), str(dst), "--overwrite"]) == 0
    assert files_of(dst) == files_of(data["store"])
    with pytest.raises(WriteError, match="overlap its source"):
        copy_dataset(data["store"], data["store"] / "inner")
    assert main(["cp", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 1
    assert "nothing: not a packfmt dataset (no manifest.json there)" in capsys.readouterr().err


def test_a_copy_stopped_midway_leaves_nothing_at_dst(data, tmp_path, monkeypatch):
    for name, stop in (("store", 3), ("mix", 2), ("layout", 5)):
        copied = stop_after(monkeypatch, stop)
        with pytest.raises(Stopped):
            copy_dataset(data[name], tmp_path / name, outside_members="copy")
        assert len(copied) == stop
        assert not (tmp_path / name).exists() and not any(p.name.startswith(f".{name}.") for p in tmp_path.iterdir())
        monkeypatch.undo()
    with pytest.raises(FormatError):
        packfmt.open(tmp_path / "store")


def test_a_damaged_or_changed_source_is_not_copied(data, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(data["store"], src)
    raw = bytearray((src / F.TOKENS).read_bytes())
    raw[5] ^= 0xFF
    (src / F.TOKENS).write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=r"tokens\.bin: checksum: expected"):
        copy_dataset(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
    root = tmp_path / "coll"
    shutil.copytree(data["mix"].parent / "mix", root / "mix")
    for name in ("web", "code"):
        shutil.copytree(data[name], root / name)
    manifest = json.loads((root / "code" / F.MANIFEST).read_text())
    manifest["producer"]["version"] = "edited"
    (root / "code" / F.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=r"members\[1\] \(code\): manifest: expected .* changed after"):
        copy_dataset(root / "mix", tmp_path / "mix", outside_members="copy")
    assert not (tmp_path / "mix").exists() and not (tmp_path / "web").exists()
