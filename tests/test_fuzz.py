"""Hostile bytes: whatever a dataset directory holds, the reader and validate raise packfmt errors only.

Starting from the golden dataset, hypothesis mutates one file (flips, truncates, overwrites
bytes, or replaces the manifest with arbitrary JSON-ish text); ``packfmt.open`` plus reading
every array must either succeed or raise ``PackfmtError`` (never IndexError, KeyError,
ValueError, RecursionError, ...), and ``validate(deep=True)`` must return a report, never raise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt.errors import PackfmtError
from packfmt.validate import validate

GOLDEN = Path(__file__).parent / "data" / "golden_v1_0"
FILES = sorted(str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*") if p.is_file())


def _touch_everything(path: Path) -> None:
    store = packfmt.open(path)
    np.asarray(store.tokens).sum()
    np.asarray(store.doc_lengths).sum()
    for i in range(store.num_documents):
        store.document(i)
    if store.loss_mask is not None:
        np.asarray(store.loss_mask).sum()
    if store.images is not None:
        for i in range(len(store.images)):
            store.images.decode(i)
    for name in store.pack_index_names():
        index = store.pack_index(name)
        for p in range(index.num_packs):
            index.pack_tokens(p)


@pytest.fixture
def copy_dir(tmp_path_factory):
    def make() -> Path:
        dst = tmp_path_factory.mktemp("fuzz") / "ds"
        shutil.copytree(GOLDEN, dst)
        return dst
    return make


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("overwrite"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FILES), mut=mutation)
def test_mutated_file_gives_packfmt_errors_only(copy_dir, name, mut):
    root = copy_dir()
    path = root / name
    data = bytearray(path.read_bytes())
    kind, pos, arg = mut
    if data:
        pos %= len(data)
    if kind == "flip" and data:
        data[pos] ^= arg
    elif kind == "truncate":
        data = data[:pos]
    elif kind == "overwrite":
        data[pos:pos + len(arg)] = arg
    path.write_bytes(bytes(data))
    try:
        _touch_everything(root)
    except PackfmtError:
        pass
    report = validate(root, deep=True)
    assert isinstance(report.ok, bool)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["format", "format_version", "vocab_size", "token_dtype", "tokenizer", "special_tokens",
                            "counts", "loss_mask", "checksum_algorithm", "files", "producer"]),
       value=json_values)
def test_manifest_field_replaced_by_any_json_gives_packfmt_errors_only(copy_dir, key, value):
    root = copy_dir()
    manifest = json.loads((root / "manifest.json").read_text())
    manifest[key] = value
    (root / "manifest.json").write_text(json.dumps(manifest))
    try:
        _touch_everything(root)
    except PackfmtError:
        pass
    assert isinstance(validate(root, deep=True).ok, bool)
