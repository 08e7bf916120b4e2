"""The reader checks what it indexes with (packfmt/checks.py): arbitrary index arrays give a
``FormatError`` at open or packs equal to a bounds-checked reference; the quick ``validate``
refuses what the reader refuses; an index replaced under an open reader cannot mix files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import format as F
from packfmt.errors import FormatError
from packfmt.packindex import build_pack_index
from packfmt.torch import PackedDataset
from packfmt.torch.testing import write_pack_index
from packfmt.validate import validate

sys.path.insert(0, str(Path(__file__).parent))
from corruption_reader import OutOfRange, reference  # noqa: E402

LENGTHS = [5, 1, 9, 3, 7]


def _store(root: Path) -> packfmt.Store:
    rng = np.random.default_rng(0)
    with packfmt.DatasetWriter(root, vocab_size=1000, loss_mask=True) as w:
        for n in LENGTHS:
            w.add_document(rng.integers(0, 1000, n), rng.integers(0, 2, n))
    return packfmt.open(root)


@pytest.fixture
def store(tmp_path):
    return _store(tmp_path / "ds")


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One store for every hypothesis example (each replaces its only pack index, "h")."""
    return _store(tmp_path_factory.mktemp("rc") / "ds")


# Values near every boundary the checks guard: document ids around [0, 5), offsets around the
# document lengths, and the extremes of int64.
edge = st.sampled_from([-(2**63), -(2**31), -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2**31, 2**62, 2**63 - 1])
small = st.integers(-2, 11)
value = st.one_of(small, small, edge)

# A segment inside its document (what a packer writes), or any three values.
good_segment = st.integers(0, len(LENGTHS) - 1).flatmap(lambda d: st.integers(0, LENGTHS[d] - 1).flatmap(
    lambda b: st.tuples(st.just(d), st.just(b), st.integers(b + 1, LENGTHS[d]))))
segment = st.one_of(good_segment, good_segment, st.tuples(value, value, value))


def _pack_offsets(n_segs: int):
    """Offsets from 0 to ``n_segs`` (cuts chosen at random), or any list of values."""
    cuts = st.sets(st.integers(1, max(n_segs - 1, 1)), max_size=n_segs).map(
        lambda c: [0] + sorted(x for x in c if x < n_segs) + ([n_segs] if n_segs else []))
    return st.one_of(cuts, cuts, st.lists(value, min_size=1, max_size=n_segs + 2))


index_arrays = st.integers(0, 6).flatmap(lambda n_segs: st.tuples(
    st.lists(segment, min_size=n_segs, max_size=n_segs),
    _pack_offsets(n_segs),
    st.sampled_from([1, 4, 9, 16, 2**31, 2**62]),                                # capacity
))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=index_arrays)
def test_any_index_arrays_are_refused_or_read_exactly(shared_store, arrays):
    store = shared_store
    segs, po, capacity = arrays
    segs = np.array(segs, dtype=np.int64).reshape(-1, 3)
    po = np.array(po, dtype=np.int64)
    try:
        index = write_pack_index(store, segs, po, capacity=capacity, name="h")
    except FormatError:
        assert not validate(store.path).ok  # the quick validate refuses what the reader refuses
        return
    assert validate(store.path).ok
    event("accepted")
    ds = PackedDataset(store, index)
    batch = ds.__getitems__(list(range(len(ds))))
    for p in range(len(ds)):
        try:
            want = reference(store, index, p)
        except OutOfRange as exc:
            pytest.fail(f"accepted an index whose pack {p} reads outside the dataset: {exc}")
        assert (ds[p]["input_ids"].tolist(), ds[p]["labels"].tolist()) == want
        assert (batch[p]["input_ids"].tolist(), batch[p]["labels"].tolist()) == want


def _edit_index_json(index_dir: Path, **changes) -> None:
    path = index_dir / F.PACK_INDEX_JSON
    doc = json.loads(path.read_text())
    for key, val in changes.items():
        doc[key] = val
    path.write_bytes(F.canonical_json(doc))


def test_capacity_beyond_int64_refused_by_reader_and_quick_validate(store):
    index = build_pack_index(store, capacity=16, name="big", overwrite=True)
    _edit_index_json(index.path, capacity=2**64 + 1)
    with pytest.raises(FormatError) as exc:
        store.pack_index("big")
    assert exc.value.field == "capacity" and "2^63 - 1" in str(exc.value)
    report = validate(store.path)
    assert any(p.field == "capacity" for p in report.errors), report.format()


def test_segment_outside_its_document_refused_at_open_naming_element(store):
    segs = np.array([[0, 0, 5], [2, 4, 12]], dtype=np.int64)  # document 2 has 9 tokens
    with pytest.raises(FormatError) as exc:
        write_pack_index(store, segs, np.array([0, 1, 2]), capacity=16, name="oob")
    err = exc.value
    assert err.file == "packs/oob/segments.bin" and err.field == "[1]"
    assert "length of document 2 (9)" in str(err) and "[4, 12)" in str(err)
    assert any(p.file == "packs/oob/segments.bin" for p in validate(store.path).errors)  # quick, not deep


def test_pack_over_capacity_refused_at_open(store):
    segs = np.array([[0, 0, 5], [2, 0, 9]], dtype=np.int64)
    with pytest.raises(FormatError, match=r"pack 0: expected <= capacity 8 tokens .* found 14 tokens"):
        write_pack_index(store, segs, np.array([0, 2]), capacity=8, name="over")


