"""A collection that lists itself, or two that list each other (spec/COLLECTION.md C2: a member is a store):
validate, open, inspect and pack each say which member and that it is a cycle, in one line; nothing recurses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt.collection import write_collection
from packfmt.errors import FormatError
from packfmt.validate import validate

from limits import time_limit
from old_collections import without_lengths_record


def make_store(root: Path, lengths, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with packfmt.DatasetWriter(root, vocab_size=1000, tokenizer={"name": "tok", "hash": None}) as w:
        for n in lengths:
            w.add_document(rng.integers(0, 1000, n))
    return root


def add_member(coll: Path, name: str, path: str, like: int = 0) -> None:
    """Append a member entry (counts copied from member ``like``, so the manifest itself stays valid, C1; the
    collection made a 1.2 one first, without ``doc_lengths.bin``, whose size counts the documents)."""
    without_lengths_record(coll)
    manifest = json.loads((coll / F.MANIFEST).read_text())
    entry = {**manifest["members"][like], "name": name, "path": path}
    manifest["members"].append(entry)
    manifest["counts"]["members"] += 1
    for key in ("documents", "tokens", "images"):
        manifest["counts"][key] += entry[key]
    (coll / F.MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture
def stores(tmp_path) -> list[Path]:
    return [make_store(tmp_path / "web", [3, 9, 1], 0), make_store(tmp_path / "code", [7, 2], 1)]


def cycles(tmp_path: Path, stores: list[Path]) -> dict[str, tuple[Path, str, str]]:
    """case -> (collection, member label, what the message says of it)."""
    write_collection(tmp_path / "self", [("web", stores[0])])
    add_member(tmp_path / "self", "me", "../self")  # ".." back into its own directory
    write_collection(tmp_path / "dot", [("web", stores[0])])
    os.symlink(".", tmp_path / "dot" / "here")  # a symlink to "." (the path rule refuses "." itself)
    add_member(tmp_path / "dot", "here", "here")
    write_collection(tmp_path / "a", [("web", stores[0])])
    write_collection(tmp_path / "b", [("code", stores[1])])
    add_member(tmp_path / "a", "b", "../b")
    add_member(tmp_path / "b", "a", "../a")  # a lists b, b lists a
    return {"self": (tmp_path / "self", "members[1] (me)", "this collection itself: a cycle"),
            "symlink_dot": (tmp_path / "dot", "members[1] (here)", "this collection itself: a cycle"),
            "each_other": (tmp_path / "a", "members[1] (b)", "it lists this collection as a member: a cycle")}


@pytest.mark.parametrize("case", ["self", "symlink_dot", "each_other"])
def test_cycle_is_one_clear_error_everywhere(tmp_path, stores, case):
    coll, label, says = cycles(tmp_path, stores)[case]
    report = validate(coll)  # RecursionError before
    assert not report.ok and len(report.errors) == 1
    err = report.errors[0]
    assert err.field == label.split(" ")[0] + ".path" and label in err.message and says in err.message
    assert "not a store" in err.message and "C2" in err.message
    assert validate(coll, deep=True).errors[0].message == err.message
    opened = packfmt.open(coll)  # the manifest alone: opening is cheap and lazy
    assert opened.document(0).tolist() == packfmt.open(stores[0]).document(0).tolist()  # the store member reads
    with pytest.raises(FormatError) as info:
        opened.document(opened.num_documents - 1)  # in the member that is a collection
    assert label in str(info.value) and says in str(info.value)


def test_cli_validate_inspect_pack_exit_1_in_one_line(tmp_path, stores):
    coll, label, says = cycles(tmp_path, stores)["self"]
    root = str(Path(packfmt.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for args in (["validate", str(coll)], ["validate", str(coll), "--deep", "--json"], ["inspect", str(coll)],
                 ["pack", str(coll), "--capacity", "16"]):
        with time_limit(120, f"packfmt {args[0]} on a collection that lists itself"):
            proc = subprocess.run([sys.executable, "-m", "packfmt.cli", *args], capture_output=True, text=True,
                                  env=env, timeout=110)
        assert proc.returncode == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stdout + proc.stderr
        text = proc.stdout + proc.stderr
        lines = [x for x in text.splitlines() if label in x]
        assert len(lines) == 1 and says in lines[0], (args, text)
    assert not (coll / F.PACKS_DIR).exists()  # pack wrote nothing
