"""A name or checksum that is well formed but for a final newline is refused: Python's ``$`` also matches before a
trailing ``"\\n"``, so the patterns end in ``\\Z`` (a member name, a pack index name, a listed file's checksum, a
member's recorded checksum: FORMAT.md V8, COLLECTION.md C1)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt.collection import Collection
from packfmt.errors import FormatError
from packfmt.index_format import check_index_name
from packfmt.torch.testing import write_flat_dataset, write_random_collection


def _edit(path, change) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize("key", ["name", "manifest"])
def test_a_member_entry_with_a_final_newline_is_refused(tmp_path, key):
    root, _, _ = write_random_collection(tmp_path, [2, 3, 1])  # 3 members: the JSON array form

    def change(obj):
        obj["members"][1][key] += "\n"

    _edit(root / F.MANIFEST, change)
    with pytest.raises(FormatError) as exc:
        Collection(root)
    assert exc.value.field == f"members[1].{key}"


def test_a_listed_checksum_with_a_final_newline_is_refused(tmp_path):
    offsets = np.array([0, 3, 5], dtype=np.int64)
    store = write_flat_dataset(tmp_path / "s", np.arange(5, dtype=np.uint16), offsets, vocab_size=100).path

    def change(obj):
        obj["files"][F.TOKENS]["checksum"] += "\n"

    _edit(store / F.MANIFEST, change)
    with pytest.raises(FormatError, match="checksum"):
        packfmt.open(store)


def test_an_index_name_with_a_final_newline_is_refused():
    assert check_index_name("ffd-4096") == "ffd-4096"
    with pytest.raises(FormatError):
        check_index_name("ffd-4096\n")