def test_materialized_run_lengths_checked_at_open(store):
    index = build_pack_index(store, capacity=16, name="mat", materialize=True, overwrite=True)
    pto = np.fromfile(index.path / F.PACK_TOKEN_OFFSETS, dtype=np.int64)
    assert pto.shape[0] >= 3
    pto[1] += 1  # pack 0's run one token longer than the pack, pack 1's one shorter: total unchanged
    pto.tofile(index.path / F.PACK_TOKEN_OFFSETS)
    doc = json.loads((index.path / F.PACK_INDEX_JSON).read_text())
    from packfmt._io import checksum_file

    doc["files"][F.PACK_TOKEN_OFFSETS]["checksum"] = checksum_file(index.path / F.PACK_TOKEN_OFFSETS)
    (index.path / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(doc))
    with pytest.raises(FormatError) as exc:
        PackedDataset(store, "mat")
    assert exc.value.file == "packs/mat/pack_token_offsets.bin" and "(V29" in str(exc.value)


def test_index_replaced_under_an_open_reader_keeps_its_own_files(store):
    first = build_pack_index(store, capacity=16, name="swap", overwrite=True)
    ds = PackedDataset(store, first)
    before = [ds[p]["input_ids"].tolist() for p in range(len(ds))]
    second = build_pack_index(store, capacity=9, name="swap", overwrite=True)  # other packs, same name
    assert second.num_packs != first.num_packs
    assert [ds[p]["input_ids"].tolist() for p in range(len(ds))] == before  # the arrays mapped at open


def test_pad_to_capacity_refuses_a_capacity_no_batch_can_hold(store):
    build_pack_index(store, capacity=16, name="huge", overwrite=True)
    _edit_index_json(store.path / F.PACKS_DIR / "huge", capacity=2**40)
    ds = PackedDataset(store, "huge")  # without padding the packs are read at their own length
    assert ds[0]["input_ids"].shape[0] <= 16
    with pytest.raises(FormatError, match=r"pad_to_capacity.*--capacity"):
        PackedDataset(store, "huge", pad_to_capacity=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=8), st.integers(0, 2**32), st.integers(1, 6))
def test_v27_by_member_bound_equals_v27_by_documents_as_long_as_their_member(documents, seed, per_pack):
    """``checks.segments`` with one bound per member (a streamed collection's open: ``doc_start``, each member's
    tokens) finds what the per-document form finds when every document is as long as its member, in runs of packs
    too: the same first bad segment and counts, the same pack lengths (members of no document included)."""
    from packfmt import checks

    rng = np.random.default_rng(seed)
    documents = np.array(documents, dtype=np.int64)
    tokens = rng.integers(1, 20, documents.shape[0]) * (documents > 0)
    doc_start = np.concatenate([[0], np.cumsum(documents)])
    n = int(doc_start[-1])
    per_doc = np.repeat(tokens, documents)
    offsets = np.concatenate([[0], np.cumsum(per_doc)])
    k = int(rng.integers(1, 30))
    doc = rng.integers(-1, n + 2, k)
    begin = rng.integers(-1, 10, k)
    end = begin + rng.integers(-1, 25, k)
    segs = np.stack([doc, begin, end], axis=1).astype(np.int64)
    po = np.unique(np.concatenate([[0, k], np.arange(0, k, per_pack)])).astype(np.int64)
    a, la = checks.segments(segs, tokens, po, file="s", doc_start=doc_start)
    b, lb = checks.segments(segs, offsets, po, file="s")
    assert [(f.rule, f.field) for f in a] == [(f.rule, f.field) for f in b]
    assert [f.found for f in a] == [f.found for f in b]
    assert (la is None) == (lb is None) and (la is None or la.tolist() == lb.tolist())


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 1), st.integers(0, 12), st.integers(0, 40), st.booleans(),
       st.sampled_from([np.int64, np.int32]))
def test_v27_scan_in_numpy_equals_the_kernel(seed, mode, n_docs, n_segs, wild_packs, dtype):
    """A small index is scanned in numpy (``checks._scan_small``: no numba imported by a small dataset's open); it
    finds what the kernel finds, on any input: bad ids and ranges, packs in a decreasing or overlapping order, a
    pack range outside the segments (refused before a row is read, by both)."""
    from packfmt import checks

    rng = np.random.default_rng(seed)
    doc_lengths = rng.integers(0, 9, n_docs)
    bounds = doc_lengths if mode == 1 else np.concatenate([[0], np.cumsum(doc_lengths)])
    segs = np.stack([rng.integers(-2, n_docs + 2, n_segs), rng.integers(-2, 9, n_segs),
                     rng.integers(-2, 12, n_segs)], axis=1).astype(dtype)
    packs = int(rng.integers(0, 8))
    if wild_packs:  # decreasing, overlapping, now and then past the end
        po = rng.integers(0, n_segs + 1 + int(rng.integers(0, 2)), packs + 1)
    else:
        po = np.sort(np.concatenate([[0, n_segs], rng.integers(0, n_segs + 1, packs)]))
    po = po.astype(np.int64)
    starts = np.zeros(1, dtype=np.int64)
    got_len, want_len = np.zeros(po.shape[0] - 1, np.int64), np.zeros(po.shape[0] - 1, np.int64)
    got = checks._scan_small(segs, bounds, po, got_len, mode, starts)
    want = checks._segment_kernel()(segs, bounds, po, want_len, mode, starts)
    assert tuple(int(x) for x in got) == tuple(int(x) for x in want)
    if want[0] >= -1:  # (a range outside the segments: the caller raises, whatever the lengths hold)
        assert got_len.tolist() == want_len.tolist()
